#!/usr/bin/env bash
# mpirun -np N loom synth PIPELINE --tp T: N / T replicas of T tensor-parallel ranks; a
# replica's ranks hold tp views of the local generator's checkpoint (Llama, grouped-query
# attention) and generate its blocks together, its tp rank 0 validates them. With sampling on
# (temperature 0.9), regeneration and the order-dependent checks, the accepted and rejected
# items equal the single-process run's at -np 2 --tp 2 and -np 4 --tp 2 (2 replicas). -np not
# a multiple of --tp, and --tp with an HTTP generator, end the job with the message.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
FLAVOR=llama KVH=2 make_config "$WORK" m.yaml "$WORK/run"
"$LOOM_BIN" train m.yaml --set training.steps=40 --set eval.every=0 \
  --set model.max_seq_len=128 >/dev/null 2>&1 || fail "train"
python3 - <<'PY'
import random
random.seed(5)
w = "the quick brown fox jumps over a lazy dog while seven wizards".split()
open("seeds.txt", "w").write("\n".join(" ".join(random.choice(w) for _ in range(3)) for _ in range(9)) + "\n")
PY
pipeline() { # $1 name, $2 generator block
  cat > "$1.yaml" <<YAML
name: tp
seed: 9
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}{feedback} "
template: t
feedback: " {message}"
generator:
$2
  max_tokens: 12
  temperature: 0.9
  batch: 4
validators:
  - kind: length
    min: 4
  - kind: regex
    pattern: "[aeiou]"
  - kind: unique
max_attempts: 3
samples_per_seed: 2
output: $WORK/$1.jsonl
cache: false
rejected: $WORK/$1.rejected.jsonl
summary: $WORK/$1.summary.json
YAML
}
pipeline local "  kind: local
  checkpoint: $WORK/run"
expect_ok "synth, one process" "$LOOM_BIN" synth local.yaml --quiet
cp local.jsonl local1.jsonl
cp local.rejected.jsonl local1.rejected.jsonl
python3 - <<'PY' || fail "the single-process run must accept some items and regenerate others"
import json
s = json.load(open("local.summary.json"))
print("one process:", s)
assert s["accepted"] > 0 and s["generations"] > s["items"], s
PY
for np in 2 4; do
  run_mpi $np tp$np.log "$LOOM_BIN" synth local.yaml --quiet --tp 2
  [ $RC = 0 ] || { cat tp$np.log >&2; fail "mpirun -np $np synth --tp 2: exit $RC"; }
  cmp -s local.jsonl local1.jsonl || { diff local1.jsonl local.jsonl >&2; fail "-np $np --tp 2: accepted samples differ from one process"; }
  cmp -s local.rejected.jsonl local1.rejected.jsonl || fail "-np $np --tp 2: rejected items differ"
  pass "mpirun -np $np synth --tp 2 ($((np / 2)) replica(s)) = one process: $(grep -c . local.jsonl) accepted"
done
must_fail_within "synth -np 3 --tp 2" 60 "tp 2 does not divide the 3 ranks" 3 \
  "$LOOM_BIN" synth local.yaml --quiet --tp 2
pipeline http "  kind: http
  url: http://127.0.0.1:9/v1"
must_fail_within "synth --tp 2 with an http generator" 60 "generator.kind is http" 2 \
  "$LOOM_BIN" synth http.yaml --quiet --tp 2
