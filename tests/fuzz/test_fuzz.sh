#!/usr/bin/env bash
# Coverage-guided fuzzing of loom's untrusted-input parsers (libFuzzer + ASan + UBSan), run
# briefly as a test. See docs/fuzzing.md.
#
# Builds every tests/fuzz/fuzz_*.c target with clang against the loom sources it needs
# (src/base, src/data, the checkpoint files; compiled once into an archive, reused while the
# sources are unchanged), then runs each on a fresh copy of its seed corpus for a fixed time.
# Exits 1 when a target crashes, leaks, trips a sanitizer or times out (printing the input's
# path and the report) or when clang with libFuzzer is not available (`make test` installs it;
# LOOM_TEST_SKIP=fuzz is the opt-out, see tests/run_test.sh), 0 otherwise.
#
# Knobs (environment):
#   FUZZ_TIME=5          seconds per target
#   FUZZ_TARGETS="a b"   only these targets (names without fuzz_, e.g. "shard config")
#   FUZZ_JOBS=2          targets run at once
#   FUZZ_WORK=DIR        build + work directory (default: ./fuzz under the current directory,
#                        i.e. the ctest build dir); DIR/corpus/<target> keeps the grown corpus
#                        and DIR/crash/<target> the failing inputs of the last run
#   CC=clang             the compiler (must support -fsanitize=fuzzer)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${LOOM_SRC:-$(cd "$here/../.." && pwd)}
work=${FUZZ_WORK:-$PWD/fuzz}
fuzz_time=${FUZZ_TIME:-5}
jobs=${FUZZ_JOBS:-2}
cc=${CC:-clang}
case "$cc" in *clang*) ;; *) cc=clang ;; esac

missing() {
    echo "test_fuzz: FAIL: $*"
    echo "test_fuzz: install the Debian packages 'clang' and 'libclang-rt-14-dev' (scripts/setup.sh --test)," \
        "or opt out with LOOM_TEST_SKIP=fuzz"
    exit 1
}
fail() {
    echo "test_fuzz: FAIL: $*"
    exit 1
}

command -v "$cc" >/dev/null 2>&1 || missing "no $cc"
mkdir -p "$work/obj" || fail "cannot create $work"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
    >"$work/probe.c"
"$cc" -fsanitize=fuzzer,address,undefined "$work/probe.c" -o "$work/probe" >"$work/probe.log" 2>&1 ||
    missing "$cc cannot link a libFuzzer target: $(head -c 400 "$work/probe.log")"

pkgs="yaml-0.1 jansson libcrypto libpcre2-8 icu-uc libzstd"
pkg_cflags=$(pkg-config --cflags $pkgs) || fail "pkg-config: missing one of $pkgs (run scripts/setup.sh)"
pkg_libs=$(pkg-config --libs $pkgs) || fail "pkg-config: missing one of $pkgs"
# mpi.h only (ckpt_pieces.h includes the parallel/comm headers); nothing calls MPI
mpi_cflags=$(pkg-config --cflags mpi 2>/dev/null || pkg-config --cflags ompi-c 2>/dev/null ||
             mpicc --showme:compile 2>/dev/null) || fail "no MPI headers (run scripts/setup.sh)"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cflags="-std=c11 -g -O1 -fopenmp $san -I$src/include -I$src/src -I$here $pkg_cflags $mpi_cflags"
warn="-Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter"

