#!/usr/bin/env bash
# Kernels are called through the backend op table (include/loom/backend.h, DESIGN.md 10,
# docs/engine.md "Backends"):
#   1. no C file of src/ outside src/kernels/ calls a kernel function of include/loom/kernels.h
#      directly (calls through a table, `be->matmul_forward(`, are fine; comments and string
#      literals do not count); the instruction-set level functions (loom_isa_*) are process
#      setup, not ops, and stay callable;
#   2. src/model/, src/parallel/ and src/train/ do not include loom/kernels.h at all;
#   3. every op of the table is set in the cpu backend (src/kernels/backend_cpu.c);
#   4. memory through the backend (docs/engine.md "Memory through the backend"): no arena is
#      allocated behind the backend's back in src/model, src/parallel, src/train, src/infer
#      (loom_alloc_aligned / posix_memalign / aligned_alloc), outside the files listed below as
#      not converted yet; no code of src/ outside src/kernels/ calls mem_d2h itself: host code
#      reads device memory through loom_dev_read, and the names of those reads are exactly the
#      rows of docs/engine.md's table of named host reads;
#   5. src/kernels/backend_guard_ops.h is what scripts/gen_guard_ops.py writes from backend.h.
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

# ... and in the CUDA backend (src/cuda/*.cu: each ops file fills its part as t->NAME = ...)
missing=""
while read -r op; do
    grep -qE "^[[:space:]]*t->$op[[:space:]]*=" src/cuda/*.cu || missing+=" $op"
done <"$WORK/ops"
[ -z "$missing" ] || fail "ops of loom_backend not set in the CUDA backend (src/cuda/*.cu):$missing"
pass "the cuda backend sets all $(wc -l <"$WORK/ops") ops"

# 4. arenas through the backend. Files not converted yet would be listed here (space-separated;
# the cpu-guard CI run would leave their tests out): none since the inference weight copies
# (--weights bf16 / int8 / int4, --compute bf16) went through mem_alloc LOOM_MEM_STREAMED.
unconverted=''
bad=""
while IFS= read -r -d '' f; do
    case " $unconverted " in *" $f "*) continue ;; esac
    bad+=$(code "$f" | grep -nE '(^|[^[:alnum:]_])(loom_alloc_aligned|posix_memalign|aligned_alloc)[[:space:]]*\(' | sed "s|^|$f:|" || true)
done < <(find src/model src/parallel src/train src/infer -type f -name '*.c' -print0 | sort -z)
[ -z "$bad" ] || fail "arenas allocated outside the backend's mem_alloc:
$bad"
for f in $unconverted; do [ -f "$f" ] || fail "$f (listed as not converted) does not exist: update the list"; done
pass "arenas in src/model, src/parallel, src/train, src/infer come from the backend${unconverted:+ (not yet: $unconverted)}"
# the check itself: an arena from loom_alloc_aligned is caught, one from mem_alloc is not
printf 'void f(const loom_backend *be) {\n    float *a = be->mem_alloc(64, 0);\n    float *b = loom_alloc_aligned (64);\n}\n' >"$WORK/probe_alloc.c"
code "$WORK/probe_alloc.c" | grep -nE '(^|[^[:alnum:]_])(loom_alloc_aligned|posix_memalign|aligned_alloc)[[:space:]]*\(' | grep -q ':' ||
    fail "the arena scan misses a loom_alloc_aligned call"
[ "$(code "$WORK/probe_alloc.c" | grep -cE '(^|[^[:alnum:]_])(loom_alloc_aligned|posix_memalign|aligned_alloc)[[:space:]]*\(')" = 1 ] ||
    fail "the arena scan counts mem_alloc"

bad=""
while IFS= read -r -d '' f; do
    bad+=$(code "$f" | grep -nE 'mem_d2h[[:space:]]*\(' | sed "s|^|$f:|" || true)
done < <(find src -type f \( -name '*.c' -o -name '*.h' \) -not -path 'src/kernels/*' -print0 | sort -z)
[ -z "$bad" ] || fail "device memory read with mem_d2h instead of loom_dev_read (a named read):
$bad"
# the names of the reads (each call's last argument, a string literal) and the docs' table
python3 - "$WORK/reads" "$WORK/doc_reads" <<'PY' || fail "cannot read the named host reads"
import pathlib, re, sys
names = set()
for f in sorted(pathlib.Path("src").rglob("*.c")):
    if f.parts[1] == "kernels":
        continue
    text = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)
    for m in re.finditer(r"\bloom_dev_read\s*\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        lit = re.findall(r'"([^"]*)"\s*$', text[m.end():i - 1])
        if not lit:
            sys.exit(f"{f}: a loom_dev_read without a literal name")
        names.add(lit[0])
doc = pathlib.Path("docs/engine.md").read_text()
sec = doc[doc.index("### Named host reads"):]
sec = sec[:sec.index("\n#", 4)] if "\n#" in sec[4:] else sec
rows = set(re.findall(r"^\| `([^`]+)` \|", sec, flags=re.M))
open(sys.argv[1], "w").write("\n".join(sorted(names)) + "\n")
open(sys.argv[2], "w").write("\n".join(sorted(rows)) + "\n")
PY
[ "$(wc -l <"$WORK/reads")" -ge 8 ] || fail "only $(wc -l <"$WORK/reads") named reads found in src/"
diff "$WORK/reads" "$WORK/doc_reads" >"$WORK/reads.diff" ||
    fail "the named host reads (<: in src/, >: in docs/engine.md's table) differ:
$(cat "$WORK/reads.diff")"
pass "host code reads device memory only through loom_dev_read, at the $(wc -l <"$WORK/reads") named reads docs/engine.md lists"

# 5. the guard's wrappers are the generator's output for this backend.h
python3 scripts/gen_guard_ops.py "$WORK/guard_ops.h" 2>/dev/null
cmp -s "$WORK/guard_ops.h" src/kernels/backend_guard_ops.h ||
    fail "src/kernels/backend_guard_ops.h is stale: run python3 scripts/gen_guard_ops.py"
pass "cpu-guard wraps every op of backend.h (backend_guard_ops.h up to date)"
echo PASS
