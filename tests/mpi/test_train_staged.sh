#!/usr/bin/env bash
# Two ranks on one device, host-staged (docs/distributed.md "Device buffers"): training on the
# cuda-emu backend (the CUDA kernels run by the emulator; its meshes stage every collective
# through host memory over MPI, as cuda ranks that share a GPU do) with dp 2 (ZeRO-1: the
# gradients reduce-scattered, the parameters all-gathered), with tp 2 and with pp 2 (1F1B: the
# pipeline's pre-posted receives and its sends, staged point-to-point) equals one cuda-emu
# process, step by step (fp32: 1e-5 relative, the layouts' summation orders), and the log says
# once that the collectives are staged.
source "$(dirname "$0")/lib.sh"
make_dataset "$WORK"
export LOOM_BACKEND=cuda-emu
train() { # train NAME NP SETS...
  local name=$1 np=$2; shift 2
  make_config "$WORK" "$WORK/$name.yaml" "$WORK/$name"
  run_mpi "$np" "$WORK/log_$name" "$LOOM_BIN" train "$WORK/$name.yaml" --set training.steps=4 \
    --set checkpoint.every=0 --set eval.every=0 "$@"
  [ $RC -eq 0 ] || { cat "$WORK/log_$name" >&2; fail "$name: exit $RC"; }
}
train one 1
train dp2 2 --set parallel.dp=2 --set parallel.zero=1
[ "$(grep -c 'collectives on cuda-emu buffers are staged through host memory' "$WORK/log_dp2")" = 1 ] ||
  { cat "$WORK/log_dp2" >&2; fail "dp 2: staging not said once in the log"; }
compare_losses "$WORK/one" "$WORK/dp2" 1e-5 || fail "dp 2 staged on cuda-emu left one process"
compare_losses "$WORK/one" "$WORK/dp2" 1e-5 1 grad_norm || fail "dp 2 staged: grad norms"
pass "dp 2 (ZeRO-1) staged on cuda-emu == one process (${SECS}s)"
train tp2 2 --set parallel.tp=2 --set parallel.dp=1
compare_losses "$WORK/one" "$WORK/tp2" 1e-5 || fail "tp 2 staged on cuda-emu left one process"
pass "tp 2 staged on cuda-emu == one process (${SECS}s)"
train pp2 2 --set parallel.pp=2 --set parallel.dp=1 --set parallel.microbatches=2 --set parallel.pp_schedule=1f1b
compare_losses "$WORK/one" "$WORK/pp2" 1e-5 || fail "pp 2 staged on cuda-emu left one process"
pass "pp 2 (1F1B, 2 micro-batches) staged on cuda-emu == one process (${SECS}s)"
echo "PASS"
