#!/usr/bin/env bash
# The per-step cost of observability stays proportional to what is needed (issue 13's overhead
# target; bench/bench_obs.sh measures it): with the profiler, the Prometheus endpoint,
# TensorBoard and the default alerts all on, a run of 30 steps (traced with strace)
#   - never reads /proc/self/status (the memory high-water mark is one getrusage call);
#   - writes the TensorBoard event file on a cadence (every 2 s and at the end), not once per
#     step;
#   - has metrics rows with elapsed_s (seconds since the loop began) and cpu_s (the process's
#     CPU seconds), increasing;
#   - still writes op spans with their shapes ("N=64 IC=32 OC=96": kept as numbers while
#     recording, formatted with the trace).
source "$(dirname "$0")/lib.sh"
command -v strace >/dev/null || fail "strace not found (Debian package strace; scripts/setup.sh --test)"
make_dataset "$WORK"
make_config "$WORK" "$WORK/c.yaml" "$WORK/run"
PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
STEPS=30
expect_ok "train with every sink and the profiler under strace" \
  strace -f -o "$WORK/strace.txt" -e trace=openat,write,pwrite64,writev \
  "$LOOM_BIN" train "$WORK/c.yaml" --set training.steps=$STEPS --set training.schedule_steps=$STEPS \
  --set eval.every=0 --set checkpoint.every=0 --set obs.prometheus_port=$PORT \
  --set obs.tensorboard=true --set obs.default_alerts=true --set profile.steps=1-$STEPS
python3 - "$WORK/strace.txt" "$WORK/run" "$STEPS" <<'PY' || fail "per-step observability work"
import json, re, sys
trace, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
status_reads = tb_writes = 0
tb_fds = set()  # (pid, fd) of the event file
for line in open(trace):
    m = re.match(r"(\d+)\s+openat\(.*\"([^\"]*)\".*\)\s*=\s*(\d+)", line)
    if m:
        if m.group(2).endswith("/status") and "/proc/" in m.group(2):
            status_reads += 1
        if "tfevents" in m.group(2):
            tb_fds.add((m.group(1), m.group(3)))
        continue
    m = re.match(r"(\d+)\s+(write|pwrite64|writev)\((\d+),", line)
    if m and (m.group(1), m.group(3)) in tb_fds:
        tb_writes += 1
assert tb_fds, "the event file was never opened"
assert status_reads == 0, f"/proc/.../status read {status_reads} times in {steps} steps"
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert len(rows) == steps, len(rows)
el = [r["elapsed_s"] for r in rows]
assert all(b > a for a, b in zip(el, el[1:])) and el[0] > 0, el
cpu = [r["cpu_s"] for r in rows]
assert all(b >= a for a, b in zip(cpu, cpu[1:])) and cpu[-1] > cpu[0] > 0, cpu
# the file_version record at open, one flush per 2 s of the run, the end (a write per step
# before: steps + 1)
assert tb_writes <= 3 + el[-1] / 2 and tb_writes < steps, \
    f"{tb_writes} writes to the event file in {steps} steps ({el[-1]:.1f} s)"
ev = json.load(open(run + "/trace.json"))["traceEvents"]
mm = [e["args"]["shape"] for e in ev if e.get("name") == "matmul_forward"]
assert len(mm) >= steps and all(re.fullmatch(r"N=\d+ IC=\d+ OC=\d+", s) for s in mm), mm[:5]
assert "N=64 IC=32 OC=96" in mm, sorted(set(mm))  # the qkv projection: B*T = 64, C = 32
fa = [e["args"]["shape"] for e in ev if e.get("name") == "flash_attention_forward"]
assert fa and all(s == "B=2 Tq=32 Tk=32 H=4 KVH=4 D=8" for s in fa), sorted(set(fa))
steps_shapes = [e["args"]["shape"] for e in ev if e.get("cat") == "step"]
assert steps_shapes == [f"step {k}" for k in range(1, steps + 1)], steps_shapes[:3]
print(f"ok: no /proc/self/status reads, {tb_writes} event-file writes in {steps} steps, "
      f"elapsed_s increasing, {len(mm)} matmul spans with shapes")
PY
pass "observability per step: no /proc text, TensorBoard buffered, shapes formatted with the trace"
