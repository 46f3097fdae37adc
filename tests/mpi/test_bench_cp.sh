#!/usr/bin/env bash
# bench/bench_cp.sh end to end at a small length (T = 1,024, 3 steps, 2 rounds): the context-
# parallel table has its three rows (cp 1, cp 2 ulysses, cp 2 ring), each with the CPU seconds
# per step that bench/step_cpu.py sampled from every rank (positive; the two ranks of a cp 2
# run together twice their mean, so both were found), the communication bytes and the bound for
# the cp 2 rows, and one step time per round.
source "$(dirname "$0")/lib.sh"
BUILD=$(dirname "$LOOM_BIN")
[ -f "$BUILD/libloom_static.a" ] || fail "no $BUILD/libloom_static.a (bench_cp.sh links bench_cp_bw.c to it)"
TS=1024 STEPS=3 WARM=1 ROUNDS=2 LOOM_BIN="$LOOM_BIN" BUILD="$BUILD" timeout 600 \
  bash "$LOOM_SRC/bench/bench_cp.sh" >"$WORK/table" 2>"$WORK/err" \
  || { cat "$WORK/err" >&2; fail "bench_cp.sh exited non-zero"; }
python3 - "$WORK/table" <<'PY' || { cat "$WORK/table" >&2; fail "bench_cp.sh table"; }
import re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| 1024 |")]
runs = {r.split("|")[2].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in rows}
assert sorted(runs) == ["cp 1", "cp 2 ring", "cp 2 ulysses"], runs
for name, c in runs.items():
    m = re.fullmatch(r"([0-9.]+) \(([0-9.]+)\)", c[5])
    assert m, f"{name}: CPU column {c[5]!r}"
    per_rank, total = float(m.group(1)), float(m.group(2))
    ranks = 1 if name == "cp 1" else 2
    assert per_rank > 0, f"{name}: no CPU time sampled"
    assert abs(total - ranks * per_rank) <= 0.011 * ranks, f"{name}: {ranks} rank(s)? {c[5]}"
    assert len(c[-1].split("/")) == 2, f"{name}: step ms per round {c[-1]!r}"
    if ranks == 2:
        assert float(c[7].split()[0]) > 0 and float(c[8]) > 0, f"{name}: bytes / bound {c[7:9]}"
print("".join(rows), end="")
PY
pass "bench_cp.sh: cp 1 / ulysses / ring rows with each rank's CPU seconds per step"
echo "PASS"
