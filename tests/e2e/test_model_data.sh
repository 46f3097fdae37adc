#!/usr/bin/env bash
# A model remembers what it was trained on (checkpoint data.json + tokenizer.json): generate
# and eval encode and decode with its tokenizer; eval and a resumed train refuse data of
# another tokenizer or another class list (names and order), naming both files. Older
# checkpoints (no data.json) fall back to their run's data.train. ASan/UBSan binary.
source "$(dirname "$0")/lib.sh"
L=$LOOM_ASAN_BIN
cd "$WORK"

# ---- classes: three labelled datasets, classes [a, b], [a, b, c, d, e] and [a, c] ----
python3 - <<'PY'
import json, os, random
for name, labels in [("A", "ab"), ("B", "abcde"), ("C", "ac")]:
    random.seed(name)
    os.makedirs(f"{name}/files", exist_ok=True)
    with open(f"{name}/labels.jsonl", "w") as lf:
        for i in range(24):
            lab = labels[i % len(labels)]
            k = labels.index(lab)
            data = bytes((k * 37 + random.randrange(40)) % 256 for _ in range(random.randint(100, 400)))
            open(f"{name}/files/f{i:03d}.bin", "wb").write(data)
            lf.write(json.dumps({"path": f"f{i:03d}.bin", "label": lab}) + "\n")
    open(f"{name}.yaml", "w").write(f"""name: cls{name}
sources:
  - name: files
    kind: binary
    path: {name}/files
    labels: {name}/labels.jsonl
    label_key: path
    label_field: label
tokenizer: byte
seq_len: 64
val_fraction: 0.25
output: {name}/data
""")
PY
for d in A B C; do "$LOOM_BIN" data build $d.yaml >/dev/null 2>&1 || fail "data build $d"; done
cls_train() { "$L" train "$LOOM_SRC/configs/byte-classifier.yaml" --set run.dir="$WORK/crun" \
  --set data.train="$WORK/$1/data/train" --set data.val="$WORK/$1/data/val" --set model.num_classes=5 \
  --set training.steps=$2 --set training.seq_len=64 --set model.d_model=16 --set training.batch_size=4 \
  --set checkpoint.every=4 --set eval.every=4 --set eval.batches=1; }
expect_ok "train a classifier on classes [a, b]" cls_train A 4
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['classes']==['a','b'] and d['tokenizer']=={'id':'byte'}, d" \
  crun/ckpt/latest/data.json || fail "data.json does not record the classes and the tokenizer"
expect_ok "eval on the same classes" "$L" eval crun --data A/data/val
expect_fail "eval on more classes (label >= K aborted before)" \
  "B/data/val/dataset.json lists the classes \[a, b, c, d, e\], but the model was trained on \[a, b\] \(crun/ckpt/step_0000004/data.json\)" \
  "$L" eval crun --data B/data/val
expect_fail "eval on other class names (accepted before)" \
  "C/data/val/dataset.json lists the classes \[a, c\], but the model was trained on \[a, b\]" \
  "$L" eval crun --data C/data/val
cp crun/metrics.jsonl metrics.before
expect_fail "resume on other classes" "data.train: .*C/data/train/dataset.json lists the classes \[a, c\], but the model was trained on \[a, b\] \(.*step_0000004/data.json\)" \
  cls_train C 8
cmp -s crun/metrics.jsonl metrics.before || fail "a refused resume changed metrics.jsonl"
expect_fail "train with a val split of other classes" "data.val: .*C/data/val/dataset.json lists the classes \[a, c\]" \
  "$L" train "$LOOM_SRC/configs/byte-classifier.yaml" --set run.dir="$WORK/crun2" \
  --set data.train="$WORK/A/data/train" --set data.val="$WORK/C/data/val" --set model.num_classes=5

