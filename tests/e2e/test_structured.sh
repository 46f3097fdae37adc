#!/usr/bin/env bash
# Constrained decoding (docs/inference.md, "Structured output"): from untrained models (one
# training step: random output) with a byte and a BPE tokenizer, every sampled generation of
# `loom generate --json-schema` / `--json` and of `loom serve` with response_format parses and
# validates with the `jsonschema` package, within max_tokens (tight budgets included);
# unsatisfiable and unsupported schemas are exit 2 / 400 naming the problem; a model trained
# on documents of the schema gives the same greedy output constrained and unconstrained.
source "$(dirname "$0")/lib.sh"
python3 -c "import jsonschema" 2>/dev/null || fail "the jsonschema package is missing (scripts/setup.sh --test installs it)"
cd "$WORK"
mkdir -p corpus
python3 - <<'PY'
import random
random.seed(1)
with open("corpus/a.txt", "w") as f:
    for i in range(400):
        f.write('{"a": [%d, true], "b": "ok"}\n%%\n' % random.choice([1, 1, 1, 1, 2, 3]))
with open("words.txt", "w") as f:  # the BPE's own corpus: words and JSON punctuation
    for i in range(3000):
        f.write(" ".join("".join(random.choice("etaoinshrdlu") for _ in range(random.randint(1, 6)))
                         for _ in range(8)) + ' {"k": [%d], "s": null}\n' % random.randint(0, 999))
PY
"$LOOM_BIN" tokenizer train --vocab-size 300 --special "<|endoftext|>" --out "$WORK/tok.json" \
  "$WORK/words.txt" >/dev/null 2>&1 || fail "tokenizer train"
for tk in byte bpe; do
  cat > "$WORK/recipe_$tk.yaml" <<YAML
name: js_$tk
sources:
  - {name: c, kind: text, path: $WORK/corpus, split: "\n%\n"}
tokenizer: $([ $tk = byte ] && echo byte || echo "{type: bpe, path: $WORK/tok.json}")
seq_len: 32
val_fraction: 0.1
output: $WORK/data_$tk
shard_tokens: 20000
YAML
  "$LOOM_BIN" data build "$WORK/recipe_$tk.yaml" >/dev/null 2>&1 || fail "data build ($tk)"
  mkdir -p "$WORK/$tk"; ln -s "$WORK/data_$tk" "$WORK/$tk/data"
  make_config "$WORK/$tk" "$WORK/$tk.yaml" "$WORK/run_$tk"
  expect_ok "an untrained model ($tk)" "$LOOM_BIN" train "$WORK/$tk.yaml" --set training.steps=1 \
    --set checkpoint.every=1 --set eval.every=0 --set model.max_seq_len=256 \
    --set model.vocab_size=$([ $tk = byte ] && echo 256 || echo 300)
done
cat > "$WORK/schema.json" <<'JSON'
{"$defs": {"tag": {"type": "string", "minLength": 1, "maxLength": 4}},
 "type": "object",
 "properties": {
   "name": {"type": "string", "maxLength": 10, "description": "ignored"},
   "age": {"type": "integer"},
   "score": {"type": ["number", "null"]},
   "kind": {"enum": ["cat", "dog", 3, null]},
   "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
   "where": {"anyOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
                       {"const": "home"}]}},
 "required": ["name", "age", "tags"]}
JSON
python3 -c "
import json
with open('$WORK/prompts.jsonl', 'w') as f:
    for i in range(16): f.write(json.dumps({'prompt': 'record %d:' % i}) + '\n')"
for tk in byte bpe; do
  # --tokens 60: the shortest document is 36 bytes, so the budget rule binds in many of them
  expect_ok "generate --json-schema ($tk)" "$LOOM_ASAN_BIN" generate "$WORK/run_$tk" --prompts "$WORK/prompts.jsonl" \
    --json-schema "$WORK/schema.json" --tokens 60 --temperature 1 --top-k 0 --seed 3 --stats
  cp "$WORK/out.txt" "$WORK/gen_$tk.jsonl"
  python3 "$LOOM_SRC/tests/e2e/structured_check.py" lines "$WORK/schema.json" "$WORK/gen_$tk.jsonl" 16 || fail "$tk outputs"
  grep -q "constrained decoding: .* ms of mask per token" "$WORK/err.txt" || fail "no mask cost in --stats"
  expect_ok "generate --json ($tk)" "$LOOM_BIN" generate "$WORK/run_$tk" --prompts "$WORK/prompts.jsonl" \
    --json --tokens 40 --temperature 1.5 --top-k 0 --seed 4
  python3 "$LOOM_SRC/tests/e2e/structured_check.py" lines object "$WORK/out.txt" 16 || fail "$tk --json outputs"
