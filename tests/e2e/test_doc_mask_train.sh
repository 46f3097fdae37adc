# model.doc_mask through `loom train`: a dataset whose documents are all 16 tokens long, trained
# with seq_len 32 and document masking (two documents per window, attention and positions
# restarted at each), gives the losses, gradient norms and validation losses of training on
# the same tokens in windows of 16 (one document each) with twice the batch: the same
# documents, each seen alone. Without the mask the 32-token run differs (the control). Both
# flavors (learned positions, RoPE), flash and sdpa, and llama flash in training.precision bf16.
# `loom eval` of the two checkpoints on the
# first 2 batches of the validation data (the same tokens) agrees too: eval passes the ids.
source "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/corpus"
python3 - "$WORK/corpus" <<'PY'
import random, sys, os
random.seed(5)
letters = "abcdefghijklmnopqrstuvwxyz "
with open(os.path.join(sys.argv[1], "docs.txt"), "w") as fh:
    fh.write("\n%\n".join("".join(random.choice(letters) for _ in range(16)) for _ in range(300)))
PY
cat > "$WORK/recipe.yaml" <<YAML
name: docs16
sources:
  - name: docs
    kind: text
    path: $WORK/corpus
    split: "\n%\n"
tokenizer: byte
seq_len: 32
val_fraction: 0.1
output: $WORK/data
shard_tokens: 100000
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >/dev/null 2>&1 || fail "data build"

compare() { # compare RUN_A RUN_B MAX_REL: prints the worst relative difference, fails above
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(a) == len(b) == 6, (len(a), len(b))
keys = ["loss", "grad_norm", "val_loss"]
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in keys if k in x)
assert sum("val_loss" in x for x in a) == 2
print(f"worst relative difference of loss, grad norm, val loss over 6 steps: {worst:.2e}")
sys.exit(0 if worst < float(sys.argv[3]) else 1)
PY
}

# (llama:flash:bf16: training.precision bf16, the documents in the bf16 flash kernel)
for combo in gpt2:flash llama:sdpa llama:flash:bf16; do
  IFS=: read -r flavor attn prec <<<"$combo"
  export FLAVOR=$flavor KVH=$([ $flavor = llama ] && echo 2 || echo 4)
  common=(--set training.steps=6 --set checkpoint.every=6 --set data.shuffle=false
          --set eval.every=3 --set model.max_seq_len=32 --set model.attention=$attn
          --set training.precision=${prec:-fp32})
  make_config "$WORK" "$WORK/a.yaml" "$WORK/masked_$combo"
  expect_ok "$combo: seq_len 32, doc_mask" "$LOOM_BIN" train "$WORK/a.yaml" "${common[@]}" \
    --set training.seq_len=32 --set training.batch_size=2 --set model.doc_mask=true
  make_config "$WORK" "$WORK/b.yaml" "$WORK/alone_$combo"
  expect_ok "$combo: seq_len 16" "$LOOM_BIN" train "$WORK/b.yaml" "${common[@]}" \
    --set training.seq_len=16 --set training.batch_size=4
  make_config "$WORK" "$WORK/c.yaml" "$WORK/unmasked_$combo"
  expect_ok "$combo: seq_len 32, no doc_mask" "$LOOM_BIN" train "$WORK/c.yaml" "${common[@]}" \
    --set training.seq_len=32 --set training.batch_size=2
  compare "$WORK/masked_$combo" "$WORK/alone_$combo" 1e-5 ||
    fail "$combo: doc_mask at 32 differs from the documents alone at 16"
  pass "$combo: doc_mask at seq_len 32 == each document alone at seq_len 16"
  ev() { "$LOOM_BIN" eval "$1/ckpt/latest" --data "$WORK/data/val" --batches 2 --format json; }
  a=$(ev "$WORK/masked_$combo") && b=$(ev "$WORK/alone_$combo") && c=$(ev "$WORK/unmasked_$combo") ||
    fail "$combo: loom eval"
  python3 - "$a" "$b" "$c" <<'PY' || fail "$combo: loom eval of the masked checkpoint differs"
import json, sys
a, b, c = (json.loads(x)["loss"] for x in sys.argv[1:4])
print(f"loom eval: masked {a!r}, alone {b!r}, unmasked control {c!r}")
sys.exit(0 if abs(a - b) <= 1e-6 * abs(b) and abs(c - b) > 1e-5 * abs(b) else 1)
PY
  pass "$combo: loom eval with the documents == the documents alone"
  if compare "$WORK/unmasked_$combo" "$WORK/alone_$combo" 1e-3; then
    fail "$combo: the control without doc_mask matches too: the test cannot tell"
  fi
  pass "$combo: without doc_mask the runs differ (control)"
done

make_config "$WORK" "$WORK/d.yaml" "$WORK/bad"
expect_fail "model.doc_mask: not a boolean" "model.doc_mask" "$LOOM_BIN" train "$WORK/d.yaml" \
  --set model.doc_mask=maybe
