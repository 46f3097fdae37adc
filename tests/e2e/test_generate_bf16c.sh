#!/usr/bin/env bash
# --compute bf16 (docs/inference.md "Compute in bf16"), through the CLI (ASan build): generate
# runs batched for both flavors and --stats names the mode; a bad value and --weights fp32 with
# it are errors naming the option; serve answers a completion with it; synth's
# generator.compute: bf16 runs, is part of the cache key (an unchanged rerun generates nothing,
# the same pipeline without it generates again), and a bad value or weights: fp32 with it is an
# error naming the key. (Numerics against PyTorch and batched = alone:
# tests/reference/test_infer_bf16c.py; the kernel: tests/unit/test_dotbf16.c.)
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"
make_dataset "$WORK"
printf 'the quick\nbrown fox jumps\na\nlazy dog over the\n' > prompts.txt
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/run_$flavor"
  expect_ok "train ($flavor)" "$LOOM_BIN" train "$WORK/$flavor.yaml" --set training.steps=5
  expect_ok "generate --compute bf16 ($flavor, batch 4)" "$L" generate "$WORK/run_$flavor" \
    --prompts prompts.txt --tokens 10 --temperature 0 --batch 4 --compute bf16 --format ids --stats
  grep -q "weights bf16, compute bf16; resident memory" "$WORK/err.txt" ||
    fail "no compute line: $(cat "$WORK/err.txt")"
  [ "$(grep -c '"ids"' "$WORK/out.txt")" = 4 ] || fail "$flavor: expected 4 outputs: $(cat "$WORK/out.txt")"
done
expect_fail "--compute fp16" "--compute 'fp16': expected fp32 or bf16" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --compute fp16
expect_fail "--weights fp32 --compute bf16" "--compute bf16 multiplies bf16 weights" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --weights fp32 --compute bf16
expect_fail "--compute bf16 --no-kv-cache" "--compute bf16 runs through the KV-cache engine" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --compute bf16 --no-kv-cache
expect_fail "serve --compute int8" "--compute 'int8': expected fp32 or bf16" \
  "$L" serve "$WORK/run_gpt2" --compute int8
serve_completion "serve --compute bf16" "$L" serve "$WORK/run_gpt2" --compute bf16
# synth: generator.compute
printf 'the quick\nbrown fox\nlazy dog\n' > seeds.txt
synth_yaml() { # $1: the generator's extra lines
  cat > p.yaml <<YAML
name: bf16c
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "{seed}"
template: t
generator:
  kind: local
  checkpoint: $WORK/run_gpt2
$1
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
synth_yaml "  compute: bf16"
expect_ok "synth generator.compute: bf16" "$L" synth p.yaml --quiet
[ "$(grep -c '"text"' synth.jsonl)" = 3 ] || fail "synth compute bf16: expected 3 records: $(cat synth.jsonl)"
[ "$(generations)" = 3 ] || fail "synth compute bf16: generations $(generations), expected 3"
expect_ok "synth compute bf16 again (cached)" "$L" synth p.yaml --quiet
[ "$(generations)" = 0 ] || fail "synth compute bf16 rerun: generations $(generations), expected 0 (cache)"
synth_yaml "  weights: bf16"
expect_ok "synth generator.weights: bf16 (compute fp32)" "$L" synth p.yaml --quiet
[ "$(generations)" = 3 ] || fail "synth weights bf16 after compute bf16: generations $(generations), expected 3 (compute in the cache key)"
synth_yaml "  compute: fp16"
expect_fail "synth generator.compute: fp16" "generator.compute must be fp32 or bf16" "$L" synth p.yaml --quiet
synth_yaml "  compute: bf16
  weights: fp32"
expect_fail "synth compute bf16 with weights fp32" "generator.compute bf16 multiplies bf16 weights" "$L" synth p.yaml --quiet
