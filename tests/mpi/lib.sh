# Shared helpers for the MPI tests (sourced). COMM_DRIVER is tests/mpi/comm_driver's binary.
# The e2e helpers come with them (LOOM_SRC, LOOM_BIN, $WORK, fail, pass, expect_fail,
# make_dataset, ...).
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"
COMM_DRIVER=${COMM_DRIVER:-$LOOM_SRC/build/tests/comm_driver}
[ -x "$COMM_DRIVER" ] || { echo "FAIL: comm driver not built: $COMM_DRIVER" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (Debian package openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$LOOM_SRC/tests/mpi/lsan.supp:print_suppressions=0}

# run_mpi NP OUTFILE args...: mpirun -np NP under `timeout 90` (a hang fails instead of hanging
# CI); sets RC (exit status) and SECS (wall seconds).
run_mpi() {
  local np=$1 out=$2; shift 2
  local t0=$SECONDS
  RC=0
  timeout -k 5 90 mpirun -np "$np" --oversubscribe "$@" >"$out" 2>&1 || RC=$?
  SECS=$((SECONDS - t0))
  # (exit codes can't tell: mpirun itself returns 137 when a rank was SIGKILLed)
  [ $SECS -lt 89 ] || { cat "$out" >&2; fail "mpirun -np $np $* hung (killed by timeout after ${SECS}s)"; }
}

# must_fail_within WHAT LIMIT_S REGEX NP args...: the job must exit non-zero within LIMIT_S
# seconds and its output must match REGEX.
must_fail_within() {
  local what=$1 limit=$2 pattern=$3 np=$4; shift 4
  run_mpi "$np" "$WORK/out" "$@"
  [ $RC -ne 0 ] || { cat "$WORK/out" >&2; fail "$what: mpirun exited 0"; }
  [ $SECS -le "$limit" ] || { cat "$WORK/out" >&2; fail "$what: took ${SECS}s (limit ${limit}s)"; }
  grep -qE "$pattern" "$WORK/out" || { cat "$WORK/out" >&2; fail "$what: output does not match /$pattern/"; }
  pass "$what: exit $RC after ${SECS}s: $(grep -E "$pattern" "$WORK/out" | head -1)"
}
