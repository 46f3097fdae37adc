#!/usr/bin/env bash
# Kernels are called through the backend op table (include/loom/backend.h, DESIGN.md 10,
# docs/engine.md "Backends"):
#   1. no C file of src/ outside src/kernels/ calls a kernel function of include/loom/kernels.h
#      directly (calls through a table, `be->matmul_forward(`, are fine; comments and string
#      literals do not count); the instruction-set level functions (loom_isa_*) are process
#      setup, not ops, and stay callable;
#   2. src/model/, src/parallel/ and src/train/ do not include loom/kernels.h at all;
#   3. every op of the table is set in the cpu backend (src/kernels/backend_cpu.c).
source "$(dirname "$0")/lib.sh"
cd "$LOOM_SRC"

code() { # C code of $1 without comments, string literals blanked
    gcc -fpreprocessed -dD -E -P -x c "$1" 2>"$WORK/cpp.err" | sed -E 's/"([^"\\]|\\.)*"/""/g' ||
        fail "cannot read $1 as C: $(head -3 "$WORK/cpp.err")"
}

# the kernel functions: every function kernels.h declares (a type, a name, an open paren)
code include/loom/kernels.h | grep -v "^[[:space:]]*#" | tr '\n' ' ' | tr ';' '\n' |
    sed -nE 's/^[[:space:]]*(const[[:space:]]+)?[a-z_0-9]+[[:space:]*]+([a-z_][a-z_0-9]*)[[:space:]]*\(.*/\2/p' |
    grep -v '^loom_isa_' | sort -u >"$WORK/kernels"
n=$(wc -l <"$WORK/kernels")
[ "$n" -ge 25 ] || fail "only $n kernel functions found in include/loom/kernels.h: $(tr '\n' ' ' <"$WORK/kernels")"
for k in matmul_forward flash_attention_backward adamw_update crossentropy_forward rope_tables; do
    grep -qx "$k" "$WORK/kernels" || fail "$k not among the kernels read from kernels.h"
done
pat="(^|[^.>[:alnum:]_])($(paste -sd'|' "$WORK/kernels"))[[:space:]]*\\("

scan() { # prints file:line of direct kernel calls in $1
    code "$1" | { grep -E "$pat" || true; } | sed "s|^|$1: |"
}

bad=""
while IFS= read -r -d '' f; do
    bad+=$(scan "$f")
done < <(find src -type f \( -name '*.c' -o -name '*.h' \) -not -path 'src/kernels/*' -print0 | sort -z)
[ -z "$bad" ] || fail "kernels called directly instead of through the backend table (loom_backend):
$bad"
files=$(find src -type f \( -name '*.c' -o -name '*.h' \) -not -path 'src/kernels/*' | wc -l)
[ "$files" -gt 30 ] || fail "only $files C files scanned: wrong directory?"
pass "no direct kernel calls outside src/kernels/ ($files files, $n kernels)"

inc=$(grep -lE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]loom/kernels\.h[>"]' \
      src/model/* src/parallel/* src/train/* 2>/dev/null || true)
[ -z "$inc" ] || fail "include loom/backend.h, not loom/kernels.h: $inc"
pass "src/model, src/parallel and src/train include no kernels.h"

# the check itself: a direct call is caught, a table call and a comment are not
mkdir -p "$WORK/probe"
printf '/* matmul_forward(x) in a comment */\nstatic const char *s = "adamw_update(";\nvoid f(const loom_backend *be) { be->matmul_forward(0); }\n' >"$WORK/probe/ok.c"
[ -z "$(scan "$WORK/probe/ok.c")" ] || fail "the scan counts table calls, comments or strings: $(scan "$WORK/probe/ok.c")"
printf 'void f(float *x) {\n    double s = sum_squares (x, 4);\n}\n' >"$WORK/probe/bad.c"
scan "$WORK/probe/bad.c" | grep -q "sum_squares" || fail "the scan misses a direct sum_squares call"
pass "the scan finds direct calls and ignores table calls, comments and strings"

# every op of the table is set in the cpu backend
code include/loom/backend.h | grep -oE '\(\*[a-z_0-9]+\)' | tr -d '(*)' | sort -u >"$WORK/ops"
[ "$(wc -l <"$WORK/ops")" -ge 25 ] || fail "only $(wc -l <"$WORK/ops") ops read from backend.h"
missing=""
while read -r op; do
    grep -qE "^[[:space:]]*\.$op[[:space:]]*=" src/kernels/backend_cpu.c || missing+=" $op"
done <"$WORK/ops"
[ -z "$missing" ] || fail "ops of loom_backend not set in src/kernels/backend_cpu.c:$missing"
pass "the cpu backend sets all $(wc -l <"$WORK/ops") ops"
echo PASS
