# `loom data verify` applies every rule `loom train` applies to a manifest: a manifest whose
# lines of one source disagree on weight / repeat_cap, or a line whose recipe hash is no
# SHA-256, is refused by both with the same message; verify also checks every line's recipe hash
# against dataset.json, and the manifest's order and bytes against the build's (dataset.json).
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
M=$WORK/data/train/manifest.jsonl
[ "$(wc -l < "$M")" -ge 2 ] || fail "the dataset needs two training shards of one source"
cp "$M" "$WORK/manifest.orig"
expect_ok "verify the built dataset" "$LOOM_ASAN_BIN" data verify "$WORK/data"

# edit_line N PYEXPR: rewrites line N (1-based) of the training manifest as python dict `r` edited
edit_line() {
  python3 - "$M" "$1" "$2" <<'PY'
import json, sys
path, n, expr = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = open(path).read().splitlines()
r = json.loads(lines[n - 1]); exec(expr); lines[n - 1] = json.dumps(r, separators=(",", ":"))
open(path, "w").write("\n".join(lines) + "\n")
PY
}
# both_refuse WHAT REGEX: verify and train both exit non-zero with a message matching REGEX
both_refuse() {
  expect_fail "verify: $1" "$2" "$LOOM_ASAN_BIN" data verify "$WORK/data"
  expect_fail "train: $1" "$2" "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set training.steps=2
  cp "$WORK/manifest.orig" "$M"
}

edit_line 2 'r["weight"] = 3'
both_refuse "line 2 of source corpus has weight 3, line 1 weight 1" \
  'manifest.jsonl:2: source "corpus" has weight 3, repeat_cap 0 here but weight 1, repeat_cap 0 on line 1; every line of a source must agree'
edit_line 2 'r["repeat_cap"] = 2'
both_refuse "line 2 has repeat_cap 2" 'manifest.jsonl:2: source "corpus" has weight 1, repeat_cap 2 here'
edit_line 1 'r["recipe"] = "not-a-hash"'
both_refuse "a recipe hash that is no SHA-256" 'manifest.jsonl:1: recipe "not-a-hash" is not a SHA-256'

# a line whose recipe hash is another recipe's: verify checks it against dataset.json
edit_line 2 'r["recipe"] = "0" * 64'
expect_fail "verify: a line with another recipe's hash" \
  "train/manifest.jsonl:2: recipe 0{64}, but .*/train/dataset.json says the recipe's SHA-256 is [0-9a-f]{64}" \
  "$LOOM_ASAN_BIN" data verify "$WORK/data"
cp "$WORK/manifest.orig" "$M"
expect_ok "verify after restoring the manifest" "$LOOM_ASAN_BIN" data verify "$WORK/data"
# the manifest's order is the sample order: the build records it in dataset.json and verify
# checks it (swapped lines were accepted, and train then read the samples in the new order)
python3 - "$M" <<'PY'
import sys
p = sys.argv[1]; lines = open(p).read().splitlines(True); lines[0], lines[1] = lines[1], lines[0]
open(p, "w").write("".join(lines))
PY
expect_fail "verify: manifest lines 1 and 2 swapped" \
  "manifest.jsonl:1 lists shard_00001.bin, but the build wrote shard_00000.bin there .*dataset.json records the manifest's order" \
  "$LOOM_ASAN_BIN" data verify "$WORK/data"
cp "$WORK/manifest.orig" "$M"
edit_line 1 'r["created"] = "2001-01-01T00:00:00Z"'
expect_fail "verify: a line edited in a field no other rule checks" "manifest.jsonl: SHA-256 [0-9a-f]{64}, but the build wrote [0-9a-f]{64} .*a line was edited" \
  "$LOOM_ASAN_BIN" data verify "$WORK/data"
cp "$WORK/manifest.orig" "$M"
expect_ok "verify the restored manifest" "$LOOM_ASAN_BIN" data verify "$WORK/data"

# labelled data: every label must be one of dataset.json's classes (classification training
# refuses a dataset whose class list lost a class)
make_labelled_dataset "$WORK/bin" 24
expect_ok "verify a labelled dataset" "$LOOM_ASAN_BIN" data verify "$WORK/bin/data/train"
grep -q "labelled document(s), every label one of the 3 classes" "$WORK/out.txt" || fail "labels not checked"
DS=$WORK/bin/data/train/dataset.json
cp "$DS" "$WORK/ds.orig"
python3 - "$DS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["classes"] = d["classes"][:2]
open(sys.argv[1], "w").write(json.dumps(d, indent=2))
PY
LABEL_RULE="document [0-9]+ has label 2, but .*/bin/data/train/dataset.json lists 2 classes \(0..1\)"
expect_fail "verify: a label beyond dataset.json's classes" "$LABEL_RULE" \
  "$LOOM_ASAN_BIN" data verify "$WORK/bin/data/train"
expect_fail "train (classify): a label beyond dataset.json's classes" "$LABEL_RULE" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" "${LABELLED_ARGS[@]}" --set data.val= \
  --set training.steps=2 --set run.dir="$WORK/cls"
cp "$WORK/ds.orig" "$DS"
echo "all verify-rule tests passed"
