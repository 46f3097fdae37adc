# model.recompute (full, selective) and model.loss_chunk composed with the parallel layouts
# under mpirun: context parallelism (cp = 2, ring and ulysses: the attention hook runs again in
# a recompute), tensor parallelism (tp = 2: the row/column points run again), pipeline
# parallelism (pp = 2, 1f1b: an arena per micro-batch in flight) and dp = 2 with ZeRO 3 (the
# parameters gathered per unit): 6 steps with recompute give bitwise the losses and gradient
# norms of recompute none in the same layout; loss_chunk (tp = 1 layouts) within 1e-5.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 300 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=6 --set training.schedule_steps=6 --set training.batch_size=4
        --set checkpoint.every=0 --set eval.every=3)

same() { # same REF RUN TOL (0: bitwise)
  python3 - "$@" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(a) == len(b) == 6, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b)
            for k in ("loss", "grad_norm", "val_loss") if k in x)
tol = float(sys.argv[3])
print(f"{sys.argv[2].rsplit('/', 1)[1]}: worst relative difference {worst:.2e}")
sys.exit(0 if (worst == 0 if tol == 0 else worst < tol) else 1)
PY
}

FLAVOR=llama KVH=2 make_config "$WORK" "$WORK/llama.yaml" "$WORK/unused"
FLAVOR=gpt2 KVH=4 make_config "$WORK" "$WORK/gpt2.yaml" "$WORK/unused"
# name np flavor settings...
while read -r name np flavor extra; do
  base=$WORK/${name}_none
  $MPIRUN -np $np "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" $extra \
    --set run.dir="$base" </dev/null >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name: recompute none"; }
  modes="full selective"
  for mode in $modes; do
    run=$WORK/${name}_$mode
    $MPIRUN -np $np "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" $extra \
      --set run.dir="$run" --set model.recompute=$mode </dev/null >"$WORK/log" 2>&1 ||
      { cat "$WORK/log"; fail "$name: recompute $mode"; }
    same "$base" "$run" 0 || fail "$name: recompute $mode differs from none"
  done
  case "$extra" in *parallel.tp*) ;; *)
    run=$WORK/${name}_chunk
    $MPIRUN -np $np "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" $extra \
      --set run.dir="$run" --set model.loss_chunk=5 </dev/null >"$WORK/log" 2>&1 ||
      { cat "$WORK/log"; fail "$name: loss_chunk"; }
    same "$base" "$run" 1e-5 || fail "$name: loss_chunk differs from unfused" ;;
  esac
  pass "$name: recompute full/selective == none bitwise (loss_chunk within 1e-5 where tp = 1)"
done <<'LAYOUTS'
cp2_ring 2 llama --set parallel.cp=2 --set parallel.cp_kind=ring
cp2_ulysses 2 gpt2 --set parallel.cp=2 --set parallel.cp_kind=ulysses
tp2 2 llama --set parallel.tp=2
pp2 2 gpt2 --set parallel.pp=2 --set parallel.microbatches=2 --set parallel.pp_schedule=1f1b
dp2_zero3 2 gpt2 --set parallel.zero=3
LAYOUTS
