# metrics.jsonl loses no row up to a durable checkpoint and holds each step once:
#  - it is fsynced before every checkpoint commits (traced with strace: after the last row
#    written before a COMPLETE rename, an fsync of metrics.jsonl comes before that rename);
#  - a run SIGKILLed past its last checkpoint and resumed holds exactly the rows 1..N.
source "$(dirname "$0")/lib.sh"
command -v strace >/dev/null || fail "strace not found (Debian package strace; scripts/setup.sh --test installs it)"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"

strace -f -y -qq -o "$WORK/trace" -e trace=write,fsync,fdatasync,rename,renameat,renameat2 \
  "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=6 --set checkpoint.every=3 2>"$WORK/log" \
  || { cat "$WORK/log"; fail "traced run"; }
python3 - "$WORK/trace" <<'PY' || fail "metrics.jsonl is not fsynced before each checkpoint commits"
import re, sys
last_write = synced = None
commits = 0
for i, line in enumerate(open(sys.argv[1])):
    if re.search(r'\bwrite\(\d+<[^>]*/metrics\.jsonl>', line): last_write, synced = i, False
    elif re.search(r'\bf(data)?sync\(\d+<[^>]*/metrics\.jsonl>', line) and last_write is not None: synced = True
    elif re.search(r'rename\w*\(.*"[^"]*/(step_\d+)/COMPLETE"', line):
        step = re.search(r'(step_\d+)/COMPLETE"', line).group(1)
        if last_write is None: sys.exit(f"{step}: committed before any metrics row was written")
        if not synced: sys.exit(f"{step}: COMPLETE renamed while rows written since the last fsync "
                                "of metrics.jsonl were not durable")
        commits += 1
        print(f"ok: {step}: metrics.jsonl fsynced after its last row and before COMPLETE")
if commits != 2: sys.exit(f"expected 2 checkpoint commits in the trace, saw {commits}")
PY
pass "metrics.jsonl is durable up to each checkpoint"

# SIGKILL past the last checkpoint, then resume: rows 1..N exactly once
rm -rf "$WORK/run"
LONG=(--set training.steps=1000000 --set training.schedule_steps=1000000 --set eval.every=0
      --set checkpoint.every=5 --set training.log_every=1000)
"$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" 2>"$WORK/log" &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do
  [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run/metrics.jsonl")" -ge 13 ] && break
  sleep 0.05
done
kill -KILL $PID; wait $PID 2>/dev/null || true
rows=$(wc -l < "$WORK/run/metrics.jsonl")
[ "$rows" -ge 13 ] || fail "the run was killed after only $rows rows"
N=$((rows + 7))
expect_ok "resume after SIGKILL at row $rows" "$LOOM_BIN" train "$WORK/c.yaml" "${LONG[@]}" --set training.steps=$N
grep -q "resumed from .*step_" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "did not resume"; }
python3 - "$WORK/run/metrics.jsonl" "$N" <<'PY' || fail "metrics after the resume"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
n = int(sys.argv[2])
if steps != list(range(1, n + 1)):
    sys.exit(f"steps are not 1..{n} once each: {len(steps)} rows: {steps}")
PY
pass "killed at row $rows, resumed to $N: rows 1..$N, each once"
echo "all metrics durability tests passed"
