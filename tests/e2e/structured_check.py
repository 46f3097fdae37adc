"""Checks for tests/e2e/test_structured.sh (constrained decoding).

  structured_check.py lines SCHEMA FILE N        loom generate --prompts JSONL output: N lines,
                                                 each text parses and validates (SCHEMA "object":
                                                 any JSON object)
  structured_check.py serve PORT SCHEMA          loom serve: sampled chat and completion requests
                                                 with response_format parse and validate;
                                                 bad formats are 400s naming the problem
"""
import json, sys, urllib.error, urllib.request

import jsonschema


def check_doc(text, schema, what):
    try:
        doc = json.loads(text)
    except ValueError as e:
        sys.exit(f"FAIL: {what}: the output does not parse ({e}): {text!r}")
    if schema == "object":
        if not isinstance(doc, dict):
            sys.exit(f"FAIL: {what}: not a JSON object: {text!r}")
    else:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            sys.exit(f"FAIL: {what}: invalid against the schema ({e.message}): {text!r}")
    return doc


def load_schema(arg):
    return "object" if arg == "object" else json.load(open(arg))


def lines(schema_arg, path, n):
    schema = load_schema(schema_arg)
    rows = [json.loads(l) for l in open(path)]
    if len(rows) != int(n):
        sys.exit(f"FAIL: {len(rows)} lines, expected {n}")
    for r in rows:
        check_doc(r["text"], schema, f"prompt {r['index']} ({r['finish_reason']}, {r['tokens']} tokens)")
    print(f"ok: {len(rows)} sampled generations parse and validate ({schema_arg})")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serve(port, schema_arg):
    schema = load_schema(schema_arg)
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": True}}
    for seed in range(10):
        code, body = post(port, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": f"a record please ({seed})"}],
            "max_tokens": 90, "temperature": 1, "seed": seed, "response_format": fmt})
        if code != 200:
            sys.exit(f"FAIL: chat seed {seed}: {code} {body}")
        r = json.loads(body)
        check_doc(r["choices"][0]["message"]["content"], schema, f"chat seed {seed}")
    for seed in range(5):
        code, body = post(port, "/v1/completions", {
            "prompt": "x", "max_tokens": 60, "temperature": 1, "seed": 100 + seed,
            "response_format": {"type": "json_object"}})
        if code != 200:
            sys.exit(f"FAIL: completion seed {seed}: {code} {body}")
        check_doc(json.loads(body)["choices"][0]["text"], "object", f"json_object seed {seed}")
    # streamed: the chunks add up to a valid document
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps({
        "messages": [{"role": "user", "content": "stream"}], "max_tokens": 90, "seed": 7,
        "stream": True, "response_format": fmt}).encode(), headers={"Content-Type": "application/json"})
    text, fin = "", None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                text += ch["delta"].get("content", "")
                fin = ch["finish_reason"] or fin
    check_doc(text, schema, "streamed chat")
    if fin != "stop":
        sys.exit(f"FAIL: streamed: finish_reason {fin}")
    print("ok: sampled chat (json_schema), completion (json_object) and streamed outputs parse and validate")
    bad = [({"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": []}}}, "'enum' must be a non-empty"),
           ({"type": "json_schema", "json_schema": {"name": "e", "schema": {"type": "object", "properties": {"a": {}},
             "required": ["b"]}}}, "'required' names 'b'"),
           ({"type": "json_schema", "json_schema": {"name": "e", "schema": {"type": "string", "pattern": "^a"}}}, "'pattern'"),
           ({"type": "json_schema", "json_schema": {"name": "e"}}, "json_schema.schema"),
           ({"type": "yaml"}, "unknown type 'yaml'"),
           ("json", "must be an object with a 'type'")]
    for rf, want in bad:
        code, body = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 20, "response_format": rf})
        err = json.loads(body).get("error", {})
        if code != 400 or want not in err.get("message", "") or err.get("param") != "response_format":
            sys.exit(f"FAIL: response_format {rf}: {code} {body} (wanted a 400 naming {want!r})")
    code, body = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 3, "response_format": fmt})
    if code != 400 or "too small" not in body:
        sys.exit(f"FAIL: max_tokens below the shortest document: {code} {body}")
    code, body = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0,
                                                 "response_format": {"type": "text"}})
    if code != 200 or json.loads(body)["usage"]["completion_tokens"] != 4:
        sys.exit(f"FAIL: response_format text: {code} {body}")
    print("ok: unsatisfiable, unsupported and malformed response formats are 400s naming the problem")


if __name__ == "__main__":
    {"lines": lines, "serve": serve}[sys.argv[1]](*sys.argv[2:])
