#!/usr/bin/env bash
# loom generate --prompts: many prompts through the batched engine (ASan build), both flavors:
# one JSON line per prompt in input order; each equals that prompt generated alone (greedy);
# sampling reproducible by seed and independent of the batch size; stop strings cut the text;
# bad input (missing file, a bad JSONL line, out-of-range options) is an error naming it.
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"
make_dataset "$WORK"
python3 - > prompts.txt <<'PY'
import random
random.seed(5)
words = "the quick brown fox jumps over a lazy dog".split()
for i in range(12):
    print(" ".join(random.choice(words) for _ in range(1 + i % 6)))
PY
printf '{"prompt": "the lazy"}\n{"prompt": "fox \\u00e9"}\n' > prompts.jsonl
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/run_$flavor"
  expect_ok "train ($flavor)" "$LOOM_BIN" train "$WORK/$flavor.yaml" --set training.steps=10
  R=$WORK/run_$flavor
  expect_ok "generate --prompts ($flavor, batch 4)" "$L" generate "$R" --prompts prompts.txt \
    --tokens 12 --temperature 0 --batch 4 --stats
  cp "$WORK/out.txt" batched.jsonl
  grep -q "12 prompts" "$WORK/err.txt" || fail "no stats line: $(cat "$WORK/err.txt")"
  n=0
  while IFS= read -r p; do
    alone=$("$LOOM_BIN" generate "$R" --prompt "$p" --tokens 12 --temperature 0)
    python3 - batched.jsonl "$n" "$p" "$alone" <<'PY' || fail "$flavor prompt $n: batched differs from alone"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
i, p, alone = int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = rows[i]
assert len(rows) == 12 and r["index"] == i and r["prompt"] == p, r
assert r["tokens"] == min(12, 33 - len(p.encode())) and r["finish_reason"] == "length", r
assert p + r["text"] == alone, (p + r["text"], alone)
PY
    n=$((n + 1))
  done < prompts.txt
  pass "$flavor: 12 batched outputs equal their prompts generated alone"
  "$LOOM_BIN" generate "$R" --prompts prompts.txt --tokens 10 --temperature 0.9 --top-p 0.9 \
    --repetition-penalty 1.2 --seed 7 --batch 16 > s16.jsonl
  "$LOOM_BIN" generate "$R" --prompts prompts.txt --tokens 10 --temperature 0.9 --top-p 0.9 \
    --repetition-penalty 1.2 --seed 7 --batch 1 > s1.jsonl
  "$LOOM_BIN" generate "$R" --prompts prompts.txt --tokens 10 --temperature 0.9 --top-p 0.9 \
    --repetition-penalty 1.2 --seed 8 --batch 16 > s8.jsonl
  cmp -s s16.jsonl s1.jsonl || fail "$flavor: sampled output depends on the batch size"
  cmp -s s16.jsonl s8.jsonl && fail "$flavor: another seed gives the same samples"
  pass "$flavor: sampling reproducible by seed, independent of the batch size"
done
R=$WORK/run_gpt2
expect_ok "generate JSONL prompts" "$L" generate "$R" --prompts prompts.jsonl --tokens 4 --temperature 0
python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
assert [r['prompt'] for r in rows] == ['the lazy', 'fox \u00e9'], rows
" "$WORK/out.txt" || fail "JSONL prompts: $(cat "$WORK/out.txt")"
# a stop string: the text ends before its first occurrence in the unstopped output
"$LOOM_BIN" generate "$R" --prompts prompts.txt --tokens 30 --temperature 0 > nostop.jsonl
expect_ok "generate --stop" "$L" generate "$R" --prompts prompts.txt --tokens 30 --temperature 0 --stop " " --stop "zz"
python3 - nostop.jsonl "$WORK/out.txt" <<'PY' || fail "stop strings"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
cut = 0
for x, y in zip(a, b):
    t = x["text"]
    want = t[:t.index(" ")] if " " in t else t
    assert y["text"] == want, (x, y)
    assert y["finish_reason"] == ("stop" if " " in t else "length"), (x, y)
    cut += " " in t
assert cut > 0, "no output had the stop string"
print("stopped", cut, "of", len(a))
PY
pass "stop strings cut the text"
expect_fail "missing prompts file" "nope.txt" "$L" generate "$R" --prompts nope.txt
printf '{"prompt": "a"}\n{"prompt": 3}\n' > bad.jsonl
expect_fail "bad JSONL prompt" "bad.jsonl:2" "$L" generate "$R" --prompts bad.jsonl
expect_fail "bad --top-p" "top-p" "$L" generate "$R" --prompt x --top-p 2
expect_fail "bad --batch" "batch" "$L" generate "$R" --prompt x --batch 0
