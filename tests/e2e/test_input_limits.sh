#!/usr/bin/env bash
# Inputs beyond loom's limits get an error naming the key or file, never an abort: paths too
# long for loom's path buffers, a model that cannot fit in memory. Runs the ASan/UBSan binary.
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

# ---- memory: a layout that cannot fit is refused before anything is allocated or created
# (d_model=4096 n_layer=4096 aborted with "out of memory allocating 34403819904 bytes") ----
expect_fail "model too large for memory" \
  "model\.d_model=4096 model\.n_layer=4096 .*needs an estimated [0-9.]+ TiB of memory, but .* is available \((MemAvailable|the cgroup).*parameters .*AdamW moments" \
  timeout 60 "$L" train "$WORK/ok.yaml" --set run.dir="$WORK/big" --set model.d_model=4096 --set model.n_layer=4096
[ ! -e "$WORK/big" ] || fail "a refused run created its run directory"
# an explicit budget: the tiny model needs about 1 MiB (996 KiB: one gradient buffer at dp = 1)
expect_fail "training.memory_limit below the estimate" \
  "needs an estimated (9[0-9][0-9]\.[0-9] KiB|1\.[0-9] MiB) of memory, but 878\.9 KiB is available \(training\.memory_limit \(--set\)\)" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$WORK/small" --set training.memory_limit=900000
expect_fail "training.memory_limit not a size" "config key 'training\.memory_limit' = 'lots'" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$WORK/small" --set training.memory_limit=lots
expect_ok "training.memory_limit=off trusts the user" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$WORK/small" --set training.memory_limit=off --set training.steps=1
expect_ok "training.memory_limit above the estimate" \
  "$L" train "$WORK/ok.yaml" --set run.dir="$WORK/small2" --set training.memory_limit=2e6 --set training.steps=1

echo "all input-limit tests passed"
