#!/usr/bin/env bash
# What an agent's requests need from `loom serve` (docs/inference.md, "Prefix caching" and "Tool
# calling"), on an untrained model (one training step: random output), byte tokenizer:
#  - prefix caching: ten requests sharing a 1,000-token prefix answer the same text with the
#    cache as without it (a second server, --prefix-cache off); usage counts the cached
#    positions (the prefix's 62 full blocks); the time to first token of a request whose prefix
#    is cached is under half of one computed whole (medians of 9);
#  - tool_choice required: every reply, sampled, streamed or not, is a call of one of the tools
#    whose arguments validate against its parameters' schema (jsonschema); the streamed deltas
#    join to the non-streamed calls (same seed).
source "$(dirname "$0")/lib.sh"
python3 -c "import openai, jsonschema" 2>/dev/null || fail "openai / jsonschema missing (scripts/setup.sh --test installs them)"
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" "$WORK/m.yaml" "$WORK/run"
expect_ok "an untrained model" "$LOOM_BIN" train "$WORK/m.yaml" --set training.steps=1 --set checkpoint.every=1 \
  --set eval.every=0 --set model.max_seq_len=1152 --set model.d_model=192 --set model.n_layer=4
start_server "$WORK/port_on" "$WORK/on.log" "$LOOM_BIN" serve "$WORK/run" --template chatml --port 0 \
  --port-file "$WORK/port_on" --model-id m
on_pid=$SERVER_PID
"$LOOM_BIN" serve "$WORK/run" --template chatml --port 0 --port-file "$WORK/port_off" --model-id m \
  --prefix-cache off 2>"$WORK/off.log" &
off_pid=$!
trap 'kill $on_pid $off_pid 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do [ -s "$WORK/port_off" ] && break; sleep 0.1; done
[ -s "$WORK/port_off" ] || { cat "$WORK/off.log"; fail "the second server did not start"; }
python3 - "$(cat "$WORK/port_on")" "$(cat "$WORK/port_off")" <<'PY' || { cat "$WORK/on.log" >&2; fail "client checks"; }
import json, random, statistics, sys, time
import jsonschema, openai

on, off = (openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="x", max_retries=0, timeout=120)
           for p in sys.argv[1:3])
FAIL = []
def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAIL.append(what)

rnd = random.Random(3)
prefix = "".join(rnd.choice("abcdefghij klmnop") for _ in range(1000))  # 1,000 byte tokens
questions = [f"{chr(65 + i)}: question {i}?" for i in range(10)]

def ttft(client, prompt):
    """(seconds to the first text chunk, the whole text) of a streamed greedy completion"""
    t0, first, text = time.perf_counter(), None, ""
    for ch in client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0, stream=True):
        if ch.choices and ch.choices[0].text:
            first = first or time.perf_counter() - t0
            text += ch.choices[0].text
    return first, text

ttft(on, prefix + "warm up")  # fills the cache with the prefix's blocks
cold, warm, same = [], [], 0
for q in questions[:9]:
    t_off, a = ttft(off, prefix + q)
    t_on, b = ttft(on, prefix + q)
    cold.append(t_off)
    warm.append(t_on)
    same += a == b
check(same == 9, f"{same} of 9 streamed answers equal with and without the prefix cache")
r = on.completions.create(model="m", prompt=prefix + questions[9], max_tokens=8, temperature=0)
r_off = off.completions.create(model="m", prompt=prefix + questions[9], max_tokens=8, temperature=0)
cached = r.usage.prompt_tokens_details.cached_tokens
check(r.choices[0].text == r_off.choices[0].text, "the non-streamed answer is the same too")
check(cached == 992 and r_off.usage.prompt_tokens_details.cached_tokens == 0,
      f"cached_tokens {cached} (the prefix's 62 full blocks of 16) with the cache, 0 without")
mc, mw = statistics.median(cold), statistics.median(warm)
check(mw < 0.5 * mc, f"time to first token: {mw * 1e3:.1f} ms with the prefix cached, {mc * 1e3:.1f} ms without "
                     f"(medians of 9; under half expected)")

# tool_choice required from a random model: always a valid call
tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
             "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "find", "parameters": {"type": "object", "properties": {
             "q": {"type": "string", "maxLength": 8}, "k": {"enum": ["x", "y"]}}, "required": ["q"]}}}]
schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
msgs = [{"role": "user", "content": "call something"}]
valid = joined = 0
for seed in range(6):
    kw = dict(model="m", messages=msgs, tools=tools, tool_choice="required", temperature=1, seed=seed,
              max_tokens=120, parallel_tool_calls=False)
    r = on.chat.completions.create(**kw)
    calls = r.choices[0].message.tool_calls or []
    ok = r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    for c in calls:
        try:
            jsonschema.validate(json.loads(c.function.arguments), schema[c.function.name])
        except Exception as e:
            ok = False
            print(f"  seed {seed}: {c.function.name} {c.function.arguments!r}: {e}")
    valid += ok
    got = {}
    for ch in on.chat.completions.create(stream=True, **kw):
        for tc in ch.choices[0].delta.tool_calls or []:
            g = got.setdefault(tc.index, ["", ""])
            g[0] += tc.function.name or ""
            g[1] += tc.function.arguments or ""
    joined += [tuple(v) for _, v in sorted(got.items())] == [(c.function.name, c.function.arguments) for c in calls]
check(valid == 6, f"tool_choice required: {valid} of 6 sampled replies are one valid call")
check(joined == 6, f"streamed: {joined} of 6 join to the same call")
sys.exit(1 if FAIL else 0)
PY
kill -TERM $on_pid $off_pid
wait $on_pid || fail "the server did not exit 0"
pass "loom serve for agents: prefix caching and required tool calls"
