# The loader through `loom data build` + `loom train`: two weighted sources in the trainer's
# checkpointed loader state, and data.follow picking up a shard appended to the manifest while
# the run trains (a shard file without a manifest line is never read).
source "$(dirname "$0")/lib.sh"

mkdir -p "$WORK/a" "$WORK/b" "$WORK/c"
python3 - "$WORK" <<'PY'
import random, sys, os
random.seed(3)
for src, words in (("a", "alpha beta gamma delta"), ("b", "one two three four five"), ("c", "red green blue")):
    w = words.split()
    with open(os.path.join(sys.argv[1], src, "part.txt"), "w") as fh:
        for doc in range(80):
            fh.write(" ".join(random.choice(w) for _ in range(random.randint(20, 60))) + "\n%\n")
PY
cat > "$WORK/recipe.yaml" <<YAML
name: mix
sources:
  - name: a
    kind: text
    path: $WORK/a
    split: "\n%\n"
    weight: 3
  - name: b
    kind: text
    path: $WORK/b
    split: "\n%\n"
    weight: 1
    repeat_cap: 50
tokenizer: byte
output: $WORK/data
shard_tokens: 8000
YAML
"$LOOM_BIN" data build "$WORK/recipe.yaml" >/dev/null 2>&1 || { "$LOOM_BIN" data build "$WORK/recipe.yaml"; fail "data build"; }
DS=$WORK/data/train
grep -q '"weight":3' "$DS/manifest.jsonl" || fail "manifest lines carry no weight: $(head -1 "$DS/manifest.jsonl")"

# a third source, built apart; its shard is appended to $DS while training runs
cat > "$WORK/late.yaml" <<YAML
name: late
sources:
  - name: c
    kind: text
    path: $WORK/c
    split: "\n%\n"
    weight: 1
tokenizer: byte
output: $WORK/late
shard_tokens: 8000
YAML
"$LOOM_BIN" data build "$WORK/late.yaml" >/dev/null 2>&1 || { "$LOOM_BIN" data build "$WORK/late.yaml"; fail "late build"; }

# a half-written shard: garbage, no manifest line. Reading it would fail the run.
head -c 10000 /dev/urandom > "$DS/shard_99999.bin"

cat > "$WORK/t.yaml" <<YAML
run:
  dir: $WORK/run
data:
  train: $DS
  follow: true
model:
  flavor: gpt2
  vocab_size: 256
  d_model: 16
  n_layer: 1
  n_head: 2
training:
  steps: 1000000
  batch_size: 4
  seq_len: 16
  lr: 1e-3
  warmup: 2
  peak_flops: 1e11
  log_every: 1000000
eval:
  every: 0
checkpoint:
  every: 25
YAML
"$LOOM_BIN" train "$WORK/t.yaml" 2>"$WORK/train.log" &
pid=$!
wait_ckpt() { # wait_ckpt N: until a complete checkpoint at step >= N exists (60 s at most)
  for _ in $(seq 600); do
    for d in "$WORK"/run/ckpt/step_*/COMPLETE; do
      [ -f "$d" ] || continue
      s=$(basename "$(dirname "$d")"); s=$((10#${s#step_}))
      [ "$s" -ge "$1" ] && return 0
    done
    kill -0 $pid 2>/dev/null || { cat "$WORK/train.log"; fail "training ended early"; }
    sleep 0.1
  done
  kill $pid; fail "no checkpoint at step $1 within 60 s"
}
wait_ckpt 25
# append the late shard as writers do: file in place first, then its manifest line
LATE=$(ls "$WORK/late/train"/shard_*.bin | head -1)
cp "$LATE" "$DS/late_00000.bin"
line=$(head -1 "$WORK/late/train/manifest.jsonl" | sed 's#"shard":"[^"]*"#"shard":"late_00000.bin"#')
printf '%s\n' "$line" >> "$DS/manifest.jsonl"
# how soon the loader takes the new line up depends on the run's speed, not on a step count:
# wait (60 s at most) for a complete checkpoint past step 100 whose loader state has source c
wait_ckpt 100
for _ in $(seq 600); do
  last=$(ls -d "$WORK"/run/ckpt/step_*/COMPLETE 2>/dev/null | sort | tail -1)
  [ -n "$last" ] && grep -qs '"c"' "$(dirname "$last")"/trainer_state*.json && break
  kill -0 $pid 2>/dev/null || { cat "$WORK/train.log"; fail "training ended early"; }
  sleep 0.1
done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -ne 0 ] && grep -q "interrupted by signal" "$WORK/train.log" || { cat "$WORK/train.log"; fail "run did not stop cleanly on SIGTERM (rc $rc)"; }
grep -qE "AddressSanitizer|runtime error" "$WORK/train.log" && fail "crash"

# the last checkpoint's loader state: all three sources, c joined with its share
last=$(dirname "$(ls -d "$WORK"/run/ckpt/step_*/COMPLETE | sort | tail -1)")
state=$(find "$last" -name 'trainer_state*.json' | head -1)
[ -n "$state" ] || fail "no trainer_state in $last: $(ls "$last")"
python3 - "$state" <<'PY' || fail "loader state check"
import json, sys
st = json.load(open(sys.argv[1]))["loader"]
src = {s["name"]: s for s in st["sources"]}
print("loader state:", {k: (v["consumed"], v["epoch"], v["segments"]) for k, v in src.items()}, "samples", st["samples"])
assert set(src) == {"a", "b", "c"}, src.keys()
a, b, c = src["a"]["consumed"], src["b"]["consumed"], src["c"]["consumed"]
assert a + b + c == st["samples"], "counts do not add up"
assert c > 0, "the appended shard was never used"
# before c joined, a:b = 3:1 exactly to within a sample
assert abs(a - 3 * b) <= 4 + c * 3, (a, b, c)
PY
pass "follow: a shard appended while training was used; the unlisted garbage shard was never read"

# resume continues from the saved loader state over the grown manifest
sed -i "s/steps: 1000000/steps: $(( $(basename "$last" | sed 's/step_0*//') + 5 ))/" "$WORK/t.yaml"
"$LOOM_BIN" train "$WORK/t.yaml" 2>"$WORK/resume.log" || { cat "$WORK/resume.log"; fail "resume"; }
grep -q "resumed from" "$WORK/resume.log" || fail "did not resume"
pass "resume over the grown manifest"
echo "all loader e2e tests passed"
