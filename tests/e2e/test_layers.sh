#!/usr/bin/env bash
# The layers (docs/architecture.md "Modules", DESIGN.md 2): every #include of src/ and
# include/loom/ (public headers by the module that owns them, private headers only within their
# folder) and every external library call (BLAS, oneDNN, MPI, OpenMP, jansson, libyaml, OpenSSL,
# ICU, xxhash, PCRE2, zstd, sockets, HTTP) against the table of tests/e2e/check_layers.py, which
# names the file, the line and the rule of each break. Then the check itself: a copy of the tree
# with one bad include, one library call out of place and one private header used from another
# module must fail, naming each; a mention in a comment or a string must not; and a file over
# 1,000 lines must say why it is one file (or be listed to be split).
source "$(dirname "$0")/lib.sh"
cd "$LOOM_SRC"
CHECK="python3 $LOOM_SRC/tests/e2e/check_layers.py"

t0=$(date +%s%N)
$CHECK . >"$WORK/breaks" 2>"$WORK/summary" || fail "layer breaks:
$(cat "$WORK/breaks")"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
n=$(grep -oE '^[0-9]+ files' "$WORK/summary" | grep -oE '^[0-9]+')
[ "${n:-0}" -gt 120 ] || fail "only ${n:-0} files checked: $(cat "$WORK/summary")"
# (its time is printed, not asserted: a timed bound fails on a loaded machine)
pass "no layer breaks: $(cat "$WORK/summary") in ${ms} ms"

# the check catches breaks: a copy of src/ and include/ with three added
mkdir -p "$WORK/tree"
cp -r src include "$WORK/tree/"
T=$WORK/tree
$CHECK "$T" >/dev/null 2>&1 || fail "the copy of the tree fails before anything is added"
# comments and strings do not count
printf '/* #include "loom/train.h" and cblas_sgemm( in a comment */\nstatic const char *s_ = "MPI_Send(";\n' >>"$T/src/base/base.c"
$CHECK "$T" >"$WORK/out" 2>&1 || fail "a comment or a string counted as a use: $(cat "$WORK/out")"
line=$(( $(wc -l <"$T/src/base/base.c") + 1 ))
echo '#include "loom/train.h"' >>"$T/src/base/base.c"
mline=$(( $(wc -l <"$T/src/model/block.c") + 1 ))
printf 'void loom_probe_(float *c) { cblas_sgemm(0, 0, 0, 1, 1, 1, 1.0f, c, 1, c, 1, 0.0f, c, 1); }\n' >>"$T/src/model/block.c"
pline=$(( $(wc -l <"$T/src/infer/sample.c") + 1 ))
echo '#include "model/model_internal.h"' >>"$T/src/infer/sample.c"
rc=0
$CHECK "$T" >"$WORK/out" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "a tree with three breaks passed the check (exit $rc): $(cat "$WORK/out")"
grep -q "^src/base/base.c:$line: base may not use train" "$WORK/out" ||
    fail "the bad include of base is not named with its line $line: $(cat "$WORK/out")"
grep -q "^src/model/block.c:$mline: model may not call blas (cblas_sgemm" "$WORK/out" ||
    fail "the BLAS call in model is not named with its line $mline: $(cat "$WORK/out")"
grep -q "^src/infer/sample.c:$pline: infer may not include model's private header" "$WORK/out" ||
    fail "the private header is not named with its line $pline: $(cat "$WORK/out")"
[ "$(grep -c '^src/' "$WORK/out")" -eq 3 ] || fail "more than the three breaks reported: $(cat "$WORK/out")"
pass "a bad include, a misplaced library call and a foreign private header are named: $(grep -c '^src/' "$WORK/out") breaks"

# a new public header needs a module in the table
rm -rf "$T" && mkdir -p "$T" && cp -r src include "$T/"
echo '#include "loom/base.h"' >"$T/include/loom/orphan.h"
$CHECK "$T" >"$WORK/out" 2>&1 && fail "a public header without a module passed"
grep -q "include/loom/orphan.h:1: no module in the table" "$WORK/out" || fail "orphan header not named: $(cat "$WORK/out")"
pass "a public header without an owner is refused"

# a file over 1,000 lines needs a 'Why one file:' sentence in its opening comment
rm -rf "$T" && mkdir -p "$T" && cp -r src include "$T/"
{ echo '/* a long file */'; for i in $(seq 1001); do echo "static int v$i;"; done; } >"$T/src/base/long.c"
$CHECK "$T" >"$WORK/out" 2>&1 && fail "a 1,002-line file without a reason passed"
grep -q "^src/base/long.c:1: 1002 lines (over 1000)" "$WORK/out" || fail "the long file is not named: $(cat "$WORK/out")"
sed -i '1s|.*|/* a long file. Why one file: a test. */|' "$T/src/base/long.c"
$CHECK "$T" >"$WORK/out" 2>&1 || fail "a long file that says why was refused: $(cat "$WORK/out")"
pass "a file over 1,000 lines must say why it is one"
echo PASS
