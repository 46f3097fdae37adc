#!/usr/bin/env bash
# Nothing in `make test` is skipped silently (tests/run_test.sh): a missing tool fails its test;
# LOOM_TEST_SKIP=category,... is the only opt-out, and what it leaves out is reported as
# skipped (exit 77, which CTest lists as "(Skipped)"), by name.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
RUN=$LOOM_SRC/tests/run_test.sh
cd "$WORK"

# run_expect WANT_RC REGEX what env-and-command...: run under run_test.sh, check exit and output
run_expect() {
  local want=$1 pattern=$2 what=$3; shift 3
  local rc=0
  env "$@" >out.txt 2>&1 || rc=$?
  [ $rc -eq "$want" ] || { cat out.txt >&2; fail "$what: exit $rc, expected $want"; }
  grep -qE -- "$pattern" out.txt || { cat out.txt >&2; fail "$what: output does not match /$pattern/"; }
  pass "$what (exit $rc): $(grep -E -- "$pattern" out.txt | head -1)"
}

# the fuzz test without clang: a failure that says how to install it or opt out, not a skip
noclang=$WORK/no-such-dir/clang
run_expect 1 "FAIL: no $noclang" "fuzz test without clang fails" \
  -u LOOM_TEST_SKIP CC="$noclang" FUZZ_WORK="$WORK/fuzz" bash "$RUN" fuzz bash "$LOOM_SRC/tests/fuzz/test_fuzz.sh"
grep -q "LOOM_TEST_SKIP=fuzz" out.txt || fail "the failure does not name the opt-out"
# ... and the opt-out skips it before it starts (nothing is built)
run_expect 77 "SKIP: LOOM_TEST_SKIP=slurm,fuzz opts out of the 'fuzz' tests" "LOOM_TEST_SKIP=slurm,fuzz skips the fuzz test" \
  LOOM_TEST_SKIP=slurm,fuzz CC="$noclang" FUZZ_WORK="$WORK/fuzz2" bash "$RUN" fuzz bash "$LOOM_SRC/tests/fuzz/test_fuzz.sh"
[ ! -e "$WORK/fuzz2" ] || fail "the skipped fuzz test ran"
run_expect 77 "opts out of the 'slurm' tests" "LOOM_TEST_SKIP=slurm,fuzz skips the slurm test" \
  LOOM_TEST_SKIP=" slurm, fuzz" bash "$RUN" slurm bash "$LOOM_SRC/tests/slurm/test_slurm_job.sh"
# another category runs
run_expect 0 "^ran$" "LOOM_TEST_SKIP=fuzz does not skip a unit test" LOOM_TEST_SKIP=fuzz bash "$RUN" unit echo ran
# a typo is an error, not a silent run
run_expect 1 "unknown category 'slrum'" "unknown category in LOOM_TEST_SKIP" \
  LOOM_TEST_SKIP=slrum bash "$RUN" unit echo ran

# exit 77 without an opt-out (a tool or test returning 77 on its own) is a failure
run_expect 1 "exited 77 \(skip\) without an opt-out" "exit 77 without an opt-out fails" \
  -u LOOM_TEST_SKIP bash "$RUN" e2e bash -c 'exit 77'

# part of a test (skip_part): recorded, the rest still runs, the test ends as skipped naming it
cat > part.sh <<'SH'
set -euo pipefail
source "$LOOM_SRC/tests/skip_lib.sh"
if ! skip_part reference "the comparison with a PyPI reference"; then echo "reference part ran"; fi
echo "rest ran"
SH
run_expect 77 "run_test:   reference: the comparison with a PyPI reference" "skip_part under LOOM_TEST_SKIP=reference" \
  LOOM_TEST_SKIP=reference LOOM_SRC="$LOOM_SRC" bash "$RUN" e2e bash part.sh
grep -q "rest ran" out.txt || fail "skip_part: the rest of the test did not run"
! grep -q "reference part ran" out.txt || fail "skip_part: the skipped part ran"
run_expect 0 "reference part ran" "skip_part without the opt-out runs the part" \
  -u LOOM_TEST_SKIP LOOM_SRC="$LOOM_SRC" bash "$RUN" e2e bash part.sh
# a failure in the rest is still a failure
printf 'source "$LOOM_SRC/tests/skip_lib.sh"\nskip_part reference x || true\nexit 3\n' > partfail.sh
run_expect 3 "" "a failing test with a skipped part fails" \
  LOOM_TEST_SKIP=reference LOOM_SRC="$LOOM_SRC" bash "$RUN" e2e bash partfail.sh

# CTest lists the skipped tests in its summary: the real test definitions of this build
ctf=$(dirname "$LOOM_BIN")/tests/CTestTestfile.cmake
[ -f "$ctf" ] || fail "no $ctf (the build's test definitions)"
mkdir ctest && cp "$ctf" ctest/
rc=0
(cd ctest && LOOM_TEST_SKIP=fuzz,slurm ctest -R '^(fuzz/test_fuzz|slurm/test_slurm_job)$' >../ctest.txt 2>&1) || rc=$?
grep -q "The following tests did not run" ctest.txt && grep -qE "fuzz/test_fuzz \(Skipped\)" ctest.txt &&
  grep -qE "slurm/test_slurm_job \(Skipped\)" ctest.txt || { cat ctest.txt >&2; fail "ctest does not list the opted-out tests as skipped"; }
grep -q "100% tests passed\|0 tests failed" ctest.txt || { cat ctest.txt >&2; fail "a skipped test counted as failed (ctest exit $rc)"; }
pass "ctest summary: fuzz/test_fuzz and slurm/test_slurm_job (Skipped)"
echo "all skip/opt-out checks passed"
