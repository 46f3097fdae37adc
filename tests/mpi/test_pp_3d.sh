# Pipeline parallelism combined with data and tensor parallelism through `mpirun ... loom
# train`, 20 steps within 1e-5 (relative) of the single-process losses (gradient norms within
# 1e-4, clipping active): DP 2 x PP 2 with ZeRO 1 and 3 (the dp group holds the ranks of one
# stage), TP 2 x PP 2 (the pipeline's points wrap TP's), DP 2 x TP 2 x PP 2 on 8 ranks, GPT-2
# (tied wte kept equal, parallel.check_replicas) and Llama with grouped-query attention. And the
# batch mapping (docs/parallelism.md): pp with m micro-batches of a batch of B rows follows one
# process with batch B / m and grad_accum m, and grad_accum composes with micro-batches.
# Tiny model (d 64, 4 layers, seq 32). One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 250 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.steps=20 --set training.schedule_steps=20 --set training.batch_size=8
        --set checkpoint.every=0 --set eval.every=10 --set training.grad_clip=0.5
        --set model.d_model=64 --set model.n_layer=4 --set parallel.check_replicas=true)

# run NP NAME FLAVOR SETTINGS...: mpirun loom train, compared with FLAVOR's single process
run() {
  local np=$1 name=$2 flavor=$3; shift 3
  local dir=$WORK/$flavor/$name
  $MPIRUN -np "$np" "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" "$@" \
    --set run.dir="$dir" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor $name failed"; }
  compare_losses "$WORK/$flavor/single" "$dir" 1e-5 || fail "$flavor $name: loss differs from one process"
  compare_losses "$WORK/$flavor/single" "$dir" 1e-4 1 grad_norm || fail "$flavor $name: gradient norm differs"
  pass "$flavor, $np ranks, $name: 20 steps equal the single process"
}

for flavor in gpt2 llama; do
  KVH=4
  [ $flavor = llama ] && KVH=2
  FLAVOR=$flavor KVH=$KVH make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/$flavor/single"
  "$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" 2>"$WORK/log" || { cat "$WORK/log"; fail "$flavor single"; }
  run 4 dp2_pp2_zero1 $flavor --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1
  run 4 tp2_pp2 $flavor --set parallel.pp=2 --set parallel.tp=2 --set parallel.pp_schedule=gpipe
  run 8 dp2_tp2_pp2 $flavor --set parallel.pp=2 --set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1
  grep -q "dp=2 tp=2 pp=2" "$WORK/log" || { cat "$WORK/log"; fail "$flavor: the 8 ranks' layout is not in the log"; }
done
run 4 dp2_pp2_zero3_gpipe gpt2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3 \
  --set parallel.pp_schedule=gpipe --set parallel.microbatches=4

# the batch mapping: one process with batch 2 and grad_accum 4 = pp 2 cutting batch 8 into 4
"$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set training.batch_size=2 \
  --set training.grad_accum=4 --set run.dir="$WORK/gpt2/b2_accum4" 2>"$WORK/log" || { cat "$WORK/log"; fail "b2 accum4"; }
compare_losses "$WORK/gpt2/b2_accum4" "$WORK/gpt2/dp2_pp2_zero3_gpipe" 1e-5 \
  || fail "pp 2 with batch 8 in 4 micro-batches differs from one process with batch 2, grad_accum 4"
pass "pp 2, batch 8, microbatches 4 = one process, batch 2, grad_accum 4"
# grad_accum with micro-batches: each pass's rows cut again
"$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set training.batch_size=4 \
  --set training.grad_accum=2 --set run.dir="$WORK/gpt2/b4_accum2" 2>"$WORK/log" || { cat "$WORK/log"; fail "b4 accum2"; }
$MPIRUN -np 2 "$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set training.batch_size=4 \
  --set training.grad_accum=2 --set parallel.pp=2 --set run.dir="$WORK/gpt2/pp2_accum2" 2>"$WORK/log" \
  || { cat "$WORK/log"; fail "pp2 accum2"; }
compare_losses "$WORK/gpt2/b4_accum2" "$WORK/gpt2/pp2_accum2" 1e-5 || fail "pp 2 with grad_accum 2 differs"
pass "pp 2, batch 4, grad_accum 2 (2 micro-batches a pass) = one process, batch 4, grad_accum 2"
# microbatches with pp = 1: the same engine on one stage
"$LOOM_BIN" train "$WORK/gpt2.yaml" "${COMMON[@]}" --set parallel.microbatches=4 \
  --set run.dir="$WORK/gpt2/m4" 2>"$WORK/log" || { cat "$WORK/log"; fail "m4"; }
compare_losses "$WORK/gpt2/single" "$WORK/gpt2/m4" 1e-5 || fail "microbatches 4 at pp 1 differs"
pass "pp 1, microbatches 4 = one process"

# the classify head on the last stage (mean pooling, one label per sequence; accuracy from its
# logits), pp 2: losses, val loss and val accuracy of the single process
make_labelled_dataset "$WORK/bin"
CLS=("${LABELLED_ARGS[@]}" --set training.steps=8 --set training.schedule_steps=8
     --set training.batch_size=4 --set eval.every=4 --set checkpoint.every=0 --set model.n_layer=4)
"$LOOM_BIN" train "$WORK/gpt2.yaml" "${CLS[@]}" --set run.dir="$WORK/cls_single" 2>"$WORK/log" || { cat "$WORK/log"; fail "classify single"; }
$MPIRUN -np 2 "$LOOM_BIN" train "$WORK/gpt2.yaml" "${CLS[@]}" --set parallel.pp=2 \
  --set run.dir="$WORK/cls_pp2" 2>"$WORK/log" || { cat "$WORK/log"; fail "classify pp 2"; }
compare_losses "$WORK/cls_single" "$WORK/cls_pp2" 1e-5 || fail "classify pp 2: loss differs"
python3 - "$WORK/cls_single" "$WORK/cls_pp2" <<'PY' || fail "classify pp 2: validation differs"
import json, sys
a, b = ([(r["val_loss"], r["val_accuracy"]) for r in map(json.loads, open(d + "/metrics.jsonl"))
         if "val_loss" in r] for d in sys.argv[1:3])
print(f"validation (loss, accuracy): one process {a}, pp 2 {b}")
ok = len(a) == len(b) == 2 and all(abs(x[0] - y[0]) <= 1e-5 * abs(x[0]) and x[1] == y[1]
                                     for x, y in zip(a, b))
sys.exit(0 if ok else 1)
PY
pass "classify head, pp 2: 8 steps, val loss and accuracy equal the single process"
echo "all pipeline x data x tensor parallel tests passed"
