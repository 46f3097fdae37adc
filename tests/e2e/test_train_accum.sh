# Gradient accumulation: batch 4 x 2 micro-batches trains like batch 8 x 1 (the same samples,
# the same mean gradient) to fp32 rounding, for both flavors and both schedules.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
for flavor in gpt2 llama; do
  export FLAVOR=$flavor KVH=$([ $flavor = llama ] && echo 2 || echo 4)
  for sched in cosine wsd; do
    make_config "$WORK" "$WORK/a.yaml" "$WORK/a_${flavor}_$sched"
    make_config "$WORK" "$WORK/b.yaml" "$WORK/b_${flavor}_$sched"
    "$LOOM_BIN" train "$WORK/a.yaml" --set training.steps=8 --set checkpoint.every=0 \
      --set training.batch_size=8 --set training.schedule=$sched 2>/dev/null
    "$LOOM_BIN" train "$WORK/b.yaml" --set training.steps=8 --set checkpoint.every=0 \
      --set training.batch_size=4 --set training.grad_accum=2 --set training.schedule=$sched 2>/dev/null
    python3 - "$WORK/a_${flavor}_$sched" "$WORK/b_${flavor}_$sched" <<'PY' || fail "$flavor $sched: accumulation differs"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(a) == len(b) == 8
worst = max(max(abs(x["loss"] - y["loss"]) / x["loss"], abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"])
            for x, y in zip(a, b))
assert all(x["lr"] == y["lr"] for x, y in zip(a, b))
print(f"max relative difference of loss / grad norm over 8 steps: {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
PY
    pass "$flavor, $sched: batch 4 x accum 2 == batch 8"
  done
done
