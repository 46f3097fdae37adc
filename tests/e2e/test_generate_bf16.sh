#!/usr/bin/env bash
# --weights bf16 (docs/inference.md "Weights in bf16"), through the CLI (ASan build): generate
# runs batched with bf16 weights for both flavors, each prompt's greedy output equal to that
# prompt generated alone with bf16 weights, and --stats names the weights and the resident
# memory (the memory drop is checked in tests/reference/test_infer_bf16.py); bad values and combinations are errors naming the option; serve answers a
# completion with bf16 weights; synth's generator.weights: bf16 runs, is part of the cache key
# (an unchanged rerun generates nothing, the same pipeline with fp32 generates again), and a bad
# value is an error naming the key. (The numerics against PyTorch: tests/reference/test_infer_bf16.py.)
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"
make_dataset "$WORK"
printf 'the quick\nbrown fox jumps\na\nlazy dog over the\n' > prompts.txt
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/run_$flavor"
  expect_ok "train ($flavor)" "$LOOM_BIN" train "$WORK/$flavor.yaml" --set training.steps=5
  R=$WORK/run_$flavor
  expect_ok "generate --weights bf16 ($flavor, batch 4)" "$L" generate "$R" --prompts prompts.txt \
    --tokens 10 --temperature 0 --batch 4 --weights bf16 --format ids --stats
  grep -q "weights bf16; resident memory" "$WORK/err.txt" || fail "no weights line: $(cat "$WORK/err.txt")"
  cp "$WORK/out.txt" batched.jsonl
  n=0
  while IFS= read -r p; do
    printf '%s\n' "$p" > one.txt
    "$LOOM_BIN" generate "$R" --prompts one.txt --tokens 10 --temperature 0 --batch 1 \
      --weights bf16 --format ids > alone.jsonl || fail "$flavor: alone run failed"
    python3 - batched.jsonl alone.jsonl "$n" <<'PY' || fail "$flavor prompt $n: batched differs from alone (bf16)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
alone = json.loads(open(sys.argv[2]).readline())
assert len(rows) == 4 and rows[int(sys.argv[3])]["ids"] == alone["ids"], (rows[int(sys.argv[3])], alone)
PY
    n=$((n + 1))
  done < prompts.txt
  pass "$flavor: every prompt of the bf16 batch equals it alone"
done
expect_fail "--weights fp16" "--weights 'fp16': expected fp32, bf16, int8 or int4" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --weights fp16
expect_fail "--weights bf16 --no-kv-cache" "--weights bf16 runs through the KV-cache engine" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --weights bf16 --no-kv-cache
expect_fail "serve --weights int2" "--weights 'int2': expected fp32, bf16, int8 or int4" \
  "$L" serve "$WORK/run_gpt2" --weights int2
# serve with bf16 weights: one completion
serve_completion "serve --weights bf16" "$L" serve "$WORK/run_gpt2" --weights bf16
# synth: generator.weights
printf 'the quick\nbrown fox\nlazy dog\n' > seeds.txt
synth_yaml() { # $1: weights
  cat > p.yaml <<YAML
name: bf16
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}"
template: t
generator:
  kind: local
  checkpoint: $WORK/run_gpt2
  weights: $1
  max_tokens: 6
  temperature: 0
validators:
  - kind: length
max_attempts: 1
output: $WORK/synth.jsonl
summary: $WORK/summary.json
YAML
}
generations() { python3 -c "import json; print(json.load(open('$WORK/summary.json'))['cache']['generations_run'])"; }
synth_yaml bf16
expect_ok "synth generator.weights: bf16" "$L" synth p.yaml --quiet
[ "$(grep -c '"text"' synth.jsonl)" = 3 ] || fail "synth bf16: expected 3 records: $(cat synth.jsonl)"
[ "$(generations)" = 3 ] || fail "synth bf16: generations $(generations), expected 3"
expect_ok "synth bf16 again (cached)" "$L" synth p.yaml --quiet
[ "$(generations)" = 0 ] || fail "synth bf16 rerun: generations $(generations), expected 0 (cache)"
synth_yaml fp32
expect_ok "synth generator.weights: fp32" "$L" synth p.yaml --quiet
[ "$(generations)" = 3 ] || fail "synth fp32 after bf16: generations $(generations), expected 3 (weights in the cache key)"
synth_yaml fp16
expect_fail "synth generator.weights: fp16" "generator.weights must be fp32, bf16, int8 or int4" "$L" synth p.yaml --quiet
