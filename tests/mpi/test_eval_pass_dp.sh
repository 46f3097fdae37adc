# The trainer's val_loss with eval.batches = 0 under data parallelism: the pass over every
# window of a two-source split (82 windows, batch 4: the last global batch holds 2) is split
# over the dp ranks without overlap or gap, so at DP = 2 (rank 1 gets nothing of the last
# batch) and DP = 4 (ranks 2 and 3 get nothing) val_loss equals the mean of every window's loss
# for the checkpoint of that step (tests/e2e/eval_reference.py, one window at a time).
source "$(dirname "$0")/lib.sh"
make_mixed_dataset "$WORK"
cat > "$WORK/c.yaml" <<YAML
data:
  train: $WORK/data/train
  val: $WORK/data/train
model:
  vocab_size: 256
  d_model: 32
  n_layer: 2
  n_head: 4
training:
  steps: 3
  batch_size: 4
  seq_len: 16
  lr: 3e-3
  warmup: 1
  peak_flops: 1e11
eval:
  every: 0
  batches: 0
checkpoint:
  every: 3
YAML
for dp in 2 4; do
  run=$WORK/dp$dp
  run_mpi $dp "$WORK/log" "$LOOM_BIN" train "$WORK/c.yaml" --set run.dir="$run"
  [ $RC -eq 0 ] || { cat "$WORK/log" >&2; fail "dp=$dp: exit $RC"; }
  python3 "$LOOM_SRC/tests/e2e/eval_reference.py" "$run" "$WORK/data/train" 16 >"$WORK/ref.json" ||
    fail "dp=$dp: reference"
  python3 - "$run" "$WORK/ref.json" <<'PY' || fail "dp=$dp: val_loss is not the pass over every window"
import json, sys
ref = json.load(open(sys.argv[2]))
last = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")][-1]
rel = abs(last["val_loss"] - ref["loss"]) / ref["loss"]
print(f"step {last['step']}: val_loss {last['val_loss']!r}, reference {ref['loss']!r} over {ref['windows']} windows (rel {rel:.1e})")
assert last["step"] == 3 and ref["windows"] == 82 and rel < 1e-5
PY
  pass "dp=$dp: val_loss over the 82 windows = the reference"
done
echo PASS
