#!/usr/bin/env bash
# loom synth: the content-hash cache and MinHash near-duplicates, against a stand-in endpoint
# whose answers are known (tests/e2e/fake_openai.py: COPY seeds come back as near copies of
# themselves, pairs of TWIN seeds as near copies of each other, the rest as distinct texts).
# Cache: a rerun of the unchanged pipeline sends no request and runs no command, and writes
# the same output; changing the command validator re-runs that validator only (no request).
# MinHash: the near copies are removed and the distinct texts kept; the similarity each
# rejection reports is within 0.15 of the exact Jaccard similarity of the shingle sets, which
# separate the two (the MinHash definition is data/'s: tests/unit/test_recipe.c checks that
# synth and loom data build decide alike).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
start_server port fake.log python3 "$LOOM_SRC/tests/e2e/fake_openai.py" port requests.log
python3 - <<'PY'
import random
r = random.Random(3)
W = "amber basil cedar dune ember fjord grove heath iris jade kelp loch moss nook opal".split()
seeds = []
for i in range(24):
    if i % 4 == 1:
        seeds.append("COPY " + " ".join(r.choice(W) for _ in range(30)))
    elif i % 8 == 2:
        seeds.append(f"TWIN {i // 8} first")
    elif i % 8 == 6:
        seeds.append(f"TWIN {i // 8} second")
    else:
        seeds.append(f"NEW {i} " + r.choice(W))
open("seeds.txt", "w").write("\n".join(seeds) + "\n")
PY
pipeline() { # $1: the command validator's tag
  cat > p.yaml <<YAML
name: cache
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}"
template: t
generator:
  kind: http
  url: http://127.0.0.1:$(cat port)/v1
  model: fake
  temperature: 0.7
  concurrency: 4
validators:
  - kind: command
    name: counted
    command: [sh, -c, "cat > /dev/null; echo $1 >> $WORK/commands.log"]
  - kind: near_duplicate
    shingle: 5
    permutations: 128
    bands: 16
    threshold: 0.8
max_attempts: 1
output: $WORK/out.jsonl
rejected: $WORK/rej.jsonl
summary: $WORK/summary.json
YAML
}
count() { [ -f "$1" ] && grep -c . "$1" || echo 0; }
pipeline v1
expect_ok "synth" "$LOOM_BIN" synth p.yaml --quiet
[ "$(count requests.log)" = 24 ] && [ "$(count commands.log)" = 24 ] || fail "first run: $(count requests.log) requests, $(count commands.log) commands"
[ -s out.jsonl.cache/generations.jsonl ] || fail "no cache next to the output"
cp out.jsonl first.jsonl
cp rej.jsonl first.rej.jsonl
expect_ok "synth again (unchanged)" "$LOOM_ASAN_BIN" synth p.yaml --quiet
[ "$(count requests.log)" = 24 ] && [ "$(count commands.log)" = 24 ] || fail "the rerun did work: $(count requests.log) requests, $(count commands.log) commands"
cmp -s out.jsonl first.jsonl && cmp -s rej.jsonl first.rej.jsonl || fail "the rerun wrote another output"
python3 -c "
import json; c = json.load(open('summary.json'))['cache']
assert c['generation_hits'] == 24 and c['generations_run'] == 0 and c['validation_hits'] == 24 and c['validations_run'] == 0, c
" || fail "summary: $(cat summary.json)"
pass "an unchanged rerun sends no request, runs no command, writes the same output"
pipeline v2
expect_ok "synth with a changed validator" "$LOOM_BIN" synth p.yaml --quiet
[ "$(count requests.log)" = 24 ] && [ "$(count commands.log)" = 48 ] || fail "after changing the validator: $(count requests.log) requests, $(count commands.log) commands"
cmp -s out.jsonl first.jsonl || fail "the output changed"
pass "a changed validator re-runs validation only (24 commands, no request)"
expect_ok "synth --no-cache" "$LOOM_BIN" synth p.yaml --quiet --no-cache
[ "$(count requests.log)" = 48 ] && [ "$(count commands.log)" = 72 ] || fail "--no-cache: $(count requests.log) requests, $(count commands.log) commands"
pass "--no-cache generates again"
# a torn last line in the cache (an interrupted append) is skipped, and appends go on after it
printf '{"k": "ab' >> out.jsonl.cache/validations.jsonl
pipeline v3
expect_ok "synth with a torn cache line" "$LOOM_BIN" synth p.yaml --quiet
grep -q "torn or malformed cache lines skipped" err.txt || fail "no warning about the torn line"
[ "$(count requests.log)" = 48 ] && [ "$(count commands.log)" = 96 ] || fail "torn cache: $(count requests.log) requests, $(count commands.log) commands"
expect_ok "synth again after the torn line" "$LOOM_BIN" synth p.yaml --quiet
[ "$(count commands.log)" = 96 ] || fail "the verdicts appended after a torn line were lost: $(count commands.log) commands"
cmp -s out.jsonl first.jsonl || fail "the output changed"
pass "a torn cache line is skipped; what follows it is kept"
python3 - "$WORK" <<'PY' || fail "near duplicates"
# synth's MinHash is data/'s (the same decisions as loom data build's dedup_near, checked in
# tests/unit/test_recipe.c); here: its decisions and estimates against the exact Jaccard
# similarity of the shingle sets (5 characters; the texts are ASCII)
import json, sys
w = sys.argv[1]
K = 5
def shingles(t):
    b = t.encode()
    return {b} if len(b) < K else {b[i:i + K] for i in range(len(b) - K + 1)}
