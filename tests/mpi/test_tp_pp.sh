# Tensor and pipeline parallelism together through `mpirun ... loom train`: DP 2 x TP 2 x PP 2
# on 8 ranks follows the single-process loss curve for 20 steps within 1e-5 relative (GPT-2
# with its tied wte split by vocabulary rows and copied on the last stage; Llama with
# grouped-query attention), and a checkpoint resharded TP2.PP2 -> TP1.PP1 -> TP2.PP1 continues
# the uninterrupted losses within 1e-5. One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 250 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=30 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5
        --set model.d_model=64 --set model.n_head=8)

for flavor in gpt2 llama; do
  FLAVOR=$flavor make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/$flavor/single"
  ARGS=("${COMMON[@]}")
  [ $flavor = llama ] && ARGS+=(--set model.n_kv_head=4) || ARGS+=(--set model.n_kv_head=8)
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set training.steps=30 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor single"; }
  run=$WORK/$flavor/dp2tp2pp2
  $MPIRUN -np 8 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=2 \
    --set parallel.pp=2 --set parallel.zero=1 --set run.dir="$run" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor dp2 x tp2 x pp2"; }
  grep -q "dp=2 tp=2 pp=2" "$WORK/log" || { cat "$WORK/log"; fail "$flavor: layout not in the log"; }
  compare_losses "$run" "$WORK/$flavor/single" 1e-5 1 || fail "$flavor dp2 x tp2 x pp2: loss differs"
  compare_losses "$run" "$WORK/$flavor/single" 1e-4 1 grad_norm || fail "$flavor dp2 x tp2 x pp2: gradient norm differs"
  pass "$flavor: DP 2 x TP 2 x PP 2 (8 ranks, zero 1): 20 steps equal the single process"

  # reshard: TP2.PP2 saves at step 10, TP1.PP1 continues to 20 and saves, TP2.PP1 to 30
  rs=$WORK/$flavor/reshard
  $MPIRUN -np 4 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=2 \
    --set parallel.pp=2 --set training.steps=10 --set checkpoint.every=10 --set run.dir="$rs" \
    2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor: tp2.pp2 save"; }
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set training.steps=20 \
    --set checkpoint.every=10 --set run.dir="$rs" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor: tp1.pp1 resume"; }
  grep -q "resumed from .*step_0000010" "$WORK/log" || { cat "$WORK/log"; fail "$flavor: tp1.pp1 did not resume from step 10"; }
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" --set parallel.tp=2 \
    --set training.steps=30 --set run.dir="$rs" 2>"$WORK/log" \
    || { cat "$WORK/log"; fail "$flavor: tp2.pp1 resume"; }
  grep -q "resumed from .*step_0000020" "$WORK/log" || { cat "$WORK/log"; fail "$flavor: tp2.pp1 did not resume from step 20"; }
  compare_losses "$WORK/$flavor/single" "$rs" 1e-5 1 || fail "$flavor: resharded run diverged"
  pass "$flavor: TP2.PP2 -> TP1.PP1 -> TP2.PP1 (saved at 10, 20): steps 1..30 equal the uninterrupted run"
done
echo "all tensor x pipeline parallel tests passed"
