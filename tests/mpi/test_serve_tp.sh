#!/usr/bin/env bash
# `mpirun -np 2 loom serve CKPT --tp 2`: the model (Llama, grouped-query attention) split over
# two ranks; rank 0 serves and, before each engine step, sends the other rank what it did to its
# engine (new requests with their parameters, cancellations, releases), which replays it and
# steps with it. 18 requests (completions and chat, greedy and sampled with seeds, streamed and
# not, a stop string, a response_format json_schema: the followers compile its grammar), sent one at a time, get the single-process server's answers; between
# them a client goes away mid-stream (its request cancelled on both ranks) and 12 concurrent
# requests are all answered, after which the answers still match. SIGTERM to rank 0 drains and
# ends the whole job with exit 0. Refused: -np other than --tp, mpirun without --tp.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
make_dataset "$WORK"
FLAVOR=llama KVH=2 make_config "$WORK" m.yaml "$WORK/run"
"$LOOM_BIN" train m.yaml --set training.steps=60 --set training.schedule_steps=60 \
  --set training.seq_len=64 --set checkpoint.every=60 --set eval.every=0 \
  --set model.vocab_size=261 >/dev/null 2>train.log || { cat train.log; fail "train"; }
CLIENT=$LOOM_SRC/tests/mpi/serve_tp_client.py

start_server one.port one.log "$LOOM_BIN" serve "$WORK/run" --port 0 --port-file one.port --model-id m
python3 "$CLIENT" "$(cat one.port)" m > one.jsonl || fail "client against one process"
kill -TERM $SERVER_PID
wait $SERVER_PID || fail "one process: exit $? after SIGTERM"
[ "$(grep -c '"k"' one.jsonl)" = 18 ] || fail "one process: $(cat one.jsonl)"

timeout -k 5 300 mpirun -np 2 --oversubscribe "$LOOM_BIN" serve "$WORK/run" --port 0 \
  --port-file tp.port --model-id m --tp 2 2>tp.log &
MPI_PID=$!
trap 'kill $MPI_PID 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
for _ in $(seq 600); do [ -s tp.port ] && break; kill -0 $MPI_PID 2>/dev/null || break; sleep 0.1; done
[ -s tp.port ] || { cat tp.log >&2; fail "the tp server did not start"; }
grep -q "over a tensor-parallel group" tp.log || fail "no tp serving line: $(cat tp.log)"
for r in 0 1; do # each rank's view: its parameters, and its one kv head of 2 layers x 8 floats x K, V
  grep -q "rank $r (tp rank $r of 2): parameters .* floats), KV cache 128 bytes per position" tp.log \
    || fail "rank $r's memory line: $(cat tp.log)"
done
python3 "$CLIENT" "$(cat tp.port)" m > tp.jsonl || { cat tp.log >&2; fail "client against -np 2 --tp 2"; }
cmp -s one.jsonl tp.jsonl || { diff one.jsonl tp.jsonl >&2; fail "the tp 2 server answers differently"; }
pass "mpirun -np 2 serve --tp 2: 18 requests answered as one process answers them (after a cancelled stream and 12 concurrent requests)"

# SIGTERM to rank 0 (the one that serves): it drains, stops the other rank, and the job exits 0
mp=$(pgrep -P $MPI_PID -x mpirun || echo $MPI_PID)
r0=
for p in $(pgrep -P "$mp"); do
  tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && r0=$p
done
[ -n "$r0" ] || fail "rank 0's process not found under mpirun $mp"
kill -TERM "$r0"
rc=0
wait $MPI_PID || rc=$?
[ $rc = 0 ] || { cat tp.log >&2; fail "after SIGTERM to rank 0 the job exited $rc"; }
grep -q "SIGTERM: finishing" tp.log || fail "no drain message: $(cat tp.log)"
pass "SIGTERM to rank 0: drained, the whole job exited 0"

must_fail_within "serve --tp 2 on 3 ranks" 60 "run it under mpirun -np 2 \(this job has 3\)" 3 \
  "$LOOM_BIN" serve "$WORK/run" --port 0 --tp 2
must_fail_within "serve under mpirun without --tp" 60 "needs --tp" 2 \
  "$LOOM_BIN" serve "$WORK/run" --port 0
