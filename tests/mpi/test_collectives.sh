#!/usr/bin/env bash
# Checked collectives under mpirun: allreduce (sum/max, f32/f64), reduce-scatter and allgather
# (divisible and not), broadcast, alltoall, barrier, non-blocking variants, on every group of
# several layouts, results compared with the expected values by the driver; ring-byte stats.
source "$(dirname "$0")/lib.sh"
check() {
  local np=$1; shift
  run_mpi "$np" "$WORK/c" "$COMM_DRIVER" coll "$@"
  [ $RC -eq 0 ] || { cat "$WORK/c" >&2; fail "collectives np=$np $*: exit $RC"; }
  [ "$(grep -c 'collectives ok on 8 groups' "$WORK/c")" = "$np" ] || { cat "$WORK/c" >&2; fail "collectives np=$np $*: not every rank ok"; }
  pass "collectives np=$np $* (${SECS}s)"
}
check 2
check 3                     # every count (7, 1001, ...) is uneven over 3 ranks
check 4 tp=2                # world, tp and dp groups of 2
check 4 cp=2 ep=2 experts=2 # ep/edp/dpcp groups
# world of one under mpirun (MPI up, groups of one)
check 1
echo "PASS"
