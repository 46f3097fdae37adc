#!/usr/bin/env bash
# One chat template implementation (include/loom/chat.h) behind every chat prompt: loom serve's
# /v1/chat/completions renders messages with --template (chatml here, plain by default) and
# stops at the assistant's end of turn: a chat request equals a completion of the prompt
# rendered by hand with that stop string; a malformed conversation is a 400 naming the message;
# loom synth's chat form with the local engine (generator.chat_template) samples what the same
# pipeline through the server samples (one request at a time on both sides, so every forward
# has the same rows), and another template samples something else.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" m.yaml "$WORK/run"
expect_ok "train" "$LOOM_BIN" train m.yaml --set training.steps=10 --set eval.every=0 --set model.max_seq_len=256
start_server port serve.log "$LOOM_ASAN_BIN" serve "$WORK/run" --port 0 --port-file port --model-id t --template chatml
python3 - "$(cat port)" <<'PY' || fail "chat template"
import json, sys, urllib.request, urllib.error
base = f"http://127.0.0.1:{sys.argv[1]}/v1"
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the lazy"},
        {"role": "assistant", "content": "dog"}, {"role": "user", "content": "over"}]
st, chat = post("/chat/completions", {"messages": msgs, "max_tokens": 20, "temperature": 0})
assert st == 200, chat
rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + "<|im_start|>assistant\n"
st, comp = post("/completions", {"prompt": rendered, "max_tokens": 20, "temperature": 0, "stop": ["<|im_end|>"]})
assert st == 200, comp
a, b = chat["choices"][0]["message"]["content"], comp["choices"][0]["text"]
print(f"chat: {a!r} = completion of the chatml rendering: {b!r}")
counts = lambda u: (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])
assert a == b and counts(chat["usage"]) == counts(comp["usage"]), (chat, comp)
# the same prompt again: its full 16-token blocks (all but the last token) come from the
# prefix cache, and the answer is the same
n = comp["usage"]["prompt_tokens"]
assert comp["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16, comp["usage"]
st, bad = post("/chat/completions", {"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]})
assert st == 400 and "message 1" in bad["error"]["message"], (st, bad)
print("malformed:", bad["error"]["message"])
PY
pass "/v1/chat/completions renders with --template chatml (= the completion of the rendering)"
printf 'the quick\nover a\nlazy dog\nseven\n' > seeds.txt
pipeline() { # $1 name, $2 generator
  cat > $1.yaml <<YAML
name: chat
seeds:
  - path: $WORK/seeds.txt
templates:
  ask:
    chat: "continue: {seed}"
template: ask
generator:
$2
  max_tokens: 12
  temperature: 1
max_attempts: 1
output: $WORK/$1.jsonl
cache: false
YAML
}
pipeline http "  kind: http
  url: http://127.0.0.1:$(cat port)/v1
  model: t
  concurrency: 1"
pipeline local "  kind: local
  checkpoint: $WORK/run
  batch: 1
  chat_template: chatml"
expect_ok "synth chat form through loom serve" "$LOOM_BIN" synth http.yaml --quiet
expect_ok "synth chat form, local engine" "$LOOM_ASAN_BIN" synth local.yaml --quiet
sed -e 's/chat_template: chatml/chat_template: plain/' -e 's#local.jsonl#plain.jsonl#' local.yaml > plain.yaml
expect_ok "synth chat form, local engine, another template" "$LOOM_BIN" synth plain.yaml --quiet
python3 - <<'PY' || fail "synth chat: local differs from the server"
import json
h, l, p = ([(r["seed_index"], r["text"]) for r in map(json.loads, open(f))]
           for f in ("http.jsonl", "local.jsonl", "plain.jsonl"))
print("http:", h[:2], "local:", l[:2], "plain:", p[:2])
assert len(h) == 4 and h == l, "chatml locally != chatml through the server"
assert sum(a != b for a, b in zip(h, p)) >= 3, "the template made no difference: the check is blind"
PY
pass "synth's local chat form renders as the server does (4 of 4 identical; another template: different)"
sed 's/chat_template: chatml/chat_template: nope.json/' local.yaml > bad.yaml
expect_fail "a bad chat template" "generator.chat_template" "$LOOM_BIN" synth bad.yaml
