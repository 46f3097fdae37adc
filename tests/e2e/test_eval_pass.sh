#!/usr/bin/env bash
# "0 = one pass" evaluates every window of a split exactly once (sanitizer binary):
# - a two-source LM split (weights 3:1, one source capped) whose window count is not a multiple
#   of the batch: `loom eval --batches 0` reports that many windows and the loss that
#   eval_reference.py computes window by window (batch 1, windows enumerated from the shards,
#   not through the loader); the trainer's val_loss with eval.batches = 0 at the last step
#   equals it for the checkpoint of that step; --batches N still reads N batches of the mixture;
# - a classifier: the trainer's val_loss and val_accuracy with eval.batches = 0 equal
#   `loom eval`'s (every window once) on the same checkpoint.
# (tests/mpi/test_eval_pass_dp.sh: the same pass split over 2 data-parallel ranks.)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LOOM=$LOOM_ASAN_BIN
REF=$LOOM_SRC/tests/e2e/eval_reference.py
cd "$WORK"

make_mixed_dataset "$WORK" "$LOOM"
read -r N NA NB LINES < <(python3 - <<'PY'
import json
n = {"alpha": 0, "beta": 0}; lines = 0
for l in open("data/train/manifest.jsonl"):
    r = json.loads(l); lines += 1
    n[r["source"]] += (r["tokens"] - 1) // 16 if r["tokens"] > 16 else 0
print(n["alpha"] + n["beta"], n["alpha"], n["beta"], lines)
PY
)
[ "$NA" -gt 4 ] && [ "$NB" -gt 4 ] && [ $((N % 4)) -ne 0 ] && [ "$LINES" -ge 3 ] ||
  fail "dataset: $N windows ($NA + $NB) in $LINES lines; the test needs two sources, several lines and N % 4 != 0"
pass "dataset: $N windows (alpha $NA, beta $NB) in $LINES manifest lines, batch 4"

cat > lm.yaml <<YAML
run:
  dir: $WORK/run
data:
  train: $WORK/data/train
  val: $WORK/data/train
model:
  vocab_size: 256
  d_model: 32
  n_layer: 2
  n_head: 4
training:
  steps: 3
  batch_size: 4
  seq_len: 16
  lr: 3e-3
  warmup: 1
  peak_flops: 1e11
eval:
  every: 2
  batches: 0
checkpoint:
  every: 3
YAML
expect_ok "train with eval.batches = 0" "$LOOM" train lm.yaml
expect_ok "loom eval --batches 0" "$LOOM" eval "$WORK/run" --data data/train --batches 0 --format json
cp out.txt eval.json
expect_ok "reference: every window, one at a time" python3 "$REF" "$WORK/run" data/train 16
cp out.txt ref.json
python3 - "$N" <<'PY' || fail "one pass"
import json, math, sys
n = int(sys.argv[1])
ev, ref = json.load(open("eval.json")), json.load(open("ref.json"))
rows = [json.loads(l) for l in open("run/metrics.jsonl")]
val = [r["val_loss"] for r in rows if "val_loss" in r]
print(f"eval {ev}\nreference {ref}\ntrainer val_loss {val}")
assert ref["windows"] == n, ("reference windows", ref["windows"], n)
assert ev["mode"] == "pass" and ev["windows"] == n, ("eval windows", ev["windows"], n)
assert ev["batches"] == (n + 3) // 4 and ev["tokens"] == 16 * n, ev
rel = abs(ev["loss"] - ref["loss"]) / ref["loss"]
assert rel < 1e-5, ("loom eval loss", ev["loss"], "reference", ref["loss"], rel)
assert len(val) == 2 and rows[-1]["step"] == 3 and "val_loss" in rows[-1], rows
rel = abs(rows[-1]["val_loss"] - ref["loss"]) / ref["loss"]
assert rel < 1e-5, ("trainer val_loss", rows[-1]["val_loss"], "reference", ref["loss"], rel)
# the per-source losses combine into the pass's loss, each weighted by its window count
ps = ref["per_source"]
comb = sum(v["loss"] * v["windows"] for v in ps.values()) / sum(v["windows"] for v in ps.values())
assert abs(comb - ev["loss"]) / comb < 1e-5 and abs(ps["alpha"]["loss"] - ps["beta"]["loss"]) > 0
PY
pass "loom eval and the trainer's val_loss: $N windows once, the reference's loss ($(python3 -c 'import json;print(json.load(open("ref.json"))["loss"])'))"

