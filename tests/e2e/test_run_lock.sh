# One trainer per run directory: a second `loom train` on a run.dir in use refuses at start,
# naming the holder, and changes nothing; the first one keeps every metrics row. The lock dies
# with its process: after a SIGKILL the same command resumes at once.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
LONG=(--set training.steps=1000000 --set training.schedule_steps=1000000 --set eval.every=0
      --set checkpoint.every=50 --set training.log_every=1000)

# wait_rows N: until run/metrics.jsonl holds at least N rows (the first trainer is in its loop)
wait_rows() {
  for _ in $(seq 600); do
    [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run/metrics.jsonl")" -ge "$1" ] && return 0
    kill -0 "$PID" 2>/dev/null || { cat "$WORK/log_a"; fail "the first trainer ended early"; }
    sleep 0.1
  done
  fail "the first trainer wrote no $1 rows within 60 s"
}
# rows_exactly N: metrics.jsonl holds the steps 1..N, each once, in order
rows_exactly() {
  python3 - "$WORK/run/metrics.jsonl" "$1" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
n = int(sys.argv[2])
if steps != list(range(1, n + 1)):
    sys.exit(f"metrics.jsonl steps are not 1..{n} once each: {len(steps)} rows, "
             f"first {steps[:5]}, last {steps[-5:]}")
PY
}

PID=
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" 2>"$WORK/log_a" &
PID=$!
wait_rows 20
cp "$WORK/run/config.yaml" "$WORK/config_before"
expect_fail "a second trainer on the same run.dir" \
  "run.dir .*/run is in use by another .loom train.: .*/run/train.lock is locked by another process \(pid $PID on .*: loom train\)" \
  timeout 60 "$LOOM_ASAN_BIN" train "$WORK/c.yaml" "${LONG[@]}" --set training.seed=99
cmp -s "$WORK/config_before" "$WORK/run/config.yaml" || fail "the refused trainer rewrote config.yaml"
kill -0 $PID || fail "the first trainer died"
# the first one still runs, undisturbed: stop it (SIGTERM: checkpoint, exit 143)
kill -TERM $PID
rc=0; wait $PID || rc=$?
[ $rc -eq 143 ] || { cat "$WORK/log_a"; fail "SIGTERM: the trainer exited $rc, not 128 + 15"; }
grep -q "interrupted by signal 15 at step" "$WORK/log_a" || { cat "$WORK/log_a"; fail "no interruption message"; }
S=$(sed -n 's/.*interrupted by signal 15 at step \([0-9]*\).*/\1/p' "$WORK/log_a")
[ -f "$WORK/run/ckpt/step_$(printf %07d "$S")/COMPLETE" ] || fail "no checkpoint at step $S"
rows_exactly "$S" || fail "metrics of the first trainer"
pass "the first trainer kept every row: steps 1..$S, checkpoint at $S"

# a killed trainer leaves the lock file but not the lock: the same command resumes
"$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" 2>"$WORK/log_a" &
PID=$!
wait_rows $((S + 5))
kill -KILL $PID
wait $PID || true
[ -f "$WORK/run/train.lock" ] || fail "no lock file in the run directory"
expect_ok "the same command after a SIGKILL" \
  "$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" --set training.steps=$((S + 60))
grep -q "resumed from .*step_" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "did not resume"; }
pass "a SIGKILLed trainer does not block its restart"
echo "all run-lock tests passed"
