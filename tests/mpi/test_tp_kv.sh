# Grouped-query attention with fewer kv heads than tp ranks (Llama, 8 query heads): each kv
# head is replicated over tp / n_kv_head consecutive tp ranks, whose k/v gradients are summed
# over them. n_kv_head 2 at tp 4 (sp off and on), n_kv_head 1 at DP 2 x TP 2 with ZeRO 3 (sp off
# and on) and at TP 2 x PP 2:
# 20 steps' losses within 1e-5 (relative) of the single process, gradient norms within 1e-4
# (each replicated kv head counted once); checkpoints saved at tp 4 resume at tp 1 and tp 2
# (kv heads no longer replicated), and one saved at tp 1 resumes at tp 4, continuing the
# uninterrupted runs within 1e-5; layouts that cannot share kv heads are refused naming the key.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
FLAVOR=llama make_config "$WORK" "$WORK/c.yaml" "$WORK/unused"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5
        --set model.d_model=64 --set model.n_head=8)

# train NP RUN_DIR args...: `loom train` on NP ranks (one process at NP = 1)
train() {
  local np=$1 dir=$2; shift 2
  local cmd=("$LOOM_BIN" train "$WORK/c.yaml" "${COMMON[@]}" --set run.dir="$dir" "$@")
  if [ "$np" -gt 1 ]; then $MPIRUN -np "$np" "${cmd[@]}" 2>"$WORK/log"; else "${cmd[@]}" 2>"$WORK/log"; fi \
    || { cat "$WORK/log"; fail "$np ranks $*: failed"; }
}

for kv in 2 1; do
  train 1 "$WORK/kv$kv/single" --set model.n_kv_head=$kv
done
runs=("2 4 --set parallel.tp=4" "2 4 --set parallel.tp=4 --set parallel.sp=true"
      "1 4 --set parallel.tp=2 --set parallel.zero=3"
      "1 4 --set parallel.tp=2 --set parallel.zero=3 --set parallel.sp=true"
      "1 4 --set parallel.tp=2 --set parallel.pp=2")
for spec in "${runs[@]}"; do
  read -r kv np rest <<<"$spec"
  run=$WORK/kv$kv/$(echo "$rest" | sed 's/--set parallel\.//g' | tr ' =' '_-')
  # shellcheck disable=SC2086
  train "$np" "$run" --set model.n_kv_head=$kv $rest
  compare_losses "$WORK/kv$kv/single" "$run" 1e-5 || fail "n_kv_head $kv, $np ranks, $rest: loss differs"
  compare_losses "$WORK/kv$kv/single" "$run" 1e-4 1 grad_norm || fail "n_kv_head $kv, $rest: gradient norm differs"
  pass "n_kv_head $kv, $np ranks, $rest: 20 steps equal the single process"
done

# checkpoints: saved at tp 4 (kv heads replicated over 2 ranks) at step 10, resumed at tp 1
# and at tp 2; saved at tp 1, resumed at tp 4
ref=$WORK/kv2/tp-4
for to in 1 2; do
  train 4 "$WORK/rs_$to" --set model.n_kv_head=2 --set parallel.tp=4 --set training.steps=10 \
    --set checkpoint.every=10
  train "$to" "$WORK/rs_$to" --set model.n_kv_head=2 --set parallel.tp=$to
  grep -q "resumed from" "$WORK/log" || fail "tp 4 -> $to: did not resume"
  compare_losses "$ref" "$WORK/rs_$to" 1e-5 11 || fail "tp 4 -> tp $to diverged"
  pass "saved at tp 4 (2 kv heads), resumed at tp $to: steps 11..20 continue the tp 4 run"
done
train 1 "$WORK/rs_4" --set model.n_kv_head=2 --set training.steps=10 --set checkpoint.every=10
train 4 "$WORK/rs_4" --set model.n_kv_head=2 --set parallel.tp=4
grep -q "resumed from" "$WORK/log" || fail "tp 1 -> 4: did not resume"
compare_losses "$WORK/kv2/single" "$WORK/rs_4" 1e-5 11 || fail "tp 1 -> tp 4 diverged"
pass "saved at tp 1, resumed at tp 4 (2 kv heads): steps 11..20 continue the single process"

# refused: tp neither divides n_kv_head nor is a multiple of it; kv heads shared with cp
expect_fail "tp 3, 2 kv heads" "parallel.tp=3 .*model.n_kv_head=2" $MPIRUN -np 3 "$LOOM_BIN" \
  train "$WORK/c.yaml" --set model.d_model=48 --set model.n_head=6 --set model.n_kv_head=2 \
  --set parallel.tp=3 --set run.dir="$WORK/err1"
expect_fail "shared kv heads with cp" "model.n_kv_head: context parallelism" $MPIRUN -np 4 \
  "$LOOM_BIN" train "$WORK/c.yaml" --set model.n_kv_head=1 --set parallel.tp=2 \
  --set parallel.cp=2 --set run.dir="$WORK/err2"
echo "all tests of kv heads shared over tp ranks passed"