# ---- tokenizers: a BPE dataset carries its tokenizer.json, the checkpoint records it ----
make_dataset "$WORK/bytes"
"$LOOM_BIN" tokenizer train --vocab-size 320 --out tok.json "$WORK"/bytes/corpus/*.txt >/dev/null 2>&1 \
  || fail "tokenizer train"
tok_id=$("$LOOM_BIN" tokenizer info --tokenizer tok.json | grep -oE '[0-9a-f]{64}' | head -1)
[ -n "$tok_id" ] || fail "no tokenizer id"
sed "s|^tokenizer: byte|tokenizer: {type: bpe, path: $WORK/tok.json}|; s|^output: .*|output: $WORK/bpe|; s|^name: e2e|name: bpe|" \
  bytes/recipe.yaml > bpe.yaml
expect_ok "build a BPE dataset" "$LOOM_BIN" data build bpe.yaml
[ -f bpe/train/tokenizer.json ] || fail "the BPE dataset lacks its tokenizer.json"
grep -q '"file": "tokenizer.json"' bpe/train/dataset.json || fail "dataset.json does not name tokenizer.json"
make_config "$WORK/bpe/.." "bpe_cfg.yaml" "$WORK/brun"
sed -i "s|train: .*/data/train|train: $WORK/bpe/train|; s|val: .*/data/val|val: $WORK/bpe/val|; s|vocab_size: 256|vocab_size: 320|" bpe_cfg.yaml
expect_ok "train on the BPE dataset" "$L" train bpe_cfg.yaml --set training.steps=30 --set checkpoint.every=30 \
  --set eval.every=30 --set training.lr=1e-2
grep -q "\"id\": \"$tok_id\"" brun/ckpt/latest/data.json || fail "data.json does not record tokenizer $tok_id"
cmp -s brun/ckpt/latest/tokenizer.json bpe/train/tokenizer.json || fail "the checkpoint's tokenizer.json differs"
# generate: the prompt is BPE-encoded and the output BPE-decoded: text, no replacement characters
# (byte-decoding printed each merged token as U+FFFD)
expect_ok "generate with the BPE tokenizer" "$L" generate brun --prompt "the quick brown" --tokens 40 --temperature 0
grep -q "^the quick brown" out.txt || fail "the output does not start with the prompt: $(head -c 200 out.txt)"
if grep -q $'\xEF\xBF\xBD' out.txt; then fail "the output has replacement characters: $(head -c 200 out.txt)"; fi
python3 - out.txt <<'PY' || fail "the generated text is not made of the corpus' words"
import sys
words = set("the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly".split())
text = open(sys.argv[1]).read().split("\n%\n")[0]
toks = text.replace("\n", " ").split()
good = sum(t in words for t in toks[:-1])  # the last word may be cut
assert len(toks) >= 5 and good >= 0.8 * (len(toks) - 1), toks
PY
pass "generated text decodes to the corpus' words"
expect_ok "eval on the BPE val split" "$L" eval brun --data bpe/val
expect_fail "eval on a byte-tokenized dataset" \
  "bytes/data/val was tokenized with byte, but the model with $tok_id \(brun/ckpt/step_0000030/data.json\)" \
  "$L" eval brun --data bytes/data/val
expect_fail "resume on a byte-tokenized dataset" \
  "data.train $WORK/bytes/data/train was tokenized with byte, but the checkpoint being resumed with $tok_id" \
  "$L" train bpe_cfg.yaml --set training.steps=40 --set data.train="$WORK/bytes/data/train" --set data.val=
expect_fail "train with a val split of another tokenizer" "data.val: .*bytes/data/val was tokenized with byte" \
  "$L" train bpe_cfg.yaml --set run.dir="$WORK/brun2" --set data.val="$WORK/bytes/data/val"

# ---- an older checkpoint (no data.json, no tokenizer.json): its run's data.train tells ----
cp -r brun old
python3 - old/ckpt/latest <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
for f in ("data.json", "tokenizer.json"):
    del m["files"][f]
    os.remove(f"{d}/{f}")
text = json.dumps(m, indent=2).encode()
open(f"{d}/manifest.json", "wb").write(text)
open(f"{d}/COMPLETE", "w").write(hashlib.sha256(text).hexdigest() + "\n")
PY
expect_ok "generate from an older checkpoint" "$L" generate old --prompt "the quick brown" --tokens 40 --temperature 0
cp out.txt old.txt
expect_ok "generate from the new one" "$L" generate brun --prompt "the quick brown" --tokens 40 --temperature 0
cmp -s out.txt old.txt || fail "the older checkpoint generates differently"
expect_fail "eval of an older checkpoint on other data" "bytes/data/val was tokenized with byte, but the model with $tok_id \(.*bpe/train/dataset.json \(the run's data.train" \
  "$L" eval old --data bytes/data/val
mv bpe bpe.moved
expect_fail "an older checkpoint whose data.train is gone" "does not record the tokenizer it was trained with .*train it again" \
  "$L" generate old --prompt x
mv bpe.moved bpe
echo "all model-data tests passed"
