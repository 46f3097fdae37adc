#!/usr/bin/env bash
# mpirun -np N loom synth: the ranks share a round's items (blocks of generator.batch, block b
# on rank b % N), exchange the outcomes, run the order-dependent checks (unique, MinHash near
# duplicates: some rejected here) over all items in item order, and rank 0 writes. The accepted samples (the whole
# output file, lineage included) equal the single-process run's, with sampling on (temperature
# 0.9): the local engine (each rank a replica, each block one engine batch) and an HTTP
# generator (each rank its share of the requests; every request sent once in all). With --tp 2
# (-np 2: one replica of two tensor-parallel ranks; -np 4: two replicas) a replica's ranks hold
# tp views of the checkpoint (Llama, grouped-query attention), generate its blocks together and
# its tp rank 0 validates them: the same files again. -np not a multiple of --tp, and --tp with
# an HTTP generator, end the job with the message.
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
open("seeds.txt", "w").write("\n".join(" ".join(random.choice(w) for _ in range(3)) for _ in range(11)) + "\n")
PY
pipeline() { # $1 name, $2 generator block, $3 extra validator
  cat > "$1.yaml" <<YAML
name: mpi
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
    pattern: "$3"
  - kind: unique
  - kind: near_duplicate             # characters, every shared minimum a candidate
    shingle: 1
    permutations: 32
    bands: 32
    threshold: 0.25
max_attempts: 3
samples_per_seed: 2
output: $WORK/$1.jsonl
cache: ${CACHE:-false}
rejected: $WORK/$1.rejected.jsonl
summary: $WORK/$1.summary.json
YAML
}
pipeline local "  kind: local
  checkpoint: $WORK/run" "[aeiou]"
expect_ok "synth, one process (local engine)" "$LOOM_BIN" synth local.yaml --quiet
cp local.jsonl local1.jsonl
cp local.rejected.jsonl local1.rejected.jsonl
python3 - <<'PY' || fail "the single-process run must accept some items and regenerate others"
import json
s = json.load(open("local.summary.json"))
print("one process:", s)
assert s["accepted"] > 0 and s["generations"] > s["items"], s
assert s["rejected_by"]["near_duplicate"] > 0, "no near duplicate: the order-dependent check is not exercised"
PY
for np in 2 3; do
  run_mpi $np mpi$np.log "$LOOM_BIN" synth local.yaml --quiet
  [ $RC = 0 ] || { cat mpi$np.log >&2; fail "mpirun -np $np synth: exit $RC"; }
  cmp -s local.jsonl local1.jsonl || { diff local1.jsonl local.jsonl >&2; fail "-np $np: accepted samples differ from one process"; }
  cmp -s local.rejected.jsonl local1.rejected.jsonl || fail "-np $np: rejected items differ"
  grep -q "\"ranks\":$np" local.summary.json || fail "-np $np: summary: $(cat local.summary.json)"
  pass "mpirun -np $np synth (local engine) = one process: $(grep -c . local.jsonl) accepted"
done
for np in 2 4; do
  run_mpi $np tp$np.log "$LOOM_BIN" synth local.yaml --quiet --tp 2
  [ $RC = 0 ] || { cat tp$np.log >&2; fail "mpirun -np $np synth --tp 2: exit $RC"; }
  cmp -s local.jsonl local1.jsonl || { diff local1.jsonl local.jsonl >&2; fail "-np $np --tp 2: accepted samples differ from one process"; }
  cmp -s local.rejected.jsonl local1.rejected.jsonl || fail "-np $np --tp 2: rejected items differ"
  pass "mpirun -np $np synth --tp 2 ($((np / 2)) replica(s)) = one process: $(grep -c . local.jsonl) accepted"
done
must_fail_within "synth -np 3 --tp 2" 60 "tp 2 does not divide the 3 ranks" 3 \
  "$LOOM_BIN" synth local.yaml --quiet --tp 2
# an HTTP generator: each rank sends its share of the requests
start_server port fake.log python3 "$LOOM_SRC/tests/e2e/fake_openai.py" port requests.log
pipeline http "  kind: http
  url: http://127.0.0.1:$(cat port)/v1
  concurrency: 2" "^[i-z]"
expect_ok "synth, one process (http)" "$LOOM_BIN" synth http.yaml --quiet
cp http.jsonl http1.jsonl
n1=$(grep -c . requests.log)
run_mpi 2 http2.log "$LOOM_BIN" synth http.yaml --quiet
[ $RC = 0 ] || { cat http2.log >&2; fail "mpirun -np 2 synth (http): exit $RC"; }
cmp -s http.jsonl http1.jsonl || { diff http1.jsonl http.jsonl >&2; fail "-np 2 (http): output differs"; }
n2=$(($(grep -c . requests.log) - n1))
gens=$(python3 -c "import json; print(json.load(open('http.summary.json'))['generations'])")
[ "$n2" = "$gens" ] && [ "$n1" = "$gens" ] || fail "requests: one process $n1, two ranks $n2, generations $gens"
pass "mpirun -np 2 synth (http) = one process; $n2 requests for $gens generations (none sent twice)"
# the cache under mpirun: rank 0 writes what every rank generated; one process then finds it all
CACHE=$WORK/cache pipeline local "  kind: local
  checkpoint: $WORK/run" "[aeiou]"
run_mpi 2 cache2.log "$LOOM_BIN" synth local.yaml --quiet
[ $RC = 0 ] || { cat cache2.log >&2; fail "mpirun -np 2 synth with a cache: exit $RC"; }
cmp -s local.jsonl local1.jsonl || fail "-np 2 with a cache: output differs"
expect_ok "one process on the cache of two ranks" "$LOOM_BIN" synth local.yaml --quiet
cmp -s local.jsonl local1.jsonl || fail "the cached rerun: output differs"
python3 -c "
import json; s = json.load(open('local.summary.json')); c = s['cache']
assert c['generations_run'] == 0 and c['generation_hits'] == s['generations'], s
" || fail "the rerun generated: $(cat local.summary.json)"
pass "a cache written under -np 2 serves a one-process rerun entirely"
must_fail_within "synth --tp 2 with an http generator" 60 "generator.kind is http" 2 \
  "$LOOM_BIN" synth http.yaml --quiet --tp 2
# an error in the pipeline ends the whole job with the message
sed 's/^template: t/template: nope/' http.yaml > bad.yaml
must_fail_within "a bad pipeline under mpirun" 60 "bad.yaml: template 'nope'" 2 "$LOOM_BIN" synth bad.yaml
