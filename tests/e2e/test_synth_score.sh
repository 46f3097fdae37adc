#!/usr/bin/env bash
# loom synth's score validator: the mean log-likelihood of each output under a loom checkpoint
# (a tiny byte model trained here), with a threshold. The scores equal an independent
# computation by transformers on the same weights (loom export --hf); with `min` between
# them, exactly the outputs scoring at least `min` are accepted; changing the threshold reuses
# the cached scores (no forward); a prefix conditions the score; bad settings are errors.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" m.yaml "$WORK/run"
expect_ok "train" "$LOOM_BIN" train m.yaml --set training.steps=60 --set eval.every=0 --set model.max_seq_len=64
expect_ok "export" "$LOOM_BIN" export --hf "$WORK/run" "$WORK/hf"
start_server port fake.log python3 "$LOOM_SRC/tests/e2e/fake_openai.py" port requests.log
python3 - <<'PY'
import random
r = random.Random(4)
w = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split()
seeds = []
for i in range(12):
    if i % 2:
        seeds.append("COPY " + " ".join(r.choice(w) for _ in range(8)))   # like the training text
    else:
        seeds.append("COPY " + " ".join("".join(r.choice("QXZ#%&@") for _ in range(4)) for _ in range(8)))
open("seeds.txt", "w").write("\n".join(seeds) + "\n")
PY
pipeline() { # $1: min, $2: prefix
  cat > p.yaml <<YAML
name: score
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}"
template: t
generator:
  kind: http
  url: http://127.0.0.1:$(cat port)/v1
validators:
  - kind: score
    name: ll
    checkpoint: $WORK/run
    min: $1
    prefix: "$2"
max_attempts: 1
output: $WORK/out.jsonl
rejected: $WORK/rej.jsonl
summary: $WORK/summary.json
YAML
}
pipeline -1000 ""
expect_ok "synth with a score validator (accepting all)" "$LOOM_ASAN_BIN" synth p.yaml --quiet
cp out.jsonl plain.jsonl
pipeline -1000 "the "
expect_ok "synth with a prefix" "$LOOM_BIN" synth p.yaml --quiet
cp out.jsonl prefixed.jsonl
python3 - "$WORK" > threshold.txt <<'PY2' || fail "scores"
import json, sys, torch, transformers
w = sys.argv[1]
m = transformers.AutoModelForCausalLM.from_pretrained(f"{w}/hf").eval().double()
def mean_ll(prefix, text):  # the byte tokenizer: ids = bytes
    ids = torch.tensor([list(prefix.encode()) + list(text.encode())])
    with torch.no_grad():
        lp = torch.log_softmax(m(ids).logits[0], -1)
    first = max(len(prefix.encode()), 1)
    n = ids.shape[1]
    return sum(lp[i - 1, ids[0, i]].item() for i in range(first, n)) / (n - first)
got = {}
for prefix, f in (("", "plain.jsonl"), ("the ", "prefixed.jsonl")):
    recs = [json.loads(l) for l in open(f"{w}/{f}")]
    assert len(recs) == 12, f
    worst = max(abs(r["validators"][0]["score"] - mean_ll(prefix, r["text"])) for r in recs)
    print(f"{f}: max |loom - transformers| over 12 scores = {worst:.2e}", file=sys.stderr)
    assert worst < 2e-3, worst
    got[f] = {r["seed_index"]: r["validators"][0]["score"] for r in recs}
assert got["plain.jsonl"] != got["prefixed.jsonl"], "the prefix changed nothing"
s = sorted(got["plain.jsonl"].values())
print(f"scores: {[round(x, 3) for x in s]}", file=sys.stderr)
print((s[5] + s[6]) / 2)
PY2
cat "$WORK/err.txt" >/dev/null
thr=$(cat threshold.txt)
pass "scores = transformers on the exported weights; threshold between them: $thr"
pipeline "$thr" ""
expect_ok "synth with min between the scores" "$LOOM_BIN" synth p.yaml --quiet
python3 - "$WORK" "$thr" <<'PY2' || fail "threshold"
import json, sys
w, thr = sys.argv[1], float(sys.argv[2])
plain = {r["seed_index"]: r["validators"][0]["score"] for r in map(json.loads, open(f"{w}/plain.jsonl"))}
acc = {r["seed_index"] for r in map(json.loads, open(f"{w}/out.jsonl"))}
rej = [json.loads(l) for l in open(f"{w}/rej.jsonl")]
assert acc == {i for i, x in plain.items() if x >= thr}, (acc, plain)
assert len(acc) == 6 and len(rej) == 6
assert all("mean log-likelihood" in r["rejected_by"] for r in rej), rej[0]
c = json.load(open(f"{w}/summary.json"))["cache"]
assert c["validations_run"] == 0 and c["validation_hits"] == 12, c
print("accepted", sorted(acc), "rejected", sorted(r["seed_index"] for r in rej))
PY2
pass "the outputs scoring >= min are accepted; a new threshold reuses the cached scores"
sed '/min: /d' p.yaml > bad.yaml
expect_fail "score without min" "validators\[0\]\.min" "$LOOM_BIN" synth bad.yaml
sed "s#checkpoint: $WORK/run#checkpoint: $WORK/nope#" p.yaml > bad.yaml
expect_fail "score with a missing checkpoint" "score validator 'll'.*nope" "$LOOM_BIN" synth bad.yaml
