#!/usr/bin/env bash
# The run-directory lock is about jobs, not ranks: the ranks of one mpirun job share their
# run.dir (only world rank 0 holds run.dir/train.lock), and a second 2-rank job on the same
# run.dir refuses at start, ending promptly with rank 0's message, while the first one goes on
# and keeps every metrics row.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
LONG=(--set training.steps=1000000 --set training.schedule_steps=1000000 --set eval.every=0
      --set checkpoint.every=50 --set training.log_every=100000 --set training.batch_size=4)
timeout -k 5 120 mpirun -np 2 --oversubscribe "$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" \
  >"$WORK/log_a" 2>&1 &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do
  [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run/metrics.jsonl")" -ge 10 ] && break
  kill -0 $PID 2>/dev/null || { cat "$WORK/log_a"; fail "the first job ended early"; }
  sleep 0.1
done
must_fail_within "a second 2-rank job on the same run.dir" 60 \
  "run.dir .*/run is in use by another .loom train.: .*train.lock is locked by another process \(pid [0-9]+ on .*: loom train\)" \
  2 "$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}"
kill -0 $PID 2>/dev/null || { cat "$WORK/log_a"; fail "the first job died"; }
# SIGTERM to the ranks (children of mpirun, itself the child of timeout): each finishes its
# step, they agree to stop, checkpoint, and end in order
MPIRUN_PID=$(pgrep -P $PID | head -1)
RANKS=$(pgrep -P "$MPIRUN_PID" | xargs)
[ -n "$RANKS" ] || fail "cannot find the first job's ranks"
kill -TERM $RANKS
rc=0; wait $PID || rc=$?
grep -q "interrupted by signal 15 at step" "$WORK/log_a" || { cat "$WORK/log_a"; fail "the first job was not interrupted cleanly (exit $rc)"; }
# an agreed stop, not an abort: exit 128 + 15, the message once (rank 0), no MPI_Abort
[ $rc -eq 143 ] || { cat "$WORK/log_a"; fail "the interrupted job exited $rc, not 128 + 15"; }
[ "$(grep -o "interrupted by signal 15" "$WORK/log_a" | wc -l)" = 1 ] || { cat "$WORK/log_a"; fail "the message is not said once"; }
! grep -q "MPI_ABORT" "$WORK/log_a" || { cat "$WORK/log_a"; fail "the interrupted job aborted"; }
S=$(sed -n 's/.*interrupted by signal 15 at step \([0-9]*\).*/\1/p' "$WORK/log_a" | head -1)
python3 - "$WORK/run/metrics.jsonl" "$S" <<'PY' || fail "metrics of the first job"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
n = int(sys.argv[2])
if steps != list(range(1, n + 1)):
    sys.exit(f"steps are not 1..{n} once each: {len(steps)} rows")
PY
[ -f "$WORK/run/ckpt/step_$(printf %07d "$S")/COMPLETE" ] || fail "no checkpoint at step $S"
pass "the first job went on to step $S with every row and a checkpoint"
echo "all MPI run-lock tests passed"
