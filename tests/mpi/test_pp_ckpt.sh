# Checkpoints across pipeline layouts: every stage writes its layers' boxes under their global
# names (stage 0 the embedding, the last stage the head; a tied head's wte copy is not written),
# so a checkpoint saved at one layout loads at another and training continues with the losses
# of the uninterrupted run within 1e-5 (relative): PP 2 -> PP 1, PP 1 -> PP 4, DP 2 x PP 2 with
# ZeRO 3 -> one process with ZeRO 0 (both flavors), and TP 2 x PP 2 -> TP 1 x PP 1 -> TP 2 x
# PP 1. Tiny model (d 64, 4 layers, seq 32). One thread per rank, --oversubscribe.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 200 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
make_dataset "$WORK"
COMMON=(--set training.schedule_steps=20 --set training.batch_size=8 --set eval.every=10
        --set training.grad_clip=0.5 --set model.d_model=64 --set model.n_layer=4)

# train NP DIR STEPS FLAVOR SETTINGS...: (mpirun when NP > 1) loom train to STEPS, checkpoint
# every 5 steps
train() {
  local np=$1 dir=$2 steps=$3 flavor=$4; shift 4
  local cmd=("$LOOM_BIN" train "$WORK/$flavor.yaml" "${COMMON[@]}" --set training.steps="$steps"
             --set checkpoint.every=5 --set run.dir="$dir" "$@")
  if [ "$np" -gt 1 ]; then $MPIRUN -np "$np" "${cmd[@]}" 2>"$WORK/log"; else "${cmd[@]}" 2>"$WORK/log"; fi \
    || { cat "$WORK/log"; fail "$flavor: $np ranks $* to step $steps in $dir failed"; }
}

for flavor in gpt2 llama; do
  KVH=4
  [ $flavor = llama ] && KVH=2
  FLAVOR=$flavor KVH=$KVH make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/unused"
  W=$WORK/$flavor
  # uninterrupted references
  train 2 "$W/pp2" 20 $flavor --set parallel.pp=2
  train 1 "$W/pp1" 20 $flavor
  # PP 2 -> PP 1 at step 10
  train 2 "$W/a" 10 $flavor --set parallel.pp=2
  [ -f "$W/a/ckpt/step_0000010/rank_00001.safetensors" ] || fail "$flavor: stage 1 wrote no checkpoint piece"
  train 1 "$W/a" 20 $flavor
  grep -q "resumed from" "$WORK/log" || fail "$flavor: pp 1 did not resume"
  compare_losses "$W/pp2" "$W/a" 1e-5 11 || fail "$flavor: pp 2 -> pp 1 resume diverged"
  pass "$flavor: saved at pp 2 (step 10), resumed at pp 1: steps 11..20 continue the pp 2 run"
  # PP 1 -> PP 4 at step 10
  train 1 "$W/b" 10 $flavor
  train 4 "$W/b" 20 $flavor --set parallel.pp=4
  grep -q "resumed from" "$WORK/log" || fail "$flavor: pp 4 did not resume"
  compare_losses "$W/pp1" "$W/b" 1e-5 11 || fail "$flavor: pp 1 -> pp 4 resume diverged"
  pass "$flavor: saved at pp 1, resumed at pp 4 (1f1b): steps 11..20 continue the pp 1 run"
  # DP 2 x PP 2, ZeRO 3 (sharded pieces) -> one process, ZeRO 0
  train 4 "$W/c" 10 $flavor --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=3
  train 1 "$W/c" 20 $flavor --set parallel.zero=0
  compare_losses "$W/pp2" "$W/c" 1e-5 11 || fail "$flavor: dp 2 x pp 2 zero 3 -> 1 process diverged"
  pass "$flavor: saved at dp 2 x pp 2 (ZeRO 3), resumed at one process (ZeRO 0): steps 11..20 continue"
done

# TP 2 x PP 2 -> TP 1 x PP 1 -> TP 2 x PP 1 (gpt2: the tied head; llama: grouped-query heads)
for flavor in gpt2 llama; do
  W=$WORK/$flavor
  train 4 "$W/tp2pp2" 20 $flavor --set parallel.tp=2 --set parallel.pp=2
  train 4 "$W/d" 10 $flavor --set parallel.tp=2 --set parallel.pp=2
  train 1 "$W/d" 15 $flavor
  grep -q "resumed from.*step_0000010" "$WORK/log" || fail "$flavor: tp 1 pp 1 did not resume at 10"
  train 2 "$W/d" 20 $flavor --set parallel.tp=2
  grep -q "resumed from.*step_0000015" "$WORK/log" || fail "$flavor: tp 2 pp 1 did not resume at 15"
  compare_losses "$W/tp2pp2" "$W/d" 1e-5 11 || fail "$flavor: tp2.pp2 -> tp1.pp1 -> tp2.pp1 diverged"
  pass "$flavor: TP2.PP2 (step 10) -> TP1.PP1 (step 15) -> TP2.PP1 (step 20): losses of the uninterrupted run"
done
echo "all pipeline checkpoint tests passed"
