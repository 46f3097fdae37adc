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

# LOOM_TEST_PP_FAIL (src/parallel/pp.c): world rank 1 (stage 1) fails in its 3rd training batch
# where it would send its input's gradient back; stage 0 is then in the receive of it
must_fail_within "rank 1 hung inside a pipeline send/recv (timeout 5 s)" 35 \
  "loom: rank 0: pipeline receive of the gradient of micro-batch 0 on stage 0 \(from stage 1, world rank 1\) \(p2p\) on pp \(2 ranks\) did not complete within 5 s" \
  2 -x LOOM_TEST_PP_FAIL=1:3:hang "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/hang"
grep -q "loom: rank 0:   rank 1: " "$WORK/out" || { cat "$WORK/out" >&2; fail "hang: the missing rank's progress is not shown"; }
must_fail_within "rank 1 killed inside a pipeline send/recv" 35 "process rank 1 .*signal 9|rank 1.*Killed" \
  2 -x LOOM_TEST_PP_FAIL=1:3:kill "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/kill"
# the same on 4 stages: the middle stage 2 (world rank 2) hangs; stage 1 waits for its gradient
must_fail_within "rank 2 of 4 stages hung" 35 \
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
