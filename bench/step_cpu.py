#!/usr/bin/env python3
"""CPU seconds per training step of every `loom train` process of one run (each MPI rank),
sampled from /proc: a figure that, unlike wall time, hardly depends on how busy the machine
is (a rank blocked in a message sleeps). Started beside a run, it polls every 0.05 s for the
processes whose command line holds `run.dir=RUN_DIR` (argv[0] ending in `loom`), records each
one's utime + stime whenever RUN_DIR/metrics.jsonl gains a line (rank 0 writes one line per
step; the ranks meet at the step's gradient reduction, so the moments are step boundaries
within the sampling interval) and ends when those processes are gone, writing OUT:
    {"pids": [...], "cpu": [[cpu of each pid at line 1], [at line 2], ...]}
    python3 bench/step_cpu.py RUN_DIR OUT
Used by bench/bench_cp.sh."""
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def loom_pids(run_dir):
    key = f"run.dir={run_dir}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"loom") and key in argv:
            out.append(int(d))
    return sorted(out)


def cpu_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError):
        return None


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    pids, cpu, seen, t0, last = [], [], 0, time.time(), None
    while True:
        time.sleep(0.05)
        if seen == 0:  # every rank is there before the first step ends
            now = loom_pids(run_dir)
            if not now and not pids:
                if time.time() - t0 > 600:
                    break
                continue
            if now and now != pids:
                pids, last = now, None
        c = [cpu_of(p) for p in pids]
        if all(x is None for x in c):
            break
        last = [x if x is not None else y for x, y in zip(c, last or c)]
        n = lines(metrics)
        if n > seen:
            cpu += [last] * (n - seen)
            seen = n
    # a last line written just before the exit: the CPU seen last (within 0.05 s of the exit)
    n = lines(metrics)
    if pids and last and n > seen:
        cpu += [last] * (n - seen)
    with open(out, "w") as f:
        json.dump({"pids": pids, "cpu": cpu}, f)


if __name__ == "__main__":
    main()
