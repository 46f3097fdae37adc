# LoRA adapter dropout (finetune.lora.dropout) in `loom train`: the masks are a pure function
# of (training.seed, step, layer, target, row of the step's batch, position, feature), so
#   * 4 steps + resume to 8 equal 8 uninterrupted steps exactly (losses and grad norms);
#   * dp 2 (ZeRO 1), cp 2 and batch 4 x grad_accum 2 follow batch 8 in one process within 1e-5;
#   * model.recompute full (the forward re-run before backward draws the same masks) too;
#   * it is applied: the grad norms differ from dropout 0's;
#   * loom export --hf writes it as PEFT's lora_dropout; a p outside [0, 1) and dropout with
#     parallel.microbatches are refused naming the key.
#   * LoRA in bf16 (dropout 0) resumes bit for bit; dropout with bf16 is refused.
# The numerics against PEFT with the same mask: tests/reference/test_lora_dropout.py.
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 250 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"

python3 - "$WORK/conv.jsonl" <<'PY'
import json, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for i in range(80):
        a, b = random.randint(0, 99), random.randint(0, 99)
        msgs = [{"role": "user", "content": f"add {a} and {b}"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}]
        f.write(json.dumps({"messages": msgs}) + "\n")
PY
cat > "$WORK/recipe.yaml" <<YAML
name: lora-dropout
sources:
  - {name: calc, kind: chat, path: $WORK/conv.jsonl}
tokenizer: byte
seq_len: 64
val_fraction: 0
output: $WORK/data
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "data build"; }

# cfg NAME DROPOUT: a tiny llama with LoRA on every target, run dir $WORK/NAME
cfg() {
  cat > "$WORK/$1.yaml" <<YAML
run: {dir: $WORK/$1}
data: {train: $WORK/data/train}
model: {flavor: llama, vocab_size: 256, d_model: 32, n_layer: 2, n_head: 4, n_kv_head: 2, d_ff: 64}
training: {steps: 8, schedule_steps: 8, batch_size: 8, seq_len: 64, lr: 1e-2, warmup: 1, peak_flops: 1e11}
eval: {every: 0}
checkpoint: {every: 0}
finetune: {lora: {rank: 4, alpha: 8, dropout: $2, targets: [q, k, v, o, gate, up, down]}}
YAML
}
train() { # NAME DROPOUT SETTINGS...
  local name=$1 p=$2; shift 2
  cfg "$name" "$p"
  "$LOOM_BIN" train "$WORK/$name.yaml" "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name"; }
}
metrics() { python3 -c "
import json, sys
print([(r['step'], r['loss'], r['grad_norm']) for r in map(json.loads, open(sys.argv[1] + '/metrics.jsonl'))])" "$WORK/$1"; }

train a 0.2
train b 0.2 --set training.steps=4 --set checkpoint.every=4
train b 0.2 --set checkpoint.every=4
[ "$(metrics a)" = "$(metrics b)" ] || { metrics a; metrics b; fail "resume: 4 + 4 steps differ from 8"; }
pass "dropout 0.2: 4 steps + resume to 8 == 8 steps, bit for bit"

train none 0
python3 - "$WORK" <<'PY' || fail "dropout has no effect"
import json, sys
g = {n: [r["grad_norm"] for r in map(json.loads, open(f"{sys.argv[1]}/{n}/metrics.jsonl"))] for n in ("a", "none")}
d0 = max(abs(x - y) / y for x, y in zip(g["a"], g["none"]))
print(f"grad norms vs dropout 0: max relative difference {d0:.3g}")
sys.exit(0 if d0 > 1e-3 else 1)
PY
pass "dropout 0.2 changes the gradients (vs dropout 0)"

train acc 0.2 --set training.batch_size=4 --set training.grad_accum=2
compare_losses "$WORK/a" "$WORK/acc" 1e-5 || fail "batch 4 x grad_accum 2 differs"
compare_losses "$WORK/a" "$WORK/acc" 1e-5 1 grad_norm || fail "batch 4 x grad_accum 2: grad norm differs"
pass "dropout 0.2: batch 4 x grad_accum 2 == batch 8 (masks keyed by the row of the step's batch)"
train rec 0.2 --set model.recompute=full
compare_losses "$WORK/a" "$WORK/rec" 1e-5 1 grad_norm || fail "model.recompute full differs"
pass "dropout 0.2 with model.recompute full == without"

cfg dp 0.2
$MPIRUN -np 2 "$LOOM_BIN" train "$WORK/dp.yaml" --set parallel.dp=2 --set parallel.zero=1 >"$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "dp 2"; }
compare_losses "$WORK/a" "$WORK/dp" 1e-5 || fail "dp 2 differs"
compare_losses "$WORK/a" "$WORK/dp" 1e-5 1 grad_norm || fail "dp 2: grad norm differs"
pass "dropout 0.2: dp 2 (ZeRO 1) == one process"
cfg cp 0.2
$MPIRUN -np 2 "$LOOM_BIN" train "$WORK/cp.yaml" --set parallel.cp=2 >"$WORK/log" 2>&1 \
  || { cat "$WORK/log"; fail "cp 2"; }
compare_losses "$WORK/a" "$WORK/cp" 1e-5 || fail "cp 2 differs"
compare_losses "$WORK/a" "$WORK/cp" 1e-5 1 grad_norm || fail "cp 2: grad norm differs"
pass "dropout 0.2: cp 2 (each rank two chunks of every row; the adapters' gradients summed over dp x cp) == one process"

"$LOOM_BIN" export --hf "$WORK/b" "$WORK/hf" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "export"; }
python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if abs(c['lora_dropout'] - 0.2) < 1e-7 else 1)" "$WORK/hf/adapter_config.json" \
  || fail "adapter_config.json lora_dropout is not 0.2"
pass "export: adapter_config.json has lora_dropout 0.2"

cfg bad 1.5
expect_fail "dropout 1.5 refused" "finetune.lora.dropout.*1.5.*\[0, 1\)" "$LOOM_BIN" train "$WORK/bad.yaml"
cfg mb 0.2
expect_fail "dropout with parallel.microbatches refused" "finetune.lora.dropout.*microbatches" \
  "$LOOM_BIN" train "$WORK/mb.yaml" --set parallel.microbatches=2

# training.precision bf16 with LoRA (docs/training.md "Precision"): the adapters' bf16 copies
# refreshed after a load, so 4 steps + resume = 8 steps bit for bit; dropout is refused there
train h16 0 --set training.precision=bf16
train r16 0 --set training.precision=bf16 --set training.steps=4 --set checkpoint.every=4
train r16 0 --set training.precision=bf16 --set checkpoint.every=4
[ "$(metrics h16)" = "$(metrics r16)" ] || { metrics h16; metrics r16; fail "bf16 LoRA resume differs"; }
[ "$(metrics h16)" != "$(metrics none)" ] || fail "bf16 LoRA gave the fp32 run's metrics"
pass "LoRA in bf16: 4 steps + resume to 8 == 8 steps, bit for bit (and not the fp32 run)"
cfg d16 0.2
expect_fail "dropout with training.precision bf16 refused" "finetune.lora.dropout.*bf16" \
  "$LOOM_BIN" train "$WORK/d16.yaml" --set training.precision=bf16
