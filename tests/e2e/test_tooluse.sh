# End to end tool use: a tiny byte-level Llama, pretrained briefly on unrelated text (random
# init), fine-tuned (training.init_from) on generated calculator conversations (kind: chat with a
# short template file, loss mask on the assistant's tool call), must then emit a well-formed
# call with the right tool AND both arguments on held-out prompts whose numbers never occur in
# the fine-tuning data (tests/e2e/tooluse.py): TOOL_MIN well-formed calls of the right tool and
# FT_MIN with both arguments exact at least, against BASE_MAX at most for the base model on the
# same prompts (the margins below). The user path throughout: loom data build, loom
# train, loom generate --chat --template FILE --prompts, the calls parsed by Python's json.
source "$(dirname "$0")/lib.sh"
H="$LOOM_SRC/tests/e2e/tooluse.py"
# The thresholds, from this test's own runs at each kernel level (LOOM_ISA with oneDNN and
# OpenBLAS pinned alike, as scripts/ci_levels.sh runs it) and data/training seed (TOOLUSE_SEED),
# OMP_NUM_THREADS=2; "tool": replies that are a well-formed call of the right tool, "correct":
# those with both arguments exact too:
#   level    seed  correct  tool  final loss
#   avx512   1     97       -     0.0004   (2026-11-30, before "tool" was counted)
#   avx512   2     30       100   0.0192
#   avx2     1     22       -     0.0139   (bit for bit what an AMD Zen 3 gave)
#   avx2     2     27       100   0.0231
#   avx2     1     32       100   0.0112   (2026-12-02, after the avx2 flash attention kernels)
#   x86-64   1     39       99    0.0115
#   (also in docs/finetune.md, "Margins")
# Every run learns the format and the tool (99-100 of 100); copying the unseen numbers exactly
# is learned more or less far by the end (the misses transpose digits: 602 for 620), so the bar
# for exact calls sits 12 below the lowest figure measured, and the one for the right tool 9
# below. The base makes 0 of either.
N_HELD=100 FT_MIN=${FT_MIN:-10} TOOL_MIN=${TOOL_MIN:-90} BASE_MAX=5
GRPO_TOOL_MIN=${GRPO_TOOL_MIN:-80} # after GRPO (from the early SFT checkpoint): the table below
PT_STEPS=${PT_STEPS:-400} FT_STEPS=${FT_STEPS:-1500}
GRPO_FROM=${GRPO_FROM:-500} GRPO_STEPS=${GRPO_STEPS:-40} GRPO_RISE=${GRPO_RISE:-0.03}
SEED=${TOOLUSE_SEED:-1} # the data's and training's seeds (the margins were measured over several)
t_start=$(date +%s)

python3 "$H" gen "$WORK/calc" 40000 $N_HELD "$SEED"
python3 "$H" text "$WORK/text" 20000 $((SEED + 4))
# a short template: the call's JSON is most of what the assistant is trained on
cat > "$WORK/tpl.json" <<'JSON'
{"bos": "", "system": "S:{content}\n", "user": "U:{content}\n", "assistant": "A:{content}\n",
 "tool": "T:{content}\n", "tool_call": "{content}", "tool_call_separator": "\n"}
JSON
cat > "$WORK/text.yaml" <<YAML
name: text
sources:
  - name: text
    kind: text
    path: $WORK/text/text.txt
    split: "\n%\n"
tokenizer: byte
seq_len: 96
output: $WORK/textdata
YAML
cat > "$WORK/calc.yaml" <<YAML
name: calc
sources:
  - name: calc
    kind: chat
    path: $WORK/calc/train.jsonl
    template: $WORK/tpl.json
    pack: false
tokenizer: byte
seq_len: 96
shard_tokens: 960000
output: $WORK/calcdata
YAML
expect_ok "build the pretraining text" "$LOOM_BIN" data build "$WORK/text.yaml"
expect_ok "build the tool-use conversations (kind: chat, template file)" "$LOOM_BIN" data build "$WORK/calc.yaml"

