#!/usr/bin/env bash
# CI (.ci/run): the tests labelled `levels` (every reference test against PyTorch / Hugging Face,
# and the end-to-end tests that train and compare results or learn) again at each kernel level
# below this CPU's own, so that a test holding only on the developers' CPU fails here, not on
# the next machine. Each level also pins the libraries' own dispatch to a CPU of that kind:
# oneDNN (ONEDNN_MAX_CPU_ISA) and OpenBLAS (OPENBLAS_CORETYPE), as on a real AVX2-only (e.g.
# AMD Zen 3) or baseline x86-64 node. `make test` has run everything at the CPU's own level.
#   scripts/ci_levels.sh [BUILD_DIR]   (default build; needs a `make test` build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
top=$("$build/loom" version | sed -n 's/.*this CPU supports up to \([a-z0-9-]*\)).*/\1/p')
[ -n "$top" ] || { echo "ci_levels: FAIL: cannot read the CPU's level from '$build/loom version'"; exit 1; }
case $top in
avx512) levels="avx2 x86-64" ;;
avx2) levels="x86-64" ;;
*) levels="" ;;
esac
# CTest's cost data, as `make test` seeds it (the longest tests start first)
mkdir -p "$build/Testing/Temporary"
[ -f "$build/Testing/Temporary/CTestCostData.txt" ] || cp tests/ctest-costs.txt "$build/Testing/Temporary/CTestCostData.txt"
rc=0
for isa in $levels; do
  # What CI leaves out below the CPU's own level, to stay within its 30 minutes (the whole
  # suite has run at the CPU's own level in `make test`):
  #  - the two learning tests, the tool-use test (the suite's longest: some 5 minutes at avx2,
  #    12 at x86-64) and the byte classifier (1 and 2.5 minutes): their margins at both levels
  #    were measured by hand (tests/e2e/test_tooluse.sh's table, docs/build.md), and on an
  #    AVX2-only machine `make test` runs them at avx2, its own level;
  #  - at x86-64 also the whole-model comparisons with transformers over every family
  #    (test_hf_families, test_infer_hf, test_infer_bf16, test_infer_bf16c: 1-2 minutes each
  #    there, oneDNN's SSE4.1 GEMMs): avx2 runs them, and the x86-64 kernels they would call
  #    are checked against the other levels by the unit and reference kernel tests run there
  case $isa in
  avx2) dnnl=AVX2 blas=Haswell skip='^e2e/test_(tooluse|byte_classifier)$' ;;
  x86-64) dnnl=SSE41 blas=Prescott
    skip='^(e2e/test_(tooluse|byte_classifier)|reference/test_(hf_families|infer_hf|infer_bf16|infer_bf16c))$' ;;
  esac
  echo "== ci_levels: the 'levels' tests at LOOM_ISA=$isa (ONEDNN_MAX_CPU_ISA=$dnnl, OPENBLAS_CORETYPE=$blas; this CPU: $top)"
  # (CTest's summary, with its total time, is the last thing printed for each level)
  (cd "$build" && LOOM_ISA=$isa ONEDNN_MAX_CPU_ISA=$dnnl OPENBLAS_CORETYPE=$blas \
     ctest -L '^levels$' -E "$skip" -j 2 --output-on-failure) || rc=1
  # every test's output at this level (CTest's own log is overwritten by the next run)
  cp "$build/Testing/Temporary/LastTest.log" "$build/Testing/Temporary/levels-$isa.log" 2>/dev/null || true
done
[ -n "$levels" ] || echo "== ci_levels: this CPU's own level ($top) is the lowest: nothing more to run"
exit $rc
