"""The client side of tests/e2e/test_serve.sh: `loom serve` through the `openai` package
(streaming and not, completions and chat) and hostile requests over raw HTTP.
usage: serve_client.py PORT MODEL_ID PROMPT EXPECTED_GREEDY_TEXT"""
import http.client, json, socket, sys, threading, time

import openai

port, model, prompt, expected = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
FAIL = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAIL.append(what)


def raw(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)

# ---- the real client -------------------------------------------------------------------------
models = client.models.list()
check([m.id for m in models.data] == [model], f"/v1/models lists {model}")
r = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
check(r.choices[0].text == expected, f"completion = loom generate: {r.choices[0].text!r} vs {expected!r}")
check(r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length", f"usage {r.usage}")
chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True))
text = "".join(c.choices[0].text for c in chunks)
check(text == expected, f"streamed completion ({len(chunks)} chunks) = the same text")
check(chunks[-1].choices[0].finish_reason == "length", "the last chunk has the finish reason")
msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the lazy"}]
rc = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0)
ctext = rc.choices[0].message.content
check(rc.choices[0].message.role == "assistant" and rc.usage.completion_tokens == 10, "chat completion")
sc = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0, stream=True))
check("".join(c.choices[0].delta.content or "" for c in sc) == ctext, "streamed chat = the same text")
check(sc[0].choices[0].delta.role == "assistant", "the first chat chunk has the role")
rd = client.chat.completions.create(model=model, messages=msgs, temperature=0)
check(rd.choices[0].finish_reason == "length" and rd.usage.prompt_tokens + rd.usage.completion_tokens == 129,
      f"chat without max_tokens runs to the context: {rd.usage}")
# the default chat template (plain) is documented: "role: content\n" ... "assistant: "
r2 = client.completions.create(model=model, prompt="system: be brief\nuser: the lazy\nassistant: ",
                               max_tokens=10, temperature=0)
check(r2.choices[0].text == ctext, "chat = completion of the documented template")
# sampling: seeded requests repeat, stop strings cut
a = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0.9, seed=5)
b = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0.9, seed=5)
check(a.choices[0].text == b.choices[0].text, "same seed, same sample")
if " " in expected:
    s = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stop=[" "])
    check(s.choices[0].text == expected[:expected.index(" ")] and s.choices[0].finish_reason == "stop",
          f"stop string: {s.choices[0].text!r}")
try:
    client.completions.create(model="other", prompt="x", max_tokens=2)
    check(False, "unknown model refused")
except openai.NotFoundError:
    check(True, "unknown model: 404")

# ---- hostile requests ------------------------------------------------------------------------
P = "/v1/completions"
J = {"Content-Type": "application/json"}
for body, what in [(b'{"model": "' + model.encode() + b'", "prompt": "the', "truncated JSON"),
                   (b"", "empty body"), (b"[1, 2]", "not an object"),
                   (b'{"prompt": "a", "prompt": "b"}', "duplicate key"),
                   (b'{"prompt": "\xff\xfe"}', "invalid UTF-8"),
                   (b'{"prompt": 3}', "prompt of the wrong type"),
                   (b'{"prompt": "a", "max_tokens": "x"}', "max_tokens a string"),
                   (b'{"prompt": "a", "max_tokens": -1}', "max_tokens negative"),
                   (b'{"prompt": "a", "max_tokens": 1e9}', "max_tokens a float"),
                   (b'{"prompt": "a", "max_tokens": 101}', "max_tokens over the limit"),
                   (b'{"prompt": "a", "temperature": "hot"}', "temperature a string"),
                   (b'{"prompt": "a", "top_p": 7}', "top_p out of range"),
                   (b'{"prompt": "a", "stream": "yes"}', "stream a string"),
                   (b'{"prompt": "a", "stop": [1]}', "stop of the wrong type"),
                   (b'{"prompt": "a", "n": 2}', "n = 2"),
                   (b'{"prompt": ""}', "empty prompt"),
                   (b'{"prompt": "' + b"x" * 3000 + b'"}', "prompt over the context")]:
    st, data = raw("POST", P, body, J)
    try:
        msg = json.loads(data)["error"]["message"]
    except Exception:
        msg = None
    check(st == 400 and msg, f"{what}: {st} {msg!r}")
st, data = raw("POST", "/v1/chat/completions", b'{"messages": "hi"}', J)
check(st == 400, f"chat with messages a string: {st}")
st, data = raw("POST", "/v1/chat/completions", b'{"messages": [{"role": 1}]}', J)
check(st == 400, f"chat with a bad message: {st}")
# a 10 MB body: refused on its Content-Length, before the body is read
s = socket.create_connection(("127.0.0.1", port), timeout=60)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 10485760\r\n\r\n" + b"x" * 65536)
head = s.recv(4096)
s.close()
check(head.startswith(b"HTTP/1.1 413"), f"10 MB body: {head[:40]!r}")
# a body over the limit without a Content-Length (chunked)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.putrequest("POST", P)
c.putheader("Transfer-Encoding", "chunked")
c.endheaders()
for _ in range(20):
    c.send(b"1000\r\n" + b"y" * 4096 + b"\r\n")
c.send(b"0\r\n\r\n")
st = c.getresponse().status
c.close()
check(st == 413, f"chunked body over the limit: {st}")
check(raw("GET", "/nope")[0] == 404, "unknown path: 404")
check(raw("GET", P)[0] == 405, "GET on /v1/completions: 405")
check(raw("POST", "/health", b"{}")[0] == 405, "POST on /health: 405")

# ---- a client that goes away mid-stream ------------------------------------------------------
s = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"prompt": prompt, "max_tokens": 60, "stream": True}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
s.recv(100)
s.close()

# ---- the concurrency limit: 429 past it, never a crash ---------------------------------------
statuses = []
def one():
    st, _ = raw("POST", P, json.dumps({"prompt": prompt, "max_tokens": 40}).encode(), J)
    statuses.append(st)
ts = [threading.Thread(target=one) for _ in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
check(set(statuses) <= {200, 429} and statuses.count(429) >= 1 and statuses.count(200) >= 1,
      f"16 concurrent requests over a limit of 2: {sorted(statuses)}")

# ---- 1,000 concurrent connections ------------------------------------------------------------
socks = []
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    socks.append(s)
for s in socks:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
ok = 0
for s in socks:
    data = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        data += d
    ok += data.startswith(b"HTTP/1.1 200")
    s.close()
check(ok == 1000, f"1000 concurrent connections: {ok} answered 200")
r = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
check(r.choices[0].text == expected, "still serving the same text after all that")
print(f"{len(FAIL)} failed")
sys.exit(1 if FAIL else 0)