expect_ok "loom eval (text, default = one pass)" "$LOOM" eval "$WORK/run" --data data/train
grep -q "$N windows of 16 tokens (every window once" out.txt || { cat out.txt; fail "text output"; }
expect_ok "loom eval --batches 3 (the mixture)" "$LOOM" eval "$WORK/run" --data data/train --batches 3 --format json
python3 -c '
import json; e = json.load(open("out.txt"))
assert e["mode"] == "mixture" and e["windows"] == 12 and e["batches"] == 3, e' || fail "--batches 3: $(cat out.txt)"
pass "--batches 3 reads 3 batches of the mixture"
expect_fail "eval.batches < 0 is refused" "eval.batches' = -1 .* out of range \[0," \
  "$LOOM" train lm.yaml --set eval.batches=-1 --set run.dir="$WORK/run_bad"

# ---- a classifier: the trainer's pass equals loom eval's ----
python3 - <<'PY'
import json, os, random
random.seed(5)
os.makedirs("bin/a", exist_ok=True); os.makedirs("bin/b", exist_ok=True)
labels = []
for i in range(7):
    for cls, alphabet in [("a", b"abcdefgh"), ("b", bytes(range(128, 160)))]:
        data = bytes(random.choice(alphabet) for _ in range(random.randint(10, 90)))
        open(f"bin/{cls}/{i}.bin", "wb").write(data)
        labels.append(json.dumps({"path": f"{cls}/{i}.bin", "label": cls}))
open("bin/a/short.bin", "wb").write(b"abcabc")  # one window more: 33, not a multiple of 4
labels.append(json.dumps({"path": "a/short.bin", "label": "a"}))
open("labels.jsonl", "w").write("\n".join(labels) + "\n")
PY
cat > cls_recipe.yaml <<YAML
name: evalcls
sources:
  - name: files
    kind: binary
    path: $WORK/bin
    labels: $WORK/labels.jsonl
    label_key: path
tokenizer: byte
output: $WORK/cls
YAML
expect_ok "build a labelled dataset" "$LOOM" data build cls_recipe.yaml
cat > cls.yaml <<YAML
run:
  dir: $WORK/cls_run
data:
  train: $WORK/cls/train
  val: $WORK/cls/train
  windows_per_doc: 3
model:
  head: classify
  num_classes: 2
  vocab_size: 257
  d_model: 32
  n_layer: 1
  n_head: 4
training:
  steps: 2
  batch_size: 4
  seq_len: 32
  lr: 3e-3
  warmup: 1
  peak_flops: 1e11
eval:
  every: 0
  batches: 0
checkpoint:
  every: 2
YAML
expect_ok "train a classifier with eval.batches = 0" "$LOOM" train cls.yaml
expect_ok "loom eval of the classifier" "$LOOM" eval "$WORK/cls_run" --data cls/train --format json
python3 - <<'PY' || fail "classifier pass"
import json
ev = json.load(open("out.txt"))
last = [json.loads(l) for l in open("cls_run/metrics.jsonl")][-1]
print("eval", {k: ev[k] for k in ("windows", "loss", "accuracy")}, "trainer", last["val_loss"], last["val_accuracy"])
assert ev["windows"] % 4 != 0, ev["windows"]
assert abs(last["val_loss"] - ev["loss"]) / ev["loss"] < 1e-5
assert abs(last["val_accuracy"] - ev["accuracy"]) < 1e-12
PY
pass "classifier: the trainer's val_loss / val_accuracy over every window = loom eval's"
echo PASS