def jac(a, b):
    a, b = shingles(a), shingles(b)
    return len(a & b) / len(a | b)
seeds = open(f"{w}/seeds.txt").read().split("\n")[:-1]
acc = {r["seed_index"]: r for r in map(json.loads, open(f"{w}/out.jsonl"))}
rej = {r["seed_index"]: r for r in map(json.loads, open(f"{w}/rej.jsonl"))}
assert len(acc) + len(rej) == len(seeds)
pool = {f"seed {i}": t for i, t in enumerate(seeds)}
removed = kept = 0
for i in range(len(seeds)):
    r = acc.get(i) or rej[i]
    text = r["text"]
    exact = max(jac(text, t) for t in pool.values())
    v = r["validators"][-1]
    assert v["validator"] == "near_duplicate", v
    near = seeds[i].startswith("COPY") or (seeds[i].startswith("TWIN") and seeds[i].endswith("second"))
    if i in rej:
        removed += 1
        assert near, (i, seeds[i], r)
        assert exact >= 0.8, (i, exact)
        assert v["similarity"] >= 0.8, v
        # the estimate (128 permutations) of the nearest text's similarity: within 4 sd
        assert abs(v["similarity"] - jac(text, pool[v["nearest"]])) < 0.15, (v, exact)
        print(f"removed {i}: {seeds[i][:20]!r}: C {v['similarity']:.4f} exact {exact:.3f} ({v['message']})")
    else:
        kept += 1
        assert not near, (i, seeds[i], r)
        assert exact < 0.6 and v.get("similarity", 0) < 0.8, (i, exact, v)
        pool[f"the sample {r['sample']} of seed {i}"] = text
print(f"{removed} near copies removed, {kept} distinct kept")
assert removed == 9 and kept == 15, (removed, kept)
PY
pass "near duplicates removed, distinct kept (estimates within 0.15 of the exact Jaccard)"
# bad near_duplicate settings
sed 's/bands: 16/bands: 7/' p.yaml > bad.yaml
expect_fail "bands must divide permutations" "validators\[1\]\.bands" "$LOOM_BIN" synth bad.yaml
sed 's/threshold: 0.8/threshold: 1.5/' p.yaml > bad.yaml
expect_fail "threshold out of range" "validators\[1\]\.threshold" "$LOOM_BIN" synth bad.yaml
# the example pipeline runs (against the stand-in endpoint, its answers all rejected)
mkdir -p "$WORK/ex"
sed -e "s#http://127.0.0.1:8080/v1#http://127.0.0.1:$(cat port)/v1#" -e "s#out/#$WORK/ex/#" \
    -e "s#pipelines/arith_seeds.txt#$LOOM_SRC/pipelines/arith_seeds.txt#" \
    -e "s#tests/e2e/arith_check.py#$LOOM_SRC/tests/e2e/arith_check.py#" \
    "$LOOM_SRC/pipelines/arith.yaml" > ex.yaml
expect_ok "pipelines/arith.yaml" "$LOOM_BIN" synth ex.yaml --quiet
[ -f "$WORK/ex/arith.jsonl" ] && [ -s "$WORK/ex/arith.summary.json" ] || fail "the example wrote no output"
pass "the example pipeline parses and runs"
