#!/usr/bin/env bash
# Host staging (loom_comm_set_device, docs/distributed.md "Device buffers"): tests/mpi's
# collective checks (comm_driver coll: every collective, divisible and not, in place, the
# non-blocking ones, alltoall(v), broadcast, point-to-point, stats, on every group of several
# layouts) on a backend's buffers, filled and read through mem_h2d / mem_d2h only:
#   - cpu-guard with LOOM_COMM_STAGE=1: its memory faults on any host access outside its own
#     copies, so a collective that handed a device buffer to MPI instead of its bounce buffer
#     ends the run at that access;
#   - cpu-guard without it: the direct path inside the backend's window (as the trainer has it);
#   - cuda-emu (staged by default: its memory stands for a GPU's), through comm_driver_dev.
source "$(dirname "$0")/lib.sh"
COMM_DRIVER_DEV=${COMM_DRIVER_DEV:-$LOOM_SRC/build/tests/comm_driver_dev}
[ -x "$COMM_DRIVER_DEV" ] || fail "comm driver (libloom) not built: $COMM_DRIVER_DEV"
# check DRIVER BACKEND PATH NP [layout...]
check() {
  local drv=$1 be=$2 path=$3 np=$4; shift 4
  run_mpi "$np" "$WORK/c" "$drv" coll backend="$be" "$@"
  [ $RC -eq 0 ] || { cat "$WORK/c" >&2; fail "$be np=$np $*: exit $RC"; }
  [ "$(grep -c 'collectives ok on 8 groups' "$WORK/c")" = "$np" ] || { cat "$WORK/c" >&2; fail "$be np=$np $*: not every rank ok"; }
  [ "$(grep -c "$be buffers, path $path\$" "$WORK/c")" = "$np" ] || { cat "$WORK/c" >&2; fail "$be np=$np $*: not the $path path"; }
  if [ "$path" = staged ]; then
    [ "$(grep -c 'staged through host memory' "$WORK/c")" = 1 ] || { cat "$WORK/c" >&2; fail "$be np=$np $*: staging not said once in the log"; }
  fi
  pass "$be ($path) np=$np $* (${SECS}s)"
}
export LOOM_COMM_STAGE=1
check "$COMM_DRIVER" cpu-guard staged 2
check "$COMM_DRIVER" cpu-guard staged 3                     # every count uneven over 3 ranks
check "$COMM_DRIVER" cpu-guard staged 4 cp=2 ep=2 experts=2
check "$COMM_DRIVER" cpu-guard staged 1                     # MPI up, groups of one: mem_d2d
unset LOOM_COMM_STAGE
check "$COMM_DRIVER" cpu-guard direct 2
check "$COMM_DRIVER_DEV" cuda-emu staged 2
check "$COMM_DRIVER_DEV" cuda-emu staged 4 tp=2
# a world of one without MPI: every group local, copies through the backend
out=$("$COMM_DRIVER_DEV" single backend=cuda-emu 2>&1) || { echo "$out" >&2; fail "cuda-emu single: exit"; }
grep -q "world of one ok without MPI" <<<"$out" || { echo "$out" >&2; fail "cuda-emu single"; }
pass "cuda-emu (staged) world of one without MPI"
# bad input: a switch that is neither 0 nor 1
LOOM_COMM_STAGE=yes run_mpi 2 "$WORK/c" "$COMM_DRIVER" coll backend=cpu-guard
[ $RC -ne 0 ] && grep -q "LOOM_COMM_STAGE=yes: expected 0 or 1" "$WORK/c" || { cat "$WORK/c" >&2; fail "LOOM_COMM_STAGE=yes accepted"; }
pass "LOOM_COMM_STAGE=yes refused"
echo "PASS"
