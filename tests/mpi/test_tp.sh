# Tensor parallelism through `mpirun ... loom train`: TP = 2 and 4 follow the single-process
# loss curve for 20 steps within 1e-5 relative, GPT-2 and Llama with grouped-query attention
# (8 query heads, 4 kv heads: at tp = 4 each rank holds 2 query heads and 1 kv head), and
# DP 2 x TP 2 with ZeRO 1 and 3. One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5)

for flavor in gpt2 llama; do
  FLAVOR=$flavor make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/$flavor/single"
  ARGS=("${COMMON[@]}" --set model.d_model=64 --set model.n_head=8)
  [ $flavor = llama ] && ARGS+=(--set model.n_kv_head=4) || ARGS+=(--set model.n_kv_head=8)
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single"; }
  runs=("2 tp=2" "4 tp=4" "4 tp=2,zero=1" "4 tp=2,zero=3")
  for spec in "${runs[@]}"; do
    np=${spec%% *}; kv=${spec#* }
    name=$(echo "$kv" | tr ',=' '_-')
    set_args=()
    for p in ${kv//,/ }; do
      case $p in tp=*) set_args+=(--set parallel.$p);; zero=*) set_args+=(--set parallel.$p);; esac
    done
    run=$WORK/$flavor/$name
    $MPIRUN -np "$np" "$LOOM_BIN" train "$WORK/$flavor.yaml" "${ARGS[@]}" "${set_args[@]}" \
      --set run.dir="$run" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $np ranks $kv failed"; }
    grep -q "tp=$(echo "$kv" | sed 's/.*tp=\([0-9]\).*/\1/')" "$WORK/log" || { cat "$WORK/log"; fail "$flavor $kv: layout not in the log"; }
    compare_losses "$WORK/$flavor/single" "$run" 1e-5 || fail "$flavor $np ranks $kv: loss differs from one process"
    # the clipping norm is global: each replicated tensor counted once over the tp ranks
    compare_losses "$WORK/$flavor/single" "$run" 1e-4 1 grad_norm || fail "$flavor $np ranks $kv: gradient norm differs"
    pass "$flavor, $np ranks, $kv: 20 steps equal the single process"
  done
done
echo "all tensor-parallel training tests passed"