# run_yaml NAME DATA STEPS MODEL_SECTION TRAINING_LINE: a training run's YAML (one schedule for both)
run_yaml() {
  cat <<YAML
run:
  dir: $WORK/$1
data:
  train: $WORK/$2/train
$4
training:
  $5
  steps: $3
  batch_size: 32
  seq_len: 96
  lr: 3e-3
  warmup: 50
  schedule: cosine
  weight_decay: 0
  grad_clip: 1.0
  seed: $SEED
eval:
  every: 0
checkpoint:
  every: ${6:-$3}
YAML
}
# the base: a byte Llama from random init; the fine-tuning run has no model section (the base's)
run_yaml base textdata "$PT_STEPS" "model:
  flavor: llama
  vocab_size: 256
  d_model: 128
  n_layer: 2
  n_head: 4
  n_kv_head: 4
  d_ff: 256" "" > "$WORK/base.yaml"
# (a checkpoint every GRPO_FROM steps: GRPO starts from the early one, below)
run_yaml ft calcdata "$FT_STEPS" "" "init_from: $WORK/base" "$GRPO_FROM" > "$WORK/ft.yaml"

# correct CKPT NAME: greedy replies to the held-out prompts -> the number of correct calls
correct() {
  "$LOOM_BIN" generate "$1" --chat --template "$WORK/tpl.json" --prompts "$WORK/calc/heldout.txt" \
    --temperature 0 --tokens 64 > "$WORK/$2.jsonl" 2>"$WORK/$2.err" \
    || { cat "$WORK/$2.err" >&2; fail "generate ($2)"; }
  python3 "$H" score "$WORK/$2.jsonl" "$WORK/calc/expected.jsonl" > "$WORK/$2.score" \
    || { cat "$WORK/$2.score" >&2; fail "score ($2)"; }
  sed -n 's/^tool \([0-9]*\) of .*/\1/p' "$WORK/$2.score" > "$WORK/$2.tool"
  sed -n 's/^correct \([0-9]*\) of .*/\1/p' "$WORK/$2.score"
}

t0=$(date +%s)
expect_ok "pretrain the base ($PT_STEPS steps of text, random init)" "$LOOM_BIN" train "$WORK/base.yaml"
t1=$(date +%s)
base=$(correct "$WORK/base" base)
base_tool=$(cat "$WORK/base.tool")
cat "$WORK/base.score"
expect_ok "fine-tune it on the tool calls ($FT_STEPS steps, init_from)" "$LOOM_BIN" train "$WORK/ft.yaml"
grep -q "initialized from $WORK/base" "$WORK/err.txt" || fail "the fine-tuning did not start from the base"
t2=$(date +%s)
ft=$(correct "$WORK/ft" ft)
ft_tool=$(cat "$WORK/ft.tool")
cat "$WORK/ft.score"
t3=$(date +%s)
last_loss=$(tail -n 1 "$WORK/ft/metrics.jsonl" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["loss"], 4))')
echo "tool use: base $base of $N_HELD correct calls ($base_tool of the right tool), fine-tuned $ft of $N_HELD ($ft_tool)" \
     "(pretrain ${PT_STEPS} steps $((t1 - t0)) s, fine-tune ${FT_STEPS} steps $((t2 - t1)) s, final loss $last_loss;" \
     "whole test $((t3 - t_start)) s, OMP_NUM_THREADS=$OMP_NUM_THREADS, load $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$base" -le $BASE_MAX ] && [ "$base_tool" -le $BASE_MAX ] || fail "the base model made $base correct calls, $base_tool of the right tool (at most $BASE_MAX expected)"
pass "base model: $base of $N_HELD correct calls, $base_tool of the right tool (<= $BASE_MAX)"
[ "$ft_tool" -ge "$TOOL_MIN" ] || fail "the fine-tuned model made $ft_tool well-formed calls of the right tool of $N_HELD (at least $TOOL_MIN expected)"
pass "fine-tuned model: $ft_tool of $N_HELD well-formed calls of the right tool (>= $TOOL_MIN)"
[ "$ft" -ge "$FT_MIN" ] || fail "the fine-tuned model made $ft correct calls of $N_HELD (at least $FT_MIN expected)"
pass "fine-tuned model: $ft of $N_HELD correct calls, both arguments exact (>= $FT_MIN)"

