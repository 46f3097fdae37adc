# Gradient accumulation on masked (SFT) data: the step's loss and gradient are the sum over all
# of its valid (assistant) targets divided by their count, across micro-batches and
# data-parallel ranks, so batch 4 x grad_accum 2 trains exactly like batch 8 even when the
# micro-batches hold different numbers of assistant tokens (a mean of per-micro-batch means
# does not: it differed by ~1e-2 relative here). Chat data with `pack: false`, so every window
# is one conversation whose assistant reply is 1 to 60 bytes long: the micro-batches' valid
# counts differ at every step. Checked, 6 steps each, loss and grad norm within 1e-5 of
# batch 8 in one process:
#   batch 4 x accum 2 (full fine-tuning, gpt2), dp 2 x batch 4 x accum 2 (ZeRO 1),
#   dp 2 x batch 8 x accum 1, and LoRA (llama) batch 4 x accum 2 and dp 2 x accum 2 (ZeRO 2).
source "$(dirname "$0")/lib.sh"
MPIRUN="timeout 250 mpirun --oversubscribe -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"

python3 - "$WORK/conv.jsonl" <<'PY'
import json, random, sys
random.seed(11)
words = "red blue green amber north south seven twelve river stone".split()
with open(sys.argv[1], "w") as f:
    for i in range(120):
        user = " ".join(random.choice(words) for _ in range(random.randint(1, 4)))
        reply = " ".join(random.choice(words) for _ in range(random.randint(1, 10)))[:random.randint(1, 60)]
        f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                         {"role": "assistant", "content": reply}]}) + "\n")
PY
cat > "$WORK/recipe.yaml" <<YAML
name: sft
sources:
  - name: chat
    kind: chat
    path: $WORK/conv.jsonl
    pack: false
tokenizer: byte
seq_len: 64
val_fraction: 0
output: $WORK/data
shard_tokens: 12800
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "data build"; }

# cfg NAME FLAVOR [LORA]: a tiny model over the chat data, run dir $WORK/NAME
cfg() {
  local lora="" kvh=4
  [ "$2" = llama ] && kvh=2
  [ "${3:-}" = lora ] && lora="finetune: {lora: {rank: 4, alpha: 8, targets: [q, v, o, down]}}"
  cat > "$WORK/$1.yaml" <<YAML
run: {dir: $WORK/$1}
data: {train: $WORK/data/train}
model: {flavor: $2, vocab_size: 256, d_model: 32, n_layer: 2, n_head: 4, n_kv_head: $kvh}
training: {steps: 6, schedule_steps: 6, seq_len: 64, lr: 1e-2, warmup: 1, grad_clip: 1.0, peak_flops: 1e11}
eval: {every: 0}
checkpoint: {every: 0}
$lora
YAML
}

# same NAME REF WHAT: NAME's losses and grad norms within 1e-5 of REF's
same() {
  compare_losses "$WORK/$2" "$WORK/$1" 1e-5 || fail "$3: loss differs from batch 8"
  compare_losses "$WORK/$2" "$WORK/$1" 1e-5 1 grad_norm || fail "$3: gradient norm differs from batch 8"
  pass "$3 == batch 8 in one process (6 steps)"
}

train1() { # NAME FLAVOR LORA SETTINGS...: one process
  local name=$1 flavor=$2 lora=$3; shift 3
  cfg "$name" "$flavor" "$lora"
  "$LOOM_BIN" train "$WORK/$name.yaml" "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$name"; }
}
train2() { # NAME FLAVOR LORA SETTINGS...: mpirun -np 2
  local name=$1 flavor=$2 lora=$3; shift 3
  cfg "$name" "$flavor" "$lora"
  $MPIRUN -np 2 "$LOOM_BIN" train "$WORK/$name.yaml" --set parallel.dp=2 "$@" >"$WORK/log" 2>&1 \
    || { cat "$WORK/log"; fail "$name"; }
}

train1 full_b8 gpt2 no --set training.batch_size=8
train1 full_b4a2 gpt2 no --set training.batch_size=4 --set training.grad_accum=2
same full_b4a2 full_b8 "gpt2, batch 4 x grad_accum 2"
train2 full_dp2_b4a2 gpt2 no --set training.batch_size=4 --set training.grad_accum=2 --set parallel.zero=1
same full_dp2_b4a2 full_b8 "gpt2, dp 2 (ZeRO 1), batch 4 x grad_accum 2"
train2 full_dp2_b8 gpt2 no --set training.batch_size=8
same full_dp2_b8 full_b8 "gpt2, dp 2, batch 8"

train1 lora_b8 llama lora --set training.batch_size=8
train1 lora_b4a2 llama lora --set training.batch_size=4 --set training.grad_accum=2
same lora_b4a2 lora_b8 "LoRA (llama), batch 4 x grad_accum 2"
train2 lora_dp2_b4a2 llama lora --set training.batch_size=4 --set training.grad_accum=2 --set parallel.zero=2
same lora_dp2_b4a2 lora_b8 "LoRA (llama), dp 2 (ZeRO 2), batch 4 x grad_accum 2"
