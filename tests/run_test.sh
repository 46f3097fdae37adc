#!/usr/bin/env bash
# tests/run_test.sh CATEGORY COMMAND [ARGS...]: how CTest runs every test (tests/CMakeLists.txt).
#
# Nothing in `make test` is skipped silently. `make test` installs every tool the tests need
# (clang, Slurm, the PyPI references), so a missing one fails its test. The only way to skip is
# the explicit opt-out LOOM_TEST_SKIP, a comma-separated list of categories:
#
#   unit reference e2e mpi slurm fuzz gpu   a whole category: its tests exit 77 before they start
#                                       (also used inside a test for one part of it: e.g. the
#                                       BPE checks of the data tests against Hugging Face
#                                       `tokenizers` are the category `reference`)
#
# A skipped test exits 77, which CTest reports as "(Skipped)" under "The following tests did
# not run". A test that skips only a part of itself records why (tests/skip_lib.sh) and still
# runs the rest; when the rest passes, it is reported as skipped with the parts it left out.
# The gpu tests (tests/gpu) skip themselves where no GPU is visible or the build has no CUDA
# backend: they record the reason (the category gpu) as a part left out, reported the same way.
# An exit 77 without an opt-out behind it (a test or a tool returning 77 on its own) is a
# failure, as is an unknown category in LOOM_TEST_SKIP.
set -uo pipefail
known="unit reference e2e mpi slurm fuzz gpu"
cat=${1:?usage: run_test.sh CATEGORY COMMAND...}
shift
case " $known " in *" $cat "*) ;; *) echo "run_test: FAIL: unknown test category '$cat'"; exit 1 ;; esac

IFS=',' read -ra opted <<<"${LOOM_TEST_SKIP:-}"
for w in "${opted[@]}"; do
    w=${w//[[:space:]]/}
    [ -n "$w" ] || continue
    case " $known " in
    *" $w "*) ;;
    *) echo "run_test: FAIL: LOOM_TEST_SKIP=$LOOM_TEST_SKIP names an unknown category '$w' (known: ${known// /, })"
       exit 1 ;;
    esac
    if [ "$w" = "$cat" ]; then
        echo "run_test: SKIP: LOOM_TEST_SKIP=$LOOM_TEST_SKIP opts out of the '$cat' tests: not run: $*"
        exit 77
    fi
done

LOOM_TEST_SKIPPED_FILE=$(mktemp /tmp/loom-test-skipped.XXXXXX)
export LOOM_TEST_SKIPPED_FILE
"$@"
rc=$?
skipped=$(cat "$LOOM_TEST_SKIPPED_FILE")
rm -f "$LOOM_TEST_SKIPPED_FILE"
if [ $rc -eq 77 ] && [ -z "$skipped" ]; then
    echo "run_test: FAIL: the test exited 77 (skip) without an opt-out in LOOM_TEST_SKIP: a missing tool is a failure"
    exit 1
fi
if [ -n "$skipped" ]; then
    [ $rc -eq 0 ] || [ $rc -eq 77 ] || exit $rc
    echo "run_test: SKIP: every other check passed; left out (LOOM_TEST_SKIP=${LOOM_TEST_SKIP:-}, or no GPU):"
    printf '%s\n' "$skipped" | sed 's/^/run_test:   /'
    exit 77
fi
exit $rc