done
echo '{"type": "array", "minItems": 4, "maxItems": 2}' > "$WORK/unsat.json"
echo '{"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}' > "$WORK/unsup.json"
for f in unsat:"minItems 4 > maxItems 2" unsup:"'multipleOf' is not supported"; do
  rc=0; "$LOOM_BIN" generate "$WORK/run_byte" --prompt x --json-schema "$WORK/${f%%:*}.json" 2>"$WORK/err.txt" || rc=$?
  [ $rc = 2 ] && grep -q "${f#*:}" "$WORK/err.txt" || fail "${f%%:*}: exit $rc, $(cat "$WORK/err.txt")"
  pass "--json-schema ${f%%:*}: exit 2: $(cat "$WORK/err.txt")"
done
expect_fail "max_tokens below the shortest document" "too small" \
  "$LOOM_BIN" generate "$WORK/run_byte" --prompt x --json-schema "$WORK/schema.json" --tokens 20
# a model that learned documents of the schema: greedy output, constrained or not, is the same
expect_ok "a model trained on JSON" "$LOOM_BIN" train "$WORK/byte.yaml" --set run.dir="$WORK/trained" \
  --set training.steps=200 --set training.schedule_steps=200 --set model.max_seq_len=128 --set eval.every=0 \
  --set checkpoint.every=200 --set training.lr=1e-2 --set training.warmup=5 --set training.batch_size=4
echo '{"type":"object","properties":{"a":{"type":"array","items":{"type":["integer","boolean"]}},"b":{"type":"string"}},"required":["a"]}' > "$WORK/ab.json"
free=$("$LOOM_BIN" generate "$WORK/trained" --prompt '}' --temperature 0 --tokens 27)
con=$("$LOOM_BIN" generate "$WORK/trained" --prompt '}' --temperature 0 --tokens 60 --json-schema "$WORK/ab.json")
free=${free#\}} # the echoed prompt (a document is printed alone)
python3 -c "import json,sys; json.loads(sys.argv[1])" "$free" || fail "the trained model's greedy output is not a document: $free"
[ "$free" = "$con" ] || fail "constrained greedy '$con' differs from unconstrained '$free'"
pass "greedy: constrained = unconstrained when that is a document ($con)"
# synth's local generator with generator.json_schema: every sample passes the json validator
# with the same schema at the first attempt; the schema is part of the generation cache key
cat > "$WORK/rec.json" <<'JSON'
{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"},
 "kind": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
 "required": ["name", "n"]}
JSON
printf 'one\ntwo\nthree\nfour\nfive\nsix\n' > "$WORK/seeds.txt"
cat > "$WORK/synth.yaml" <<YAML
name: rec
seeds:
  - path: $WORK/seeds.txt
templates:
  t: "a record for {seed}:"
template: t
generator:
  kind: local
  checkpoint: $WORK/run_bpe
  json_schema: $WORK/rec.json
  max_tokens: 80
  temperature: 1
validators:
  - kind: json
    schema: $(tr -d '\n' < "$WORK/rec.json")
max_attempts: 1
output: $WORK/synth.jsonl
rejected: $WORK/synth.rej.jsonl
summary: $WORK/synth.summary.json
YAML
expect_ok "synth with generator.json_schema" "$LOOM_ASAN_BIN" synth "$WORK/synth.yaml"

python3 - "$WORK" <<'PY' || fail "synth outputs"
import json, sys, jsonschema
w = sys.argv[1]
s = json.load(open(f"{w}/synth.summary.json"))
assert s["items"] == 6 and s["accepted"] == 6, s
schema = json.load(open(f"{w}/rec.json"))
for l in open(f"{w}/synth.jsonl"):
    jsonschema.validate(json.loads(json.loads(l)["text"]), schema)
PY
sed -i 's/"maxLength": 8/"maxLength": 7/' "$WORK/rec.json"
expect_ok "synth again, the schema changed" "$LOOM_BIN" synth "$WORK/synth.yaml"
python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cache']; assert c['generation_hits']==0 and c['generations_run']==6, c" \
  "$WORK/synth.summary.json" || fail "a changed schema must generate anew: $(cat "$WORK/synth.summary.json")"
pass "synth: generator.json_schema outputs validate; the schema is in the cache key"
start_server "$WORK/port" "$WORK/serve.log" env ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:log_path=$WORK/asan \
  "$LOOM_ASAN_BIN" serve "$WORK/run_bpe" --port 0 --port-file "$WORK/port"
python3 "$LOOM_SRC/tests/e2e/structured_check.py" serve "$(cat "$WORK/port")" "$WORK/schema.json" \
  || { cat "$WORK/serve.log" >&2; fail "serve checks"; }
kill -TERM $SERVER_PID
wait $SERVER_PID || fail "the server's exit"
if ls "$WORK"/asan* >/dev/null 2>&1; then cat "$WORK"/asan* >&2; fail "sanitizer report"; fi
pass "structured output"