# ---- the library: base, data, checkpoint + pieces, compiled once with coverage ------------
lib_srcs=("$src"/src/base/*.c "$src"/src/data/*.c "$src/src/ckpt/checkpoint.c"
          "$src/src/ckpt/ckpt_pieces.c" "$src"/src/infer/grammar*.c "$here/fuzz_stubs.c")
stamp=$( { echo "$cc $cflags"; "$cc" --version | head -1;
           cat "${lib_srcs[@]}" "$src"/include/loom/*.h "$src"/src/data/*.h "$src"/src/base/*.h "$src"/src/infer/grammar_internal.h 2>/dev/null; } |
         sha256sum | cut -c1-64)
lib="$work/libloomfuzz.a"
if [ ! -f "$lib" ] || [ "$(cat "$work/lib.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "test_fuzz: compiling ${#lib_srcs[@]} loom sources with $cc (libFuzzer coverage, ASan, UBSan)"
    rm -f "$work"/obj/*.o "$lib"
    t0=$SECONDS
    printf '%s\n' "${lib_srcs[@]}" |
        xargs -P "$jobs" -I{} sh -c 'o="$1/obj/$(basename "$(dirname "$2")")_$(basename "$2" .c).o";
            '"$cc"' '"$cflags $warn"' -fsanitize=fuzzer-no-link -c "$2" -o "$o" 2>"$o.log" ||
            { cat "$o.log"; exit 255; }' _ "$work" {} ||
        fail "compiling the loom sources with $cc failed (see above)"
    cat "$work"/obj/*.log
    ar rcs "$lib" "$work"/obj/*.o || fail "ar failed"
    echo "$stamp" >"$work/lib.stamp"
    echo "test_fuzz: library compiled in $((SECONDS - t0)) s"
fi

# ---- the targets and the seed generator -----------------------------------------------------
all_targets=()
for f in "$here"/fuzz_*.c; do
    n=$(basename "$f" .c)
    case "$n" in fuzz_stubs | fuzz_seeds) continue ;; esac
    all_targets+=("${n#fuzz_}")
done
targets=(${FUZZ_TARGETS:-${all_targets[@]}})
link_libs="$lib $pkg_libs -fopenmp -lm"
build_one() { # name source extra-flags...
    local out=$1 csrc=$2
    shift 2
    if [ ! -x "$out" ] || [ "$csrc" -nt "$out" ] || [ "$here/fuzz_common.h" -nt "$out" ] || [ "$lib" -nt "$out" ]; then
        "$cc" $cflags $warn "$@" "$csrc" $link_libs -o "$out" >"$out.log" 2>&1 ||
            { cat "$out.log"; fail "building $(basename "$csrc") failed"; }
        if grep -q warning "$out.log"; then cat "$out.log"; fi
    fi
}
for t in "${targets[@]}"; do
    [ -f "$here/fuzz_$t.c" ] || fail "no target tests/fuzz/fuzz_$t.c"
    build_one "$work/fuzz_$t" "$here/fuzz_$t.c" -fsanitize=fuzzer
done
build_one "$work/fuzz_seeds" "$here/fuzz_seeds.c" -fsanitize=fuzzer-no-link

# ---- seed corpora: the committed seeds + generated ones + the repo's configs and recipes ----
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=0:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMP_NUM_THREADS=1
gen="$work/gen"
rm -rf "$gen" "$work/tmp"
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"
"$work/fuzz_seeds" "$gen" >"$work/seeds.log" 2>&1 || { cat "$work/seeds.log"; fail "fuzz_seeds failed"; }

run_one() { # target -> 0 ok, 1 finding
    local t=$1 c="$work/corpus/$t" a="$work/crash/$t"
    rm -rf "$c" "$a"
    mkdir -p "$c" "$a"
    [ -d "$here/corpus/$t" ] && cp "$here/corpus/$t"/* "$c"/ 2>/dev/null
    [ -d "$gen/$t" ] && cp "$gen/$t"/* "$c"/
    case "$t" in
    config) cp "$src"/configs/*.yaml "$c"/ 2>/dev/null ;;
    recipe) cp "$src"/recipes/*.yaml "$c"/ 2>/dev/null ;;
    esac
    "$work/fuzz_$t" -max_total_time="$fuzz_time" -rss_limit_mb=2048 -timeout=5 -max_len=65536 \
        -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
        -artifact_prefix="$a/" "$c" >"$work/$t.log" 2>&1
    local rc=$?
    local stats
    stats=$(grep -a -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$work/$t.log" | tail -1)
    if [ $rc -ne 0 ] || [ -n "$(ls -A "$a")" ]; then
        echo "test_fuzz: $t: FINDING (exit $rc)"
        for f in "$a"/*; do [ -e "$f" ] && echo "test_fuzz: $t: failing input: $f"; done
        echo "----- $t: the report (tail of $work/$t.log) -----"
        grep -a -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|INITED)' "$work/$t.log" | tail -60
        echo "-----"
        return 1
    fi
    echo "test_fuzz: $t: ok ($fuzz_time s, $(ls "$c" | wc -l) inputs in corpus; $stats)"
    return 0
}

failed=()
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    rm -f "$work/$t.rc"
    { run_one "$t" >"$work/$t.result" 2>&1; echo $? >"$work/$t.rc"; } &
done
wait
for t in "${targets[@]}"; do
    cat "$work/$t.result"
    [ "$(cat "$work/$t.rc" 2>/dev/null)" = 0 ] || failed+=("$t")
done
rm -rf "$work/tmp"
if [ ${#failed[@]} -gt 0 ]; then
    fail "fuzz targets with findings: ${failed[*]} (reproduce: $work/fuzz_<target> <input>)"
fi
echo "test_fuzz: all ${#targets[@]} targets ran ${fuzz_time} s each without a finding"
exit 0
