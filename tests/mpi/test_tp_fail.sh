# Tensor parallelism's failures: a rank hung, or killed, inside a TP collective ends the whole
# job non-zero within parallel.timeout_s + 30 s; the hang is named by the waiting tp rank
# (the collective, the tp group and the missing world rank). One thread per rank,
# --oversubscribe.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
COMMON=(--set training.steps=6 --set training.schedule_steps=6 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=0 --set parallel.tp=2 --set parallel.timeout_s=5)
# LOOM_TEST_TP_FAIL (src/parallel/tp.c): world rank 1 stops before its 40th tp collective
# (inside the 3rd step: 2 layers x 4 + 4 vocab-parallel collectives = 12 per step)
must_fail_within "rank 1 hung inside a TP collective (timeout 5 s)" 35 \
  "loom: rank 0: .* on tp \(2 ranks\) did not complete within 5 s; ranks still missing: 1" \
  2 -x LOOM_TEST_TP_FAIL=1:40:hang "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/hang"
must_fail_within "rank 1 killed inside a TP collective" 35 "process rank 1 .*signal 9|rank 1.*Killed" \
  2 -x LOOM_TEST_TP_FAIL=1:40:kill "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$WORK/kill"
# with sequence parallelism the hang is inside an all-gather / reduce-scatter
must_fail_within "rank 3 of DP 2 x TP 2 hung inside an SP collective (timeout 5 s)" 35 \
  "loom: rank 2: .* on tp \(2 ranks\) did not complete within 5 s; ranks still missing: 3" \
  4 -x LOOM_TEST_TP_FAIL=3:40:hang "$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" \
  --set parallel.sp=true --set run.dir="$WORK/hang_sp"
echo "all tensor-parallel failure tests passed"
