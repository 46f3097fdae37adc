# GRPO (finetune.method grpo) under data parallelism: the prompts of a step spread over the
# ranks (each keeps its groups), every completion's sampling stream keyed by its global index,
# the loss normalized over the global batch, so dp 2 (ZeRO 1) follows one process step for
# step: loss, gradient norm, reward and KL within 1e-6 (observed: equal to the last bits or
# so), with the full model and with LoRA (the reference then the adapters off). A tiny random
# llama, 4 steps of 4 prompts x 4 completions, num_iterations 2 (ratios != 1 on the second
# update of each batch), beta 0.05, a length reward (completions of varied length give the
# groups non-zero advantages). And resume inside a rollout batch: 3 + 1 steps == 4 bit for bit,
# a dp 2 checkpoint of step 3 resumed on one process within 1e-6. About 10 s. On cpu-guard (scripts/ci_guard.sh: LOOM_BACKEND set)
# the LoRA pair alone, for time: the full-model pair is the same GRPO code without adapters.
source "$(dirname "$0")/lib.sh"
H="$LOOM_SRC/tests/e2e/tooluse.py"
python3 "$H" gen "$WORK/calc" 200 10 1
cat > "$WORK/tpl.json" <<'JSON'
{"bos": "", "system": "S:{content}\n", "user": "U:{content}\n", "assistant": "A:{content}\n",
 "tool": "T:{content}\n", "tool_call": "{content}", "tool_call_separator": "\n"}
JSON
cat > "$WORK/recipe.yaml" <<YAML
name: calc
sources:
  - {name: calc, kind: chat, path: $WORK/calc/train.jsonl, template: $WORK/tpl.json, pack: false}
tokenizer: byte
seq_len: 96
shard_tokens: 9600
val_fraction: 0
output: $WORK/data
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "data build"; }
cat > "$WORK/g.yaml" <<YAML
data: {train: $WORK/data/train}
model: {flavor: llama, vocab_size: 256, d_model: 32, n_layer: 2, n_head: 4, n_kv_head: 2, d_ff: 64}
finetune:
  method: grpo
  template: $WORK/tpl.json
  num_generations: 4
  max_completion_tokens: 24
  rewards: [tool_call, length]
  reward_weights: [1, 0.5]
  reward: {length_max: 8}
  beta: 0.05
  num_iterations: 2
training: {steps: 4, batch_size: 4, seq_len: 96, lr: 3e-3, warmup: 0, schedule: constant, seed: 3, peak_flops: 1e11}
eval: {every: 0}
checkpoint: {every: 0}
YAML
run1() { "$LOOM_BIN" train "$WORK/g.yaml" --set run.dir="$WORK/$1" "${@:2}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$1"; }; }
same() { # REF RUN [TOL]: every step's loss, grad_norm, reward, kl within TOL (default 1e-6;
         # relative, or absolute near 0)
  python3 - "$WORK/$1" "$WORK/$2" "${3:-1e-6}" <<'PY'
import json, sys
tol = float(sys.argv[3])
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3])
assert len(a) == len(b) == 4, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / max(1.0, abs(x[k])) for x, y in zip(a, b)
            for k in ("loss", "grad_norm", "reward", "kl"))
moved = any(abs(x["loss"]) > 0 for x in a) and any(x["grad_norm"] > 0 for x in a)
print(f"{sys.argv[2]}: worst difference {worst:.2e} over 4 steps; losses {[x['loss'] for x in a]}")
sys.exit(0 if worst <= tol and moved else 1)
PY
}
if [ "${LOOM_BACKEND:-}" != cpu-guard ]; then
    run1 one
    run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/g.yaml" --set run.dir="$WORK/dp2" --set parallel.dp=2 --set parallel.zero=1
    [ $RC -eq 0 ] || { cat "$WORK/out"; fail "dp 2"; }
    same one dp2 || fail "GRPO at dp 2 (ZeRO 1) differs from one process"
    pass "GRPO: dp 2 (ZeRO 1) == one process"
    # resume inside a rollout batch (num_iterations 2): the checkpoint of step 3 holds step 3's
    # batch (grpo_rollouts.safetensors; step 2's, at a batch boundary, none), so the resumed
    # run takes step 4 on it as the run that was not stopped does: bit for bit on one process,
    # and from 2 ranks' checkpoint onto one process within dp's 1e-6
    run1 r3 --set training.steps=3 --set checkpoint.every=1
    [ -f "$WORK/r3/ckpt/step_0000003/grpo_rollouts.safetensors" ] &&
        [ -d "$WORK/r3/ckpt/step_0000002" ] && [ ! -f "$WORK/r3/ckpt/step_0000002/grpo_rollouts.safetensors" ] ||
        fail "the rollout batch in the checkpoints: $(ls "$WORK"/r3/ckpt/*)"
    if "$LOOM_BIN" train "$WORK/g.yaml" --set run.dir="$WORK/r3" --set finetune.num_generations=2 >"$WORK/log" 2>&1 ||
        ! grep -q "grpo_rollouts.safetensors: a batch of 4 completions per prompt, but finetune.num_generations is 2" "$WORK/log"; then
        cat "$WORK/log"; fail "a rollout batch of other settings is refused naming the file"
    fi
    run1 r3
    same one r3 0 || fail "GRPO resumed inside a rollout batch differs from the run that was not stopped"
    run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/g.yaml" --set run.dir="$WORK/x3" --set parallel.dp=2 --set parallel.zero=1 --set training.steps=3 --set checkpoint.every=3
    [ $RC -eq 0 ] || { cat "$WORK/out"; fail "dp 2, 3 steps"; }
    run1 x3
    same one x3 || fail "GRPO resumed on one process from a dp 2 checkpoint inside a rollout batch differs"
    pass "GRPO: resumed inside a rollout batch == not stopped (bit for bit; from dp 2 onto 1 within 1e-6); other settings refused"
fi
run1 lora --set finetune.lora.rank=4
run_mpi 2 "$WORK/out" "$LOOM_BIN" train "$WORK/g.yaml" --set run.dir="$WORK/dp2lora" --set parallel.dp=2 --set finetune.lora.rank=4
[ $RC -eq 0 ] || { cat "$WORK/out"; fail "dp 2 LoRA"; }
same lora dp2lora || fail "GRPO with LoRA at dp 2 differs from one process"
pass "GRPO with LoRA: dp 2 == one process"
echo "all GRPO dp tests passed"
