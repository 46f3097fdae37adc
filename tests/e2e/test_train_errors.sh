# Bad input to `loom train` / `loom generate`: each a non-zero exit and a message naming the
# file and the problem; nothing already written is lost. Runs the ASan/UBSan binary.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/ok.yaml" "$WORK/run"
L=$LOOM_ASAN_BIN

printf 'model:\n  flavor: gpt2\n  d_model: [1, 2\ntraining:\n  steps: 3\n' > "$WORK/bad.yaml"
expect_fail "malformed YAML names file and line" "bad\.yaml:[0-9]+" "$L" train "$WORK/bad.yaml"

sed 's/  steps: 10/  stpes: 10/' "$WORK/ok.yaml" > "$WORK/unknown.yaml"
expect_fail "unknown key in file" "unknown config key 'training\.stpes'.*unknown\.yaml:[0-9]+" "$L" train "$WORK/unknown.yaml"
expect_fail "unknown key from --set" "unknown config key 'model\.widht'" "$L" train "$WORK/ok.yaml" --set model.widht=3
expect_fail "non-integer value" "training\.steps.*not an integer" "$L" train "$WORK/ok.yaml" --set training.steps=ten
expect_fail "missing config file" "nope\.yaml" "$L" train "$WORK/nope.yaml"
expect_fail "missing data path" "$WORK/missing" "$L" train "$WORK/ok.yaml" --set data.train="$WORK/missing"
expect_fail "heads do not divide d_model" "n_head" "$L" train "$WORK/ok.yaml" --set model.n_head=5
expect_fail "vocabulary smaller than the data" "vocab" "$L" train "$WORK/ok.yaml" --set model.vocab_size=100

# GRPO's keys (docs/finetune.md "GRPO"): each refused naming the key
G="--set finetune.method=grpo --set finetune.template=plain"
expect_fail "grpo without a template" "finetune\.template" "$L" train "$WORK/ok.yaml" --set finetune.method=grpo
expect_fail "grpo: one generation" "finetune\.num_generations" "$L" train "$WORK/ok.yaml" $G --set finetune.num_generations=1
expect_fail "grpo: unknown loss type" "finetune\.loss_type.*dapo or grpo" "$L" train "$WORK/ok.yaml" $G --set finetune.loss_type=bnpo
expect_fail "grpo: unknown reward" "finetune\.rewards.*'score' is not a reward" "$L" train "$WORK/ok.yaml" $G --set "finetune.rewards=[exact, score]"
expect_fail "grpo: weights do not match" "finetune\.reward_weights" "$L" train "$WORK/ok.yaml" $G --set "finetune.reward_weights=[1, 2]"
expect_fail "grpo: regex reward without a pattern" "finetune\.reward\.regex" "$L" train "$WORK/ok.yaml" $G --set "finetune.rewards=[regex]"
expect_fail "grpo: ZeRO 3" "parallel\.zero.*use 0, 1 or 2" "$L" train "$WORK/ok.yaml" $G --set parallel.zero=3
expect_fail "grpo: gradient accumulation" "training\.grad_accum" "$L" train "$WORK/ok.yaml" $G --set training.grad_accum=2

# corrupt data: a truncated shard and a shard with a flipped byte (copies of the dataset)
shard=$(ls "$WORK/data/train"/*.bin | head -1); name=$(basename "$shard")
cp -r "$WORK/data/train" "$WORK/trunc"; truncate -s -100 "$WORK/trunc/$name"
expect_fail "truncated shard" "$name" "$L" train "$WORK/ok.yaml" --set data.train="$WORK/trunc"
cp -r "$WORK/data/train" "$WORK/flip"
python3 - "$WORK/flip/$name" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[4096 + 10] ^= 0x40; open(p, 'wb').write(b)
PY
expect_fail "shard with a flipped byte" "$name" "$L" train "$WORK/ok.yaml" --set data.train="$WORK/flip"

# a checkpoint with a flipped byte: resume refuses it, naming the file; metrics survive
"$LOOM_BIN" train "$WORK/ok.yaml" --set training.steps=5 2>/dev/null
cp "$WORK/run/metrics.jsonl" "$WORK/metrics.before"
python3 - "$WORK/run/ckpt/step_0000005/rank_00000.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0x01; open(p, 'wb').write(b)
PY
expect_fail "checkpoint with a flipped byte (train)" "rank_00000\.safetensors.*SHA-256" "$L" train "$WORK/ok.yaml"
expect_fail "checkpoint with a flipped byte (generate)" "rank_00000\.safetensors.*SHA-256" "$L" generate "$WORK/run" --prompt x
cmp -s "$WORK/run/metrics.jsonl" "$WORK/metrics.before" || fail "a failed resume changed metrics.jsonl"
pass "metrics.jsonl untouched by the failed resume"
expect_fail "generate: bad --tokens" "tokens" "$L" generate "$WORK/run" --tokens 12x
echo "all error tests passed"
