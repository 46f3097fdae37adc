# SIGTERM and SIGINT at random moments inside full-size training steps (byte-tiny's shape:
# d 256, 4 layers, T 256, whose GEMMs run in oneDNN's real sgemm) end every run with a
# checkpoint and status 128 + N, and the same command resumes it bit for bit (issue 30: a
# signal delivered to a thread inside oneDNN corrupted its heap, 1 run in 5 aborted). Before
# that, a deterministic check: no thread of a running trainer takes SIGINT or SIGTERM (every
# thread has both blocked; loom's signal thread reads them from a signalfd).
#   SIGNAL_RUNS=N (default 8): how many random kill times; the issue's 50 are run by hand.
source "$(dirname "$0")/lib.sh"
RUNS=${SIGNAL_RUNS:-8}
STEPS=8

make_fullsize "$WORK" "$WORK/bt.yaml" $STEPS
# train RUN_DIR [args]: exec, so that a background one's $! is the trainer itself
train() { exec "$LOOM_BIN" train "$WORK/bt.yaml" --set run.dir="$1" "${@:2}"; }
rows() { [ -f "$1/metrics.jsonl" ] && wc -l < "$1/metrics.jsonl" || echo 0; }

# the reference: STEPS uninterrupted steps
(train "$WORK/ref") 2>"$WORK/ref.log" || { cat "$WORK/ref.log"; fail "the reference run"; }
losses "$WORK/ref" > "$WORK/ref.losses"
[ "$(wc -l < "$WORK/ref.losses")" = $STEPS ] || fail "the reference run has no $STEPS rows"

PID=
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

# every thread of a trainer inside its steps (OpenMP's, oneDNN's, loom's) blocks SIGINT (bit
# 2) and SIGTERM (bit 15): the kernel can deliver them to none of them
train "$WORK/mask" --set training.steps=1000 2>"$WORK/mask.log" &
PID=$!
for _ in $(seq 600); do [ "$(rows "$WORK/mask")" -ge 1 ] && break; sleep 0.1; done
[ "$(rows "$WORK/mask")" -ge 1 ] || { cat "$WORK/mask.log"; fail "the trainer made no step"; }
n=$(all_threads_block $PID) || exit 1
[ $n -ge 3 ] || fail "expected at least 3 threads (main, OpenMP, signals), saw $n"
kill -TERM $PID
rc=0; wait $PID || rc=$?
[ $rc = 143 ] || { cat "$WORK/mask.log"; fail "SIGTERM: exit $rc"; }
pass "all $n threads of a training process block SIGINT and SIGTERM"

# random moments: after the first k rows (k in 0..STEPS-2), a random delay of up to 1.2 steps
# (the reference's median step time), so the signal lands inside step k+1 or k+2
read -ra PLAN < <(python3 - "$WORK/ref/metrics.jsonl" <<PY
import json, random, statistics, sys
ms = statistics.median(json.loads(l)["step_ms"] for l in open(sys.argv[1])) / 1e3
r = random.Random()
print(' '.join(f'{r.randint(0, $STEPS - 2)}:{r.uniform(0.0, 1.2 * ms):.3f}' for _ in range($RUNS)))
PY
)
stopped=0
for i in $(seq 0 $((RUNS - 1))); do
  k=${PLAN[$i]%%:*} d=${PLAN[$i]#*:}
  sig=$([ $((i % 2)) = 0 ] && echo TERM || echo INT)
  code=$([ $sig = TERM ] && echo 143 || echo 130)
  run="$WORK/run$i"
  train "$run" 2>"$WORK/run$i.log" &
  PID=$!
  for _ in $(seq 1200); do
    [ "$(rows "$run")" -ge "$k" ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.05
  done
  sleep "$d"
  kill -$sig $PID 2>/dev/null || true
  rc=0; wait $PID || rc=$?
  crashed "$WORK/run$i.log" || grep -qE "corrupted|double free|invalid pointer|munmap_chunk" "$WORK/run$i.log" \
    && { cat "$WORK/run$i.log"; fail "run $i: SIG$sig after $k rows + ${d}s: a crash (exit $rc)"; }
  if [ $rc = 0 ] || { [ $rc = $code ] && [ "$(rows "$run")" = $STEPS ]; }; then
    note="finished before the signal"   # or it came after the loop, at the exit
  elif [ $rc = $code ] && [ "$(rows "$run")" = 0 ] && ! grep -q "interrupted by signal" "$WORK/run$i.log"; then
    note="ended by the signal before its first step"
    (train "$run") 2>"$WORK/run$i.resume.log" || { cat "$WORK/run$i.resume.log"; fail "run $i: rerunning"; }
  else
    [ $rc = $code ] || { cat "$WORK/run$i.log"; fail "run $i: SIG$sig after $k rows + ${d}s: exit $rc, not $code"; }
    grep -q "interrupted by signal" "$WORK/run$i.log" || { cat "$WORK/run$i.log"; fail "run $i: exit $rc without the checkpoint message"; }
    S=$(sed -n 's/.*interrupted by signal [0-9]* at step \([0-9]*\).*/\1/p' "$WORK/run$i.log")
    [ -f "$run/ckpt/step_$(printf %07d "$S")/COMPLETE" ] || fail "run $i: no complete checkpoint at step $S"
    (train "$run") 2>"$WORK/run$i.resume.log" || { cat "$WORK/run$i.resume.log"; fail "run $i: resuming from step $S"; }
    stopped=$((stopped + 1))
    note="stopped at step $S with exit $rc, resumed"
  fi
  losses "$run" > "$WORK/run$i.losses"
  diff "$WORK/ref.losses" "$WORK/run$i.losses" >/dev/null \
    || { diff "$WORK/ref.losses" "$WORK/run$i.losses"; fail "run $i: the losses differ from the uninterrupted run"; }
  pass "run $i: SIG$sig after $k rows + ${d}s: $note; $STEPS steps bit-identical to the uninterrupted run"
  rm -rf "$run"
done
[ $stopped -ge $((RUNS / 2)) ] || fail "only $stopped of $RUNS runs were stopped inside training"
echo "all signal tests passed: $stopped of $RUNS runs stopped by a signal inside a step, each checkpointed and resumed bit-identically"
