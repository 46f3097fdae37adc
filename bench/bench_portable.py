#!/usr/bin/env python3
"""The portable build (`make`: x86-64 baseline, kernels per level chosen at run time) against
the native one (`make NATIVE=1`: -march=native), training the same configs on this machine.

Builds both from this checkout into their own directories (build-bench/portable,
build-bench/native; only the `loom` target), then for each config runs `loom train` with the
portable and the native binary alternately, --repeat times each (which goes first alternates
too), and records two figures per run: the median tokens_per_s over the measured steps
(metrics.jsonl, after the warm-up: wall clock) and the CPU time the run used (user + system,
getrusage of the child: the same work, so less sensitive to other jobs on a shared machine than
wall time). The result per config is the median over the runs of each; the ratios are
portable / native throughput (wall: tok/s; CPU: native CPU seconds / portable CPU seconds).
One thread by default (--threads): on a shared 2-core machine a second thread mostly measures
the other jobs. Also runs the portable binary with LOOM_ISA=x86-64 (its baseline kernels,
what a CPU without AVX2 gets) once per round, for scale.

The machine's load is recorded (/proc/loadavg before and after, and the share of the CPU time
other processes used meanwhile); the section says "quiet" only when that share was under 5%.

Usage:
  python3 bench/bench_portable.py                 # byte-tiny and llama-tiny, 5 runs each
  python3 bench/bench_portable.py --repeat 3 --steps 10 --configs byte-tiny
  python3 bench/bench_portable.py --write         # also update its section of bench/RESULTS.md
"""
import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cpu_ticks():
    """(busy, total) CPU ticks of the whole machine (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    busy = sum(v[:8]) - idle
    return busy, busy + idle


def own_cpu_s():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def build(kind, native):
    d = os.path.join(REPO, "build-bench", kind)
    log(f"building {kind} in {d}")
    subprocess.run(["cmake", "-S", REPO, "-B", d, "-DCMAKE_BUILD_TYPE=Release",
                    f"-DLOOM_NATIVE={'ON' if native else 'OFF'}"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", d, "--target", "loom", "-j", str(os.cpu_count())],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(d, "loom")


def ensure_data(loom):
    if not os.path.exists(os.path.join(REPO, "data", "fortunes", "train", "manifest.jsonl")):
        log("building data/fortunes (loom data build recipes/fortunes.yaml)")
        subprocess.run([loom, "data", "build", "recipes/fortunes.yaml"], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(loom, config, warmup, steps, threads, isa=None):
    """One training run: (median tokens_per_s over the steps after the warm-up, CPU seconds)."""
    with tempfile.TemporaryDirectory(prefix="loom-bench-portable.") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        env.pop("LOOM_ISA", None)
        if isa:
            env["LOOM_ISA"] = isa
        cmd = [loom, "train", os.path.join(REPO, "configs", config + ".yaml"),
               "--set", f"run.dir={tmp}/run", "--set", f"training.steps={warmup + steps}",
               "--set", "checkpoint.every=0", "--set", "eval.every=0",
               "--set", "data.train=data/fortunes/train", "--set", "data.val=",
               "--set", "training.peak_flops=1e12", "--set", f"training.threads={threads}"]
        c0 = child_cpu_s()
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        cpu = child_cpu_s() - c0
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
        rows = [json.loads(l) for l in open(os.path.join(tmp, "run", "metrics.jsonl"))]
        tps = [r["tokens_per_s"] for r in rows if r.get("step", 0) > warmup and "tokens_per_s" in r]
        if len(tps) < steps:
            sys.exit(f"{config}: {len(tps)} measured steps in metrics.jsonl, expected {steps}")
        return statistics.median(tps), cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["byte-tiny", "llama-tiny"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if a.steps < 10:
        sys.exit("--steps below 10 makes each run's median a coin toss")

    portable, native = build("portable", False), build("native", True)
    ensure_data(portable)
    version = {k: subprocess.run([b, "version"], capture_output=True, text=True).stdout.strip()
               for k, b in (("portable", portable), ("native", native))}
    log(f"portable: {version['portable']}\nnative:   {version['native']}")

    load_before = loadavg()
    busy0, total0 = cpu_ticks()
    own0 = own_cpu_s()
    t0 = datetime.datetime.now()
    results = {}
    for cfg in a.configs:
        runs = {"portable": [], "native": [], "portable x86-64": []}
        cpus = {k: [] for k in runs}
        for r in range(a.repeat):
            order = [("portable", portable, None), ("native", native, None)]
            if r % 2:
                order.reverse()
            order.append(("portable x86-64", portable, "x86-64"))
            for name, binary, isa in order:
                v, c = run(binary, cfg, a.warmup, a.steps, a.threads, isa)
                runs[name].append(v)
                cpus[name].append(c)
                log(f"{cfg} run {r + 1}/{a.repeat} {name}: {v:.0f} tok/s, {c:.2f} CPU s")
        results[cfg] = (runs, cpus)
    busy1, total1 = cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    other = max(0.0, (busy1 - busy0) / hz - (own_cpu_s() - own0))
    avail = (total1 - total0) / hz
    other_frac = other / avail if avail > 0 else 0.0
    load_after = loadavg()
    minutes = (datetime.datetime.now() - t0).total_seconds() / 60

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    quiet = other_frac < 0.05
    lines = [f"## Portable build vs NATIVE=1 ({datetime.date.today().isoformat()})", "",
             f"Generated by `python3 bench/bench_portable.py --repeat {a.repeat} --steps {a.steps}` "
             f"(commit {commit}, {minutes:.0f} min).", "",
             f"- portable: `{version['portable']}`",
             f"- native: `{version['native']}`",
             f"- threads per run: {a.threads}; {a.warmup} warm-up + {a.steps} measured steps per run; each "
             f"run's median tok/s, then the median over {a.repeat} runs per build (portable and "
             f"native alternate, the first of each pair alternating too)", "",
             "| config | portable tok/s | native tok/s | wall ratio | portable CPU s | native CPU s | CPU ratio | portable at x86-64: CPU s (ratio) |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = {}
    for cfg, (runs, cpus) in results.items():
        p, n = statistics.median(runs["portable"]), statistics.median(runs["native"])
        pc, nc = statistics.median(cpus["portable"]), statistics.median(cpus["native"])
        bc = statistics.median(cpus["portable x86-64"])
        ratios[cfg] = (p / n, nc / pc)
        lines.append(f"| {cfg} | {p:.0f} | {n:.0f} | {p / n:.3f} | {pc:.2f} | {nc:.2f} | "
                     f"{nc / pc:.3f} | {bc:.2f} ({nc / bc:.3f}) |")
    lines.append("")
    for cfg, (runs, cpus) in results.items():
        for k in runs:
            lines.append(f"- {cfg}, {k}: tok/s " + " ".join(f"{x:.0f}" for x in runs[k])
                         + "; CPU s " + " ".join(f"{x:.2f}" for x in cpus[k]))
    lines += ["",
              f"- load average before {load_before}, after {load_after}; other processes used "
              f"{100 * other_frac:.0f}% of the CPU time meanwhile: "
              + ("a quiet machine." if quiet else
                 "NOT a quiet machine (shared with other jobs): single runs vary by more than the "
                 "difference measured; the medians over alternating runs are what to read."),
              "- ratios are portable throughput / native throughput (CPU: native CPU s / portable "
              "CPU s); within 3% means >= 0.97. CPU time: "
              + ", ".join(f"{c} {'yes' if r[1] >= 0.97 else 'NO'} ({r[1]:.3f})" for c, r in ratios.items())
              + "; wall clock: "
              + ", ".join(f"{c} {'yes' if r[0] >= 0.97 else 'NO'} ({r[0]:.3f})" for c, r in ratios.items()),
              ""]
    text = "\n".join(lines)
    print(text)
    if a.write:
        from results_md import replace_section
        replace_section(text, "## Portable build vs NATIVE=1", os.path.join(REPO, "bench", "RESULTS.md"))
        log("bench/RESULTS.md: section 'Portable build vs NATIVE=1' updated")


if __name__ == "__main__":
    main()
