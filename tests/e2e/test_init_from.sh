# training.init_from: a new run starts from the weights of a loom checkpoint or of a Hugging Face
# directory (fresh optimizer state and schedule, model.* taken from the source).
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
export FLAVOR=llama KVH=2
make_config "$WORK" "$WORK/base.yaml" "$WORK/base"
"$LOOM_BIN" train "$WORK/base.yaml" --set training.steps=30 --set training.schedule_steps=30 \
  --set checkpoint.every=30 2>"$WORK/log_base" || { cat "$WORK/log_base"; fail "base run"; }
expect_ok "export the base run to a Hugging Face directory" "$LOOM_BIN" export --hf "$WORK/base" "$WORK/hf"

# a fine-tuning config with no model section: the model comes from the source
ft_config() {
  cat > "$1" <<YAML
run:
  dir: $2
data:
  train: $WORK/data/train
  val: $WORK/data/val
training:
  init_from: $3
  steps: 3
  batch_size: 2
  seq_len: 32
  lr: 1e-3
  warmup: 2
  peak_flops: 1e11
eval:
  every: 0
  batches: 1
checkpoint:
  every: 3
YAML
}
ft_config "$WORK/ft_loom.yaml" "$WORK/ft_loom" "$WORK/base"
ft_config "$WORK/ft_hf.yaml" "$WORK/ft_hf" "$WORK/hf"
expect_ok "init_from a loom checkpoint" "$LOOM_ASAN_BIN" train "$WORK/ft_loom.yaml"
grep -q "initialized from $WORK/base" "$WORK/err.txt" || fail "no 'initialized from' line"
# (the same binary as the run above: loom promises bits per build, level and thread count;
#  loom-asan is another build, -O1: docs/build.md)
expect_ok "init_from a Hugging Face directory" "$LOOM_ASAN_BIN" train "$WORK/ft_hf.yaml"
losses "$WORK/ft_loom" > "$WORK/l1"; losses "$WORK/ft_hf" > "$WORK/l2"
diff "$WORK/l1" "$WORK/l2" || fail "the two sources (same weights) gave different losses"
pass "loom checkpoint and its Hugging Face export start identical runs (bit for bit)"
grep -q "d_model: 32" "$WORK/ft_loom/config.yaml" && grep -q "flavor: llama" "$WORK/ft_loom/config.yaml" \
  && grep -q "n_kv_head: 2" "$WORK/ft_loom/config.yaml" || fail "model.* not taken from the source"
pass "the resolved config has the source's model keys"

# the weights were loaded, not drawn: the first loss is the trained model's, far below a fresh one
make_config "$WORK" "$WORK/fresh.yaml" "$WORK/fresh"
"$LOOM_BIN" train "$WORK/fresh.yaml" --set training.steps=1 --set checkpoint.every=0 2>/dev/null
python3 - "$WORK" <<'PY' || fail "first loss of init_from run not the trained model's"
import json, sys
w = sys.argv[1]
first = lambda d: json.loads(open(f"{w}/{d}/metrics.jsonl").readline())
base_last = [json.loads(l) for l in open(f"{w}/base/metrics.jsonl")][-1]["loss"]
ft, fresh = first("ft_loom"), first("fresh")
print(f"fresh step 1 {fresh['loss']:.4f}, base step 30 {base_last:.4f}, init_from step 1 {ft['loss']:.4f}")
assert ft["loss"] < fresh["loss"] - 1.0 and abs(ft["loss"] - base_last) < 0.5
# fresh schedule: step 1 is the first warmup step (lr/warmup), not the base's decayed lr
assert abs(ft["lr"] - 1e-3 / 2) < 1e-9, ft["lr"]
PY
pass "first loss is the trained model's; the schedule starts over"
python3 - "$WORK/ft_loom/ckpt/step_0000003/trainer_state.json" <<'PY' || fail "optimizer state not fresh"
import json, sys
s = json.load(open(sys.argv[1])); assert s["optimizer_step"] == 3 and s["step"] == 3, s
PY
pass "optimizer steps count from 0"

# the weights arrive exactly: with a negligible lr the step-1 checkpoint equals the source
ft_config "$WORK/exact.yaml" "$WORK/exact" "$WORK/hf"
"$LOOM_BIN" train "$WORK/exact.yaml" --set training.steps=1 --set checkpoint.every=1 \
  --set training.lr=1e-30 --set training.weight_decay=0 2>/dev/null || fail "exact run"
python3 - "$WORK/base/ckpt/step_0000030/rank_00000.safetensors" "$WORK/exact/ckpt/step_0000001/rank_00000.safetensors" <<'PY' || fail "loaded weights differ from the source"
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
ps = [k for k in a if k.startswith("param/")]
assert ps and set(ps) == {k for k in b if k.startswith("param/")}
d = max(float(np.abs(a[k] - b[k]).max()) for k in ps)
print("max |source - loaded| =", d); assert d <= 1e-20
PY
pass "loaded parameters equal the source's"

# overrides: compatible ones are taken, shape-changing ones refused naming the key
expect_ok "a compatible override (rope_theta)" "$LOOM_BIN" train "$WORK/ft_loom.yaml" \
  --set run.dir="$WORK/ft_theta" --set model.rope_theta=20000 --set training.steps=1
grep -q "rope_theta: 20000" "$WORK/ft_theta/config.yaml" || fail "override not kept"
expect_fail "a shape-changing override" "model.d_model.*= 64.*init_from.*32.*would not fit" \
  "$LOOM_BIN" train "$WORK/ft_loom.yaml" --set run.dir="$WORK/ft_bad" --set model.d_model=64
expect_fail "a missing source" "init_from" \
  "$LOOM_BIN" train "$WORK/ft_loom.yaml" --set run.dir="$WORK/ft_bad2" --set training.init_from="$WORK/nope"
# a source trained with another tokenizer than the dataset's
cp -r "$WORK/hf" "$WORK/hf_bpe"
"$LOOM_BIN" tokenizer train --vocab-size 258 --out "$WORK/hf_bpe/tokenizer.json" "$WORK/corpus/part0.txt" >/dev/null 2>&1
expect_fail "a source with another tokenizer" "tokenizer.*data.train" \
  "$LOOM_BIN" train "$WORK/ft_hf.yaml" --set run.dir="$WORK/ft_bad3" --set training.init_from="$WORK/hf_bpe"
echo "all init_from tests passed"
