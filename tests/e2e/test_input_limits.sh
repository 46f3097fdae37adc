#!/usr/bin/env bash
# Inputs beyond loom's limits get an error naming the key or file, never an abort: paths too
# long for loom's path buffers. Runs the ASan/UBSan binary.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
make_config "$WORK" "$WORK/ok.yaml" "$WORK/run"
L=$LOOM_ASAN_BIN

# ---- paths: a run.dir of 4,100 characters (aborted in a path buffer before) ----
long=$WORK/$(python3 -c "print('/'.join(['d' * 200] * 20) + '/' + 'x' * (4100 - 20 * 201 - len('$WORK') - 1))")
[ ${#long} -eq 4100 ] || fail "test set-up: run.dir is ${#long} characters, not 4100"
expect_fail "run.dir of 4100 characters" "config key 'run\.dir' \(--set\): path too long \(4100 bytes, at most 3584\)" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$long"
[ ! -e "$WORK/dddd" ] || fail "a refused run.dir was created"
# 3,600 characters still fit PATH_MAX but not the checkpoint paths below it: refused up front
# (it used to fail at the first checkpoint, after training)
mid=$WORK/$(python3 -c "print('/'.join(['e' * 200] * 18))")
expect_fail "run.dir too long for its checkpoints" "config key 'run\.dir' \(--set\): path too long" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$mid"
expect_fail "data.train too long" "config key 'data\.train' \(--set\): path too long \(4100 bytes" \
  "$L" train "$WORK/ok.yaml" --set data.train="$long"
expect_fail "generate: checkpoint path too long" "checkpoint: path too long \(4100 bytes" \
  "$L" generate "$long" --prompt x
expect_fail "eval: dataset path too long" "dataset directory: path too long \(4100 bytes" \
  "$L" data verify "$long"
sed "s#^output: .*#output: $long#" "$WORK/recipe.yaml" > "$WORK/longout.yaml"
expect_fail "data build: output too long" "longout\.yaml: output: path too long \(4100 bytes" \
  "$L" data build "$WORK/longout.yaml"

echo "all input-limit tests passed"
