"""The client side of tests/mpi/test_serve_tp.sh: a fixed list of requests (completions and chat,
greedy and sampled with a seed, streamed and not, one with response_format), sent one at a time, printed as JSON lines, so
that two servers' answers can be compared; between them a client that goes away mid-stream (the
server cancels its request) and a burst of concurrent requests (all answered).
usage: serve_tp_client.py PORT MODEL_ID"""
import http.client, json, socket, sys, threading

port, model = int(sys.argv[1]), sys.argv[2]
J = {"Content-Type": "application/json"}


def post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers=J)
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        sys.exit(f"{path} {body}: HTTP {r.status}: {data[:300]!r}")
    return data


def text_of(path, body):
    data = post(path, body)
    chat = path.endswith("chat/completions")
    if not body.get("stream"):
        c = json.loads(data)["choices"][0]
        return (c["message"]["content"] if chat else c["text"]), c["finish_reason"]
    text, fin = "", None
    for line in data.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])["choices"][0]
        text += (c["delta"].get("content") or "") if chat else c["text"]
        fin = c.get("finish_reason") or fin
    return text, fin


def requests():
    prompts = ["the", "quick brown fox jumps over", "a lazy dog sleeps while the jolly wizards",
               "q", "seven hex"]
    for i, p in enumerate(prompts):
        yield "/v1/completions", {"model": model, "prompt": p, "max_tokens": 16, "temperature": 0}
        yield "/v1/completions", {"model": model, "prompt": p, "max_tokens": 16,
                                  "temperature": 1.0, "seed": 5 + i}
        yield "/v1/completions", {"model": model, "prompt": p, "max_tokens": 12,
                                  "temperature": 0.8, "top_p": 0.9, "seed": 11, "stream": True}
    yield "/v1/completions", {"model": model, "prompt": "the", "max_tokens": 20, "temperature": 0,
                              "stop": ["ie"], "frequency_penalty": 0}
    yield "/v1/chat/completions", {"model": model, "max_tokens": 10, "temperature": 0,
                                   "messages": [{"role": "user", "content": "the lazy"}]}
    # constrained decoding: the followers compile the grammar from the source the leader sends
    yield "/v1/completions", {"model": model, "prompt": "the", "max_tokens": 40, "temperature": 1.0,
                              "seed": 3, "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "r", "schema": {"type": "object", "properties": {
                                      "a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
                                      "required": ["a", "b"]}}}}


def go_away():
    """a streaming request whose client leaves after the first bytes: the server cancels it"""
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"model": model, "prompt": "the quick", "max_tokens": 40, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.recv(100)
    s.close()


def burst(n):
    """n concurrent requests (they share engine steps): every one answered"""
    got = []
    def one(i):
        t, f = text_of("/v1/completions", {"model": model, "prompt": "fox " * (1 + i % 5),
                                           "max_tokens": 8 + i, "temperature": 0.7, "seed": i})
        got.append(f)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    if len(got) != n or None in got:
        sys.exit(f"burst: {len(got)} of {n} answered: {got}")


for k, (path, body) in enumerate(requests()):
    if k == 4:
        go_away()
    if k == 9:
        burst(12)
    text, fin = text_of(path, body)
    if "response_format" in body:
        doc = json.loads(text)  # constrained: always a document of the schema
        if sorted(doc) != ["a", "b"] or fin != "stop":
            sys.exit(f"constrained output {text!r} ({fin})")
    print(json.dumps({"k": k, "text": text, "finish_reason": fin}), flush=True)