# GRPO (finetune.method grpo, docs/finetune.md "GRPO") from the SFT run's early checkpoint at
# step GRPO_FROM, on the same conversations (kind: chat, pack: false: the call is each prompt's
# reference), the exact-call reward (tool_call: the parsed call equals the reference as JSON),
# 8 prompts x 8 completions a step, GRPO_STEPS steps. Checked: the rollouts' exact-call rate
# (pass_rate, on the training prompts, sampled at temperature 1) rises by GRPO_RISE at least
# from the first 10 steps to the last 10, the held-out replies keep the format (GRPO_TOOL_MIN
# calls of the right tool: 9 below the fewest measured, avx2's 89; the SFT model's TOOL_MIN
# would leave no margin there), the sampler's log-probs are the trainer's. Measured (hand runs
# 2026-12-02, OMP_NUM_THREADS=2, a machine loaded 5-10x over its 2 cores):
#   level    seed  pass rate, first -> last 10 of 40 steps  held-out exact calls, step 500 -> GRPO
#   avx512   1     0.342 -> 0.442                             11 -> 8 (30 steps: 17, 60: 17)
#   avx2     1     0.678 -> 0.750                             68 -> 82
#   avx2     1     0.139 -> 0.209                             3 -> 3, 89 of the right tool
#                  (2026-12-02, after the avx2 flash attention kernels changed its bits)
#   (avx512, 16 prompts a step: 0.370 -> 0.482, held-out 11 -> 20)
# The held-out exact calls move by +-10 from one checkpoint to the next at this budget (the
# skill is copying unseen numbers, which the SFT run learns slowly too), so they are printed,
# not held to a gain; the issue's bar (>= 90 of 100) is out of reach here (docs/finetune.md).
# GRPO_RISE 0.03 sits 0.04 below the smallest rise measured. CI runs this test at avx512 only.
# Time (this part, measured 2026-12-02 at avx512, OMP_NUM_THREADS=2): the 40 steps 62 s wall
# (rollouts 38 s, updates 22 s) in a whole run of this test at load 4.3-4.9 on 2 cores (that
# run: pretrain 157 s, fine-tune 568 s); 117 s of CPU for the two evaluations and the 40 steps;
# the tool environment's 2 steps a few seconds more.
sft_early=$(correct "$WORK/ft/ckpt/step_$(printf %07d "$GRPO_FROM")" early)
cat > "$WORK/grpo.yaml" <<YAML
run: {dir: $WORK/grpo}
data: {train: $WORK/calcdata/train}
finetune:
  method: grpo
  template: $WORK/tpl.json
  num_generations: 8
  max_completion_tokens: 64
  rewards: [tool_call]
training:
  init_from: $WORK/ft/ckpt/step_$(printf %07d "$GRPO_FROM")
  steps: $GRPO_STEPS
  batch_size: 8
  seq_len: 96
  lr: 3e-4
  warmup: 0
  schedule: constant
  weight_decay: 0
  grad_clip: 1.0
  seed: $SEED
eval: {every: 0}
checkpoint: {every: $GRPO_STEPS}
YAML
t4=$(date +%s)
expect_ok "GRPO from the SFT checkpoint at step $GRPO_FROM ($GRPO_STEPS steps, exact-call reward)" "$LOOM_BIN" train "$WORK/grpo.yaml"
t5=$(date +%s)
grpo=$(correct "$WORK/grpo" grpo)
python3 - "$WORK/grpo/metrics.jsonl" "$GRPO_RISE" <<'PY' || fail "GRPO's metrics and its rise"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
need = ["reward", "reward_std", "rewards/tool_call/mean", "pass_rate", "completions/mean_length",
        "completions/max_length", "clip_ratio/region_mean", "sampling/logp_diff_max", "rollout_s",
        "update_s"]
missing = [k for k in need if k not in rows[-1]]
assert not missing, f"metrics.jsonl lacks {missing}"
# the rollouts decode the weights being trained: the sampler's log-probs are the trainer's
assert all(r["sampling/logp_diff_max"] < 1e-3 for r in rows), [r["sampling/logp_diff_max"] for r in rows]
first, last = rows[:10], rows[-10:]
mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
rise = float(sys.argv[2])
print("GRPO: pass rate %.3f -> %.3f (first and last 10 steps), rollout %.1f s, update %.1f s in all"
      % (mean(first, "pass_rate"), mean(last, "pass_rate"), sum(r["rollout_s"] for r in rows),
         sum(r["update_s"] for r in rows)))
