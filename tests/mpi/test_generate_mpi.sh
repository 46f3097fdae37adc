#!/usr/bin/env bash
# mpirun -np N loom generate --prompts: each rank a replica taking prompts i % N; rank 0 prints
# every prompt's line in input order. The output equals the single-process run for N = 2 and 3
# (greedy), and a bad prompts file ends the whole job with the error.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
make_config "$WORK" m.yaml "$WORK/run"
"$LOOM_BIN" train m.yaml --set training.steps=10 >/dev/null 2>&1 || fail "train"
printf 'the\nquick brown\nfox\na lazy dog\nover\nthe jolly\nhex\n' > prompts.txt
"$LOOM_BIN" generate "$WORK/run" --prompts prompts.txt --tokens 12 --temperature 0 > one.jsonl \
  || fail "single process"
[ "$(wc -l < one.jsonl)" = 7 ] || fail "single process: $(cat one.jsonl)"
for np in 2 3; do
  rc=0
  timeout -k 5 120 mpirun -np $np --oversubscribe "$LOOM_BIN" generate "$WORK/run" \
    --prompts prompts.txt --tokens 12 --temperature 0 > np$np.jsonl 2> np$np.err || rc=$?
  [ $rc = 0 ] || { cat np$np.err >&2; fail "mpirun -np $np: exit $rc"; }
  cmp -s one.jsonl np$np.jsonl || { diff one.jsonl np$np.jsonl >&2; fail "-np $np differs from one process"; }
  pass "mpirun -np $np generate --prompts = one process (7 prompts over $np replicas)"
done
printf '{"prompt": "a"}\n{"prompt": 1}\n' > bad.jsonl
rc=0
timeout -k 5 120 mpirun -np 2 --oversubscribe "$LOOM_BIN" generate "$WORK/run" --prompts bad.jsonl \
  > bad.out 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "bad.jsonl:2" bad.out || { cat bad.out >&2; fail "a bad prompts file under mpirun: rc=$rc"; }
pass "a bad prompts file ends the job: $(grep -m1 "bad.jsonl:2" bad.out)"
