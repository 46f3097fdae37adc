"""The agent's side of tests/e2e/test_tooluse.sh: `loom serve` on the model fine-tuned on
calculator tool calls, through the real `openai` client's tool-calling API.

  tools_client.py PORT MODEL_ID HELDOUT.txt EXPECTED.jsonl N MIN_TOOL

For the first N held-out prompts: a tool-calling loop (send `tools`, receive
`message.tool_calls` with finish_reason "tool_calls", run the tool, send the assistant's calls
and the `tool` message back, get a final answer as text); the same request streamed, whose
`delta.tool_calls` join to the same calls; at least MIN_TOOL of the N replies must call the
right tool with integer arguments a and b. Then tool_choice "none" (text, no tool_calls), a
named function (a call of that function), "required", and malformed tool definitions and
tool_choice values answered with 400 naming the field. Exits non-zero on any failure.
"""
import json
import sys

import openai

port, model, heldout, expected = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
N, MIN_TOOL = int(sys.argv[5]), int(sys.argv[6])
FAIL = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAIL.append(what)
    return cond


def fn(name, doc):
    return {"type": "function", "function": {"name": name, "description": doc, "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


TOOLS = [fn("add", "a + b"), fn("sub", "a - b"), fn("mul", "a * b"), fn("div", "a / b")]
RUN = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
       "div": lambda a, b: a // b if b else 0}
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
prompts = [l.rstrip("\n") for l in open(heldout)][:N]
want = [json.loads(l) for l in open(expected)][:N]
# the template's turns end at a newline: the reply is its first line
ARGS = dict(model=model, temperature=0, max_tokens=60, stop=["\n"])


def streamed_calls(**kw):
    """(content, calls as [(name, arguments)], finish_reason) joined from a stream's deltas"""
    content, calls, finish = "", {}, None
    for ch in client.chat.completions.create(stream=True, **kw):
        c = ch.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.finish_reason or finish
    return content, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], finish


right = same_stream = called = answered = 0
for p, w in zip(prompts, want):
    msgs = [{"role": "user", "content": p}]
    r = client.chat.completions.create(messages=msgs, tools=TOOLS, **ARGS)
    m, fin = r.choices[0].message, r.choices[0].finish_reason
    calls = m.tool_calls or []
    ok = fin == "tool_calls" and len(calls) == 1 and m.content is None
    if ok:
        c = calls[0]
        args = json.loads(c.function.arguments)  # a JSON text, as OpenAI sends it
        ok = (c.type == "function" and c.id and c.function.name == w["name"] and set(args) == {"a", "b"}
              and all(type(v) is int for v in args.values()))
    right += ok
    if not ok:
        print(f"  {p!r}: finish {fin}, content {m.content!r}, calls {calls}")
    # the same request streamed: the deltas join to the same calls
    sc, scalls, sfin = streamed_calls(messages=msgs, tools=TOOLS, **ARGS)
    same_stream += (sfin == fin and scalls == [(c.function.name, c.function.arguments) for c in calls]
                    and sc == (m.content or ""))
    if not calls:
        continue
    called += 1
    # run the tool, send the call and its result back, get the final answer
    c = calls[0]
    args = json.loads(c.function.arguments)
    result = RUN.get(c.function.name, lambda a, b: None)(args.get("a", 0), args.get("b", 0))
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
                 {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}]},
             {"role": "tool", "tool_call_id": c.id, "content": str(result)}]
    # (one token of answer: the byte model's context is 96 tokens, and the conversation fills it)
    r2 = client.chat.completions.create(messages=msgs, tools=TOOLS, tool_choice="none", **dict(ARGS, max_tokens=1))
    answered += (r2.choices[0].finish_reason in ("stop", "length") and isinstance(r2.choices[0].message.content, str)
                 and not r2.choices[0].message.tool_calls)
check(right >= MIN_TOOL, f"tool calls: {right} of {N} replies are one call of the right tool with integer a and b "
                         f"(>= {MIN_TOOL}), finish_reason tool_calls, content null")
check(same_stream == N, f"streamed: {same_stream} of {N} streams join to the same content, calls and finish reason")
check(called >= right and answered == called,
      f"the loop: {answered} final answers as text after the {called} replies with a call ran their tool")

# tool_choice "none": the call comes back as text
r = client.chat.completions.create(messages=[{"role": "user", "content": prompts[0]}], tools=TOOLS,
                                   tool_choice="none", **ARGS)
m = r.choices[0].message
check(not m.tool_calls and r.choices[0].finish_reason != "tool_calls" and m.content,
      f"tool_choice none: text, no tool_calls ({m.content!r})")
# without tools the same reply is plain text too
r = client.chat.completions.create(messages=[{"role": "user", "content": prompts[0]}], **ARGS)
check(not r.choices[0].message.tool_calls, "no tools: no tool_calls")
# a named function and "required": a call of it, whatever the prompt says
for choice, name in ([{"type": "function", "function": {"name": "div"}}, "div"], ["required", None]):
    r = client.chat.completions.create(messages=[{"role": "user", "content": prompts[0]}], tools=TOOLS,
                                       tool_choice=choice, **ARGS)
    calls = r.choices[0].message.tool_calls or []
    ok = r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1 and (name is None or calls[0].function.name == name)
    if ok:
        json.loads(calls[0].function.arguments)
    check(ok, f"tool_choice {choice}: a call{' of ' + name if name else ''} ({r.choices[0].message})")

# malformed definitions: 400 naming the field
bad = [
    ([{"type": "function", "function": {"name": "bad name!"}}], None, "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], None, "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None,
     "tools[0].function.parameters.type"),
    ([TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {},
                                                                              "required": ["zz"]}}}], None,
     "tools[1].function.parameters.required"),
    ([TOOLS[0], TOOLS[0]], None, "tools[1].function.name"),
    ([{"type": "retrieval"}], None, "tools[0].type"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    (TOOLS, "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
]
for tools, choice, param in bad:
    kw = {}
    if tools is not None:
        kw["tools"] = tools
    if choice is not None:
        kw["tool_choice"] = choice
    try:
        client.chat.completions.create(messages=[{"role": "user", "content": "x"}], **kw, **ARGS)
        check(False, f"{param}: accepted")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        got = body.get("param") if "param" in body else (body.get("error") or {}).get("param")
        check(e.status_code == 400 and got == param, f"{param}: 400 naming it ({got!r}: {e.message[:120]})")
if FAIL:
    print(f"tools_client: {len(FAIL)} failures")
    sys.exit(1)
print("tools_client: all checks passed")
