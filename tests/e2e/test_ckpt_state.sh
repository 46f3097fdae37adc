# Checkpoints that disagree with themselves are refused, and a copied run keeps saving:
#  - trainer_state.json's step must equal its directory's and manifest.json's (a state file with
#    another step, even with a manifest and COMPLETE re-hashed to match, is refused on resume);
#  - COMPLETE and manifest.json may not be symlinks; 'zero', 'layout', 'rng' of the state are
#    type-checked; training.steps below the checkpoint's step is an error saying so;
#  - a run copied with links followed (cp -rL: ckpt/latest becomes a real directory) resumes
#    and saves, and latest is a link again.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
"$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=6 --set checkpoint.every=3 2>"$WORK/log" \
  || { cat "$WORK/log"; fail "first run"; }

# rehash DIR: manifest.json's sizes and SHA-256 for every file, then COMPLETE for the manifest
rehash() {
  python3 - "$1" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
for name, ent in m["files"].items():
    data = open(os.path.join(d, name), "rb").read()
    ent["bytes"], ent["sha256"] = len(data), hashlib.sha256(data).hexdigest()
text = (json.dumps(m, indent=2) + "\n").encode()
open(os.path.join(d, "manifest.json"), "wb").write(text)
open(os.path.join(d, "COMPLETE"), "w").write(hashlib.sha256(text).hexdigest() + "\n")
PY
}

cp -r "$WORK/run" "$WORK/bad"
S6=$WORK/bad/ckpt/step_0000006
python3 - "$S6/trainer_state.json" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p)); s["step"] = 7
open(p, "w").write(json.dumps(s, indent=2))
PY
rehash "$S6"
expect_fail "trainer_state.json says step 7 in step_0000006" \
  "step_0000006/trainer_state.json: 'step' is 7, but its directory and manifest.json say step 6" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/bad" --set training.steps=9 --set checkpoint.every=3
python3 - "$S6/trainer_state.json" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p)); s["step"] = 6; s["optimizer_step"] = 8
open(p, "w").write(json.dumps(s, indent=2))
PY
rehash "$S6"
expect_fail "optimizer_step beyond step" "'optimizer_step' 8 is larger than 'step' 6" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/bad" --set training.steps=9 --set checkpoint.every=3
rm -rf "$S6"
cp -r "$WORK/run/ckpt/step_0000003" "$WORK/bad/ckpt/step_0000009"
expect_fail "a step directory renamed to another step" "manifest says step 3 but the directory is step 9" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/bad" --set training.steps=12 --set checkpoint.every=3

# the commit markers are never followed through a link (like the files they list): a
# manifest.json or COMPLETE that is a symlink to a copy with the very same bytes is refused
for marker in manifest.json COMPLETE; do
  rm -rf "$WORK/links"; cp -r "$WORK/run" "$WORK/links"
  L6=$WORK/links/ckpt/step_0000006
  mv "$L6/$marker" "$WORK/links/$marker.elsewhere"
  ln -s "$WORK/links/$marker.elsewhere" "$L6/$marker"
  expect_fail "$marker is a symlink" "step_0000006/$marker: not a regular file \(checkpoint markers may not be links\)" \
    "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/links" --set training.steps=9 --set checkpoint.every=3
  expect_fail "generate: $marker is a symlink" "checkpoint markers may not be links" \
    "$LOOM_ASAN_BIN" generate "$L6" --prompt "the" --tokens 2
done
# trainer_state.json's informational fields are checked too (here re-hashed to match)
for edit in 's["zero"] = "x"' 's["zero"] = 7' 's["layout"] = 3' 's["rng"] = []'; do
  rm -rf "$WORK/bad2"; cp -r "$WORK/run" "$WORK/bad2"
  python3 - "$WORK/bad2/ckpt/step_0000006/trainer_state.json" "$edit" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p)); exec(sys.argv[2])
open(p, "w").write(json.dumps(s, indent=2))
PY
  rehash "$WORK/bad2/ckpt/step_0000006"
  expect_fail "trainer_state.json: $edit" "step_0000006/trainer_state.json: '(zero|layout|rng)' must be" \
    "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/bad2" --set training.steps=9 --set checkpoint.every=3
done
# training.steps below the checkpoint's step: an error that says why, and nothing is touched
cp "$WORK/run/config.yaml" "$WORK/config_before"
cp "$WORK/run/metrics.jsonl" "$WORK/metrics_before"
expect_fail "training.steps 3 with a checkpoint at step 6" \
  "training.steps is 3, but run.dir .*/run has a checkpoint at step 6 .*past it: nothing to train. Raise training.steps" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set training.steps=3 --set checkpoint.every=3
cmp -s "$WORK/config_before" "$WORK/run/config.yaml" || fail "the refused run rewrote config.yaml"
cmp -s "$WORK/metrics_before" "$WORK/run/metrics.jsonl" || fail "the refused run changed metrics.jsonl"
expect_ok "training.steps equal to the checkpoint's step: nothing to do, exit 0" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set training.steps=6 --set checkpoint.every=3
cmp -s "$WORK/metrics_before" "$WORK/run/metrics.jsonl" || fail "training.steps = the checkpoint's step changed metrics.jsonl"

# a run copied with its links followed: latest is a real directory
cp -rL "$WORK/run" "$WORK/copy"
[ -d "$WORK/copy/ckpt/latest" ] && [ ! -L "$WORK/copy/ckpt/latest" ] || fail "cp -rL kept the link"
expect_ok "resume a copied run whose latest is a directory" \
  "$LOOM_ASAN_BIN" train "$WORK/c.yaml" --set run.dir="$WORK/copy" --set training.steps=12 --set checkpoint.every=3
grep -q "resumed from .*step_0000006" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "did not resume from step 6"; }
[ "$(readlink "$WORK/copy/ckpt/latest")" = step_0000012 ] || fail "latest is not a link to step_0000012"
for s in 9 12; do [ -f "$WORK/copy/ckpt/step_00000$(printf %02d $s)/COMPLETE" ] || fail "no checkpoint at step $s"; done
pass "copied run: saves at steps 9 and 12 went through, latest -> step_0000012"
echo "all checkpoint-state tests passed"
