#!/usr/bin/env bash
# MPI stays inside src/comm/ (DESIGN.md 10, docs/distributed.md "MPI stays in src/comm"):
#   1. no C file outside src/comm/ (src, include, tests, bench) includes <mpi.h> or names an
#      MPI identifier (MPI_*, PMPI_*) in its code (comments and string literals do not count);
#   2. include/loom/comm.h compiles on its own without MPI's include directories;
#   3. the build gives MPI's include directories to src/comm/ only (CMakeLists.txt), so a
#      file elsewhere that included <mpi.h> would not compile: a probe source compiled with
#      the flags of libloom's other sources fails on <mpi.h>.
source "$(dirname "$0")/lib.sh"
cd "$LOOM_SRC"

bad=""
while IFS= read -r -d '' f; do
    # an #include of mpi.h in any form
    if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]mpi\.h[>"]' "$f" >"$WORK/hit"; then
        bad+="$f: $(head -1 "$WORK/hit")"$'\n'
        continue
    fi
    # MPI identifiers in code: comments removed by the preprocessor (no includes expanded),
    # string literals blanked
    gcc -fpreprocessed -dD -E -P -x c "$f" 2>"$WORK/cpp.err" >"$WORK/code" ||
        fail "cannot read $f as C: $(head -3 "$WORK/cpp.err")"
    if sed -E 's/"([^"\\]|\\.)*"/""/g' "$WORK/code" | grep -nE '\b(P?MPI_[A-Za-z0-9_]+)\b' >"$WORK/hit"; then
        bad+="$f: $(head -1 "$WORK/hit")"$'\n'
    fi
done < <(find src include tests bench -type f \( -name '*.c' -o -name '*.h' \) \
              -not -path 'src/comm/*' -print0 | sort -z)
[ -z "$bad" ] || fail "MPI used outside src/comm/ (keep it behind include/loom/comm.h):
$bad"
n=$(find src include tests bench -type f \( -name '*.c' -o -name '*.h' \) -not -path 'src/comm/*' | wc -l)
[ "$n" -gt 50 ] || fail "only $n C files scanned: wrong directory?"
pass "no MPI outside src/comm/ ($n C files scanned)"

# a file that does use MPI is caught (the check itself works)
mkdir -p "$WORK/probe"
printf '/* MPI_Comm in a comment is fine */\nstatic const char *s = "MPI_Abort";\nint f(void) { return MPI_SUCCESS; }\n' >"$WORK/probe/p.c"
gcc -fpreprocessed -dD -E -P -x c "$WORK/probe/p.c" | sed -E 's/"([^"\\]|\\.)*"/""/g' |
    grep -qE '\bMPI_SUCCESS\b' || fail "the identifier scan misses MPI_SUCCESS"
! gcc -fpreprocessed -dD -E -P -x c "$WORK/probe/p.c" | sed -E 's/"([^"\\]|\\.)*"/""/g' |
    grep -qE '\bMPI_(Comm|Abort)\b' || fail "the identifier scan counts comments or strings"
pass "the scan finds MPI identifiers in code and ignores comments and strings"

# the public header needs no MPI
expect_ok "include/loom/comm.h compiles without MPI's headers" \
    gcc -std=c11 -fsyntax-only -Wall -Wextra -Werror -Iinclude -x c include/loom/comm.h

# the build's flags: MPI's include directory only on src/comm/ files
mpi_inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
[ -n "$mpi_inc" ] && [ -f "$mpi_inc/mpi.h" ] || fail "no MPI include directory from mpicc --showme:incdirs"
echo '#include <mpi.h>' >"$WORK/probe/uses_mpi.c"
bdir=$(dirname "$LOOM_BIN")
flags=$(find "$bdir" -path '*loom_objs.dir/flags.make' | head -1)
[ -n "$flags" ] || fail "no loom_static flags.make under $bdir"
# C_INCLUDES is what every libloom source gets; src/comm's extra directories are per file
inc=$(sed -n 's/^C_INCLUDES = //p' "$flags")
echo "$inc" | grep -q "$mpi_inc" && fail "libloom's sources all see $mpi_inc (C_INCLUDES in $flags)"
# shellcheck disable=SC2086
! gcc -fsyntax-only $inc "$WORK/probe/uses_mpi.c" 2>"$WORK/err.txt" ||
    fail "a libloom source outside src/comm/ could include <mpi.h>"
grep -q "mpi.h" "$WORK/err.txt" || fail "probe failed for another reason: $(cat "$WORK/err.txt")"
grep -q "$mpi_inc" "$flags" || fail "src/comm/ files get no MPI include directory ($flags)"
pass "only src/comm/ compiles with MPI's headers ($mpi_inc)"
echo PASS
