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

# compare_losses REF RUN TOL [FROM_STEP [KEY]]: the losses (or metric KEY, e.g. grad_norm) of
# RUN/metrics.jsonl within TOL (relative) of REF's at every step of REF from FROM_STEP
# (default 1) on; prints the largest difference.
compare_losses() {
  python3 - "$@" <<'PY'
import json, sys
ref, run, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
start = int(sys.argv[4]) if len(sys.argv) > 4 else 1
key = sys.argv[5] if len(sys.argv) > 5 else 'loss'
a = {r['step']: r[key] for r in map(json.loads, open(ref + '/metrics.jsonl'))}
b = {r['step']: r[key] for r in map(json.loads, open(run + '/metrics.jsonl'))}
steps = [s for s in sorted(a) if s >= start]
missing = [s for s in steps if s not in b]
if not steps or missing: sys.exit(f"{run}: steps {missing or 'all'} missing")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
print(f"max relative {key} difference over steps {steps[0]}..{steps[-1]}: {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}
