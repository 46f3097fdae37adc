# Pipeline parallelism's failures and bad layouts: a rank killed, or hung, inside a pipeline
# send/recv ends the whole job non-zero within parallel.timeout_s + 30 s (the hang: the waiting
# neighbour names the pipeline receive and the missing world rank); bad keys and layouts are
# clear errors naming the key. One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 120 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
COMMON=(--set training.steps=6 --set training.schedule_steps=6 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=0 --set model.d_model=64 --set model.n_layer=4
        --set parallel.pp=2 --set parallel.timeout_s=5)

# failed WHAT REGEX NP args...: mpirun (under `timeout 90`) must exit non-zero, its output match
# REGEX, and end within parallel.timeout_s (5) + 30 s of the moment the failing rank announced
# its failure (each output line is stamped as it arrives; mpirun's start-up and the steps before
# the failure do not count)
failed() {
  local what=$1 pattern=$2 np=$3; shift 3
  { timeout -k 5 90 mpirun -np "$np" --oversubscribe "$@" 2>&1 || echo "__rc $?"; } |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$WORK/out"
  local end rc t_fail
  end=$(date +%s.%N)
  rc=$(sed -n 's/.* __rc \([0-9]*\)$/\1/p' "$WORK/out")
  [ -n "$rc" ] && [ "$rc" != 0 ] || { cat "$WORK/out" >&2; fail "$what: mpirun exited 0"; }
  [ "$rc" != 124 ] || { cat "$WORK/out" >&2; fail "$what: the job hung (killed by timeout 90)"; }
  grep -qE "$pattern" "$WORK/out" || { cat "$WORK/out" >&2; fail "$what: output does not match /$pattern/"; }
  t_fail=$(grep -m1 "LOOM_TEST_PP_FAIL: " "$WORK/out" | cut -d' ' -f1)
  [ -n "$t_fail" ] || { cat "$WORK/out" >&2; fail "$what: the failing rank never reached the hook"; }
  python3 -c "import sys; d = float(sys.argv[2]) - float(sys.argv[1]); print(f'{d:.1f}'); sys.exit(0 if d <= 35 else 1)" \
    "$t_fail" "$end" >"$WORK/dt" || { cat "$WORK/out" >&2; fail "$what: ended $(cat "$WORK/dt") s after the failure (limit 35)"; }
  pass "$what: exit $rc, $(cat "$WORK/dt") s after the failure: $(grep -m1 -oE "$pattern" "$WORK/out")"
}

# LOOM_TEST_PP_FAIL (src/parallel/pp.c): world rank 1 (stage 1) fails in its 3rd training batch
# where it would send its input's gradient back; stage 0 is then in the receive of it
failed "rank 1 hung inside a pipeline send/recv (timeout 5 s)" \
  "loom: rank 0: pipeline receive of the gradient of micro-batch 0 on stage 0 \(from stage 1, world rank 1\) \(p2p\) on pp \(2 ranks\) did not complete within 5 s" \
  2 -x LOOM_TEST_PP_FAIL=1:3:hang "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/hang"
grep -q "loom: rank 0:   rank 1: " "$WORK/out" || { cat "$WORK/out" >&2; fail "hang: the missing rank's progress is not shown"; }
failed "rank 1 killed inside a pipeline send/recv" "process rank 1 .*signal 9|rank 1.*Killed" \
  2 -x LOOM_TEST_PP_FAIL=1:3:kill "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/kill"
# the same on 4 stages: the middle stage 2 (world rank 2) hangs; stage 1 waits for its gradient
failed "rank 2 of 4 stages hung" \
  "pipeline receive of the gradient of micro-batch 0 on stage 1 \(from stage 2, world rank 2\)" \
  4 -x LOOM_TEST_PP_FAIL=2:2:hang "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set parallel.pp=4 \
  --set run.dir="$WORK/hang4"

expect_fail "microbatches not dividing the rows" \
  "parallel.microbatches = 3" $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" \
  --set parallel.microbatches=3 --set run.dir="$WORK/e1"
expect_fail "microbatches auto (= pp) not dividing the rows" "auto: parallel.pp" \
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set parallel.pp=4 \
  --set training.batch_size=2 --set run.dir="$WORK/e2"
expect_fail "unknown schedule" "parallel.pp_schedule' = 'zigzag'.*gpipe or 1f1b" \
  "$LOOM_BIN" train "$WORK/c.yaml" --set parallel.pp_schedule=zigzag --set run.dir="$WORK/e3"
expect_fail "microbatches zero" "parallel.microbatches' = 0" \
  "$LOOM_BIN" train "$WORK/c.yaml" --set parallel.microbatches=0 --set run.dir="$WORK/e4"
expect_fail "pp not dividing n_layer" "parallel.pp=2 does not divide model.n_layer=3" \
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set model.n_layer=3 --set run.dir="$WORK/e5"
expect_fail "pp with cp" "parallel.pp = 2 with parallel.cp = 2" \
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set parallel.cp=2 --set run.dir="$WORK/e6"
echo "all pipeline failure and error tests passed"
