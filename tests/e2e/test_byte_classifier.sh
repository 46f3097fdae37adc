# The byte classifier end to end: a labelled file-type corpus from this machine's own files
# (libmagic labels), labelled shards, classify training, `loom eval` on held-out files.
# The held-out accuracy must be at least 0.40 and 2.5x the majority-class share.
source "$(dirname "$0")/lib.sh"
command -v file >/dev/null || fail "the 'file' command (libmagic) is missing"
python3 "$LOOM_SRC/scripts/filetypes_dataset.py" "$WORK/src" --per-class 30 --max-bytes 131072 \
  --max-candidates 8000 --min-per-class 15 2>"$WORK/collect.log" || { cat "$WORK/collect.log"; fail "collect"; }
classes=$(python3 -c "import json,sys; print(len({json.loads(l)['label'] for l in open(sys.argv[1])}))" "$WORK/src/labels.jsonl")
[ "$classes" -ge 5 ] || fail "only $classes classes found on this machine"
sed "s|data/filetypes_src|$WORK/src|g; s|output: data/filetypes|output: $WORK/data|" \
  "$LOOM_SRC/recipes/filetypes.yaml" > "$WORK/recipe.yaml"
"$LOOM_BIN" data build "$WORK/recipe.yaml" 2>"$WORK/build.log" || { cat "$WORK/build.log"; fail "data build"; }
"$LOOM_BIN" train "$LOOM_SRC/configs/byte-classifier.yaml" --set run.dir="$WORK/run" \
  --set data.train="$WORK/data/train" --set data.val="$WORK/data/val" \
  --set training.steps=240 --set training.seq_len=256 --set model.d_model=64 \
  --set training.batch_size=16 --set eval.every=120 --set checkpoint.every=240 \
  --set training.log_every=20 2>"$WORK/train.log" || { cat "$WORK/train.log"; fail "train"; }
"$LOOM_BIN" eval "$WORK/run" --data "$WORK/data/val" --format json > "$WORK/eval.json" \
  || fail "eval"
"$LOOM_BIN" eval "$WORK/run" --data "$WORK/data/val"
python3 - "$WORK/eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
acc, base = r["accuracy"], r["majority_baseline"]
conf = r["confusion"]
n = sum(map(sum, conf))
assert n == r["windows"], (n, r["windows"])
assert abs(sum(conf[i][i] for i in range(len(conf))) / n - acc) < 1e-9
need = max(0.40, 2.5 * base)
print(f"held-out accuracy {acc:.3f} over {n} windows, majority class {base:.3f}, required {need:.3f}")
sys.exit(0 if acc >= need else 1)
PY
pass "byte classifier beats the majority class on held-out files"
