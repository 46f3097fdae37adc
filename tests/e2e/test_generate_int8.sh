#!/usr/bin/env bash
# --weights int8 (docs/inference.md "Weights in int8"), through the CLI (ASan build): generate
# runs batched with Q8_0 weights for both flavors (gpt2: tied head, so the embedding rows come
# from the quantized wte; llama: GQA, untied), and with --weights int4 for llama (d_ff 256: its
# fc_proj in Q4_K, the other linears in Q8_0), the first prompt's greedy output in the batch
# equal to it alone, --stats names the weights; bad combinations are errors naming the option;
# serve answers a completion with int8 weights; synth's generator.weights: int8 runs and is
# part of the cache key. (The kernels bit for bit at every level: tests/unit/test_q8.c; the
# logits against fp32: tests/unit/test_decode.c; the quality on a trained model:
# tests/reference/test_infer_int8.py.)
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"
make_dataset "$WORK"
printf 'the quick\nbrown fox jumps\na\nlazy dog over the\n' > prompts.txt
for flavor in gpt2 llama; do
  kvh=4; [ $flavor = llama ] && kvh=2
  FLAVOR=$flavor KVH=$kvh make_config "$WORK" "$WORK/$flavor.yaml" "$WORK/run_$flavor"
  # llama with d_ff 256: its fc_proj's input width is one Q4_K block, so int4 runs Q4_K there
  ff=(); [ $flavor = llama ] && ff=(--set model.d_ff=256)
  expect_ok "train ($flavor)" "$LOOM_BIN" train "$WORK/$flavor.yaml" --set training.steps=5 "${ff[@]}"
  R=$WORK/run_$flavor
  bits=8; [ $flavor = llama ] && bits="8 4"
  for b in $bits; do
    expect_ok "generate --weights int$b ($flavor, batch 4)" "$L" generate "$R" --prompts prompts.txt \
      --tokens 10 --temperature 0 --batch 4 --weights int$b --format ids --stats
    grep -q "weights int$b; resident memory" "$WORK/err.txt" || fail "no weights line: $(cat "$WORK/err.txt")"
    cp "$WORK/out.txt" batched.jsonl
    head -n 1 prompts.txt > one.txt
    "$LOOM_BIN" generate "$R" --prompts one.txt --tokens 10 --temperature 0 --batch 1 \
      --weights int$b --format ids > alone.jsonl || fail "$flavor: alone run failed (int$b)"
    python3 - batched.jsonl alone.jsonl <<'PY' || fail "$flavor: batched differs from alone (int$b)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
alone = json.loads(open(sys.argv[2]).readline())
assert len(rows) == 4 and rows[0]["ids"] == alone["ids"] and len(alone["ids"]) > 0, (rows[0], alone)
PY
    pass "$flavor: the first prompt of the int$b batch equals it alone"
  done
done
expect_fail "--weights int8 --no-kv-cache" "--weights int8 runs through the KV-cache engine" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --weights int8 --no-kv-cache
expect_fail "--compute bf16 --weights int8" "cannot run with --weights int8" \
  "$L" generate "$WORK/run_gpt2" --prompt hi --weights int8 --compute bf16
serve_completion "serve --weights int8" "$L" serve "$WORK/run_llama" --weights int8
printf 'the quick\nbrown fox\n' > seeds.txt
synth_yaml() { # $1: weights
  cat > p.yaml <<YAML
name: int8
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
synth_yaml int8
expect_ok "synth generator.weights: int8" "$L" synth p.yaml --quiet
[ "$(grep -c '"text"' synth.jsonl)" = 2 ] || fail "synth int8: expected 2 records: $(cat synth.jsonl)"
[ "$(generations)" = 2 ] || fail "synth int8: generations $(generations), expected 2"
synth_yaml fp32
expect_ok "synth generator.weights: fp32" "$L" synth p.yaml --quiet
[ "$(generations)" = 2 ] || fail "synth fp32 after int8: generations $(generations), expected 2 (weights in the cache key)"