assert mean(last, "pass_rate") >= mean(first, "pass_rate") + rise, f"the pass rate rose by less than {rise}"
PY
grpo_tool=$(cat "$WORK/grpo.tool")
echo "GRPO: held-out exact calls $sft_early (SFT step $GRPO_FROM) -> $grpo after $GRPO_STEPS GRPO steps, $grpo_tool of the right tool ($((t5 - t4)) s, load $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$grpo_tool" -ge "$GRPO_TOOL_MIN" ] || fail "after GRPO $grpo_tool held-out replies are calls of the right tool (at least $GRPO_TOOL_MIN expected)"
pass "GRPO: the rollouts' exact-call rate rose by $GRPO_RISE at least; held-out: $grpo_tool right-tool calls (>= $GRPO_TOOL_MIN), $grpo exact (from $sft_early)"

# a multi-turn tool environment (finetune.env): the model calls the calculator
# (tooluse.py calc), reads its answer in a tool message and replies; the reward is on that
# reply. Checked on the rows the trainer builds (LOOM_TEST_GRPO_DUMP): the tool message's
# tokens are masked out of the loss, the generated tokens around it are trained on.
python3 "$H" envdata "$WORK/env" 400 "$SEED"
sed -e "s#$WORK/calc/train.jsonl#$WORK/env/env.jsonl#" -e "s#output: $WORK/calcdata#output: $WORK/envdata#" \
    -e "s/shard_tokens: 960000/shard_tokens: 9600/" "$WORK/calc.yaml" > "$WORK/env.yaml"
expect_ok "build the multi-turn conversations" "$LOOM_BIN" data build "$WORK/env.yaml"
cat > "$WORK/genv.yaml" <<YAML
run: {dir: $WORK/genv}
data: {train: $WORK/envdata/train}
finetune:
  method: grpo
  template: $WORK/tpl.json
  num_generations: 4
  max_completion_tokens: 64
  rewards: [exact]
  env: {command: [python3, "$H", calc], max_turns: 1}
training:
  init_from: $WORK/ft/ckpt/step_$(printf %07d "$GRPO_FROM")
  steps: 2
  batch_size: 4
  seq_len: 96
  lr: 3e-4
  warmup: 0
  schedule: constant
  seed: $SEED
eval: {every: 0}
YAML
LOOM_TEST_GRPO_DUMP="$WORK/genv.dump" expect_ok "GRPO with a tool environment (2 steps)" "$LOOM_BIN" train "$WORK/genv.yaml"
masked=$(python3 "$H" checkdump "$WORK/genv.dump") || { echo "$masked" >&2; fail "the tool messages are not masked out"; }
calls=$(tail -n 1 "$WORK/genv/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tools/calls_mean"])')
echo "tool environment: $masked, tools/calls_mean $calls"
[ "${masked//[^0-9]/}" -ge 4 ] || fail "too few rows called the tool ($masked)"
pass "tool environment: the calls ran, their tool messages masked out of the loss ($masked)"

# the fine-tuned model served to an agent: the openai client's tool-calling loop
# (tests/e2e/tools_client.py: tools in, message.tool_calls out, streamed and not, tool_choice
# forms, malformed definitions). The template has no tools block: the model knows its tools
# from fine-tuning, and its prompts are the ones it was trained on. At least TOOL_MIN% of the
# first 20 held-out prompts must come back as a call of the right tool.
[ -n "${KEEP_WORK:-}" ] && echo "work: $WORK" && trap - EXIT
start_server "$WORK/port" "$WORK/serve.log" "$LOOM_BIN" serve "$WORK/ft" --template "$WORK/tpl.json" \
  --port 0 --port-file "$WORK/port" --model-id calc
python3 "$LOOM_SRC/tests/e2e/tools_client.py" "$(cat "$WORK/port")" calc "$WORK/calc/heldout.txt" \
  "$WORK/calc/expected.jsonl" 20 $((TOOL_MIN * 20 / 100)) || { cat "$WORK/serve.log" >&2; fail "the tool-calling client"; }
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || fail "loom serve did not exit 0 on SIGTERM"
pass "loom serve: the openai client's tool-calling loop on the fine-tuned model"
echo "all tool-use tests passed"
