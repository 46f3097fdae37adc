#!/usr/bin/env python3
"""Training throughput, loom vs PyTorch, side by side on this machine's CPU cores.

For each config (configs/<name>.yaml) it trains the same model both ways:
  loom:    `loom train CONFIG` for warm-up + measured steps (no checkpoints, no validation),
           median of metrics.jsonl's tokens_per_s over the measured steps;
  PyTorch: tests/reference/torch_ref.Ref in float32 (the same decoder, loom's layout),
           torch.optim.AdamW + clip_grad_norm_, random token batches, median step time over
           the measured steps; eager and torch.compile (each run keeps the faster of the two;
           --no-compile skips torch.compile, which is then said in the results).
Each side runs --repeat times (alternating which goes first); the table shows the median over
the runs of each run's median. At least 10 measured steps per run (gpt2-small included).
MFU = tokens/s * FLOPs/token / peak, with the same FLOPs/token (6N + 12*L*C*pairs(T)/T: causal
attention as loom's kernels compute it, see torch_ref.train_flops_per_token) and the same peak
for both: the best of a few 2048^3 fp32 GEMMs through torch.matmul and numpy on the same
threads, measured at the start and after each config (the best kept; GEMMs only, never training
throughput). An MFU above 100% is printed as it is, with a warning.
The machine's load: /proc/loadavg before and after, and the CPU time other processes used
while the benchmark ran (/proc/stat busy time minus this process tree's own); the results call
the machine quiet only when that was under 5% of the available CPU time.

Usage:
  python3 bench/bench_train.py                      # both configs, default steps
  python3 bench/bench_train.py --quick              # fewer warm-up steps, 2 runs
  python3 bench/bench_train.py --configs byte-tiny --steps 20
  python3 bench/bench_train.py --no-loom            # the PyTorch side alone
  python3 bench/bench_train.py --write              # also update its section of bench/RESULTS.md
  python3 bench/bench_train.py --level avx2 --write # both sides pinned to avx2 (bench/levels.py):
                                                    # its own section of bench/RESULTS.md
  python3 bench/bench_train.py --precision bf16 --write
                                                    # bf16 mixed precision: loom bf16, loom fp32
                                                    # and PyTorch autocast bf16: its own section
With --precision bf16 the sides are loom with training.precision = bf16, loom in fp32 (the
same runs as above) and PyTorch under torch.autocast("cpu", dtype=torch.bfloat16) (fp32
parameters, bf16 linears and attention; eager and torch.compile, the faster kept). Each run is
its own process, so its peak RSS (ru_maxrss) is its own; loom's activation arena (act_bytes in
metrics.jsonl) is reported for both precisions.
With --level, the script re-runs itself with the level's environment (PyTorch reads
ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS when it starts), loom inherits it, and what
each side reports it used (torch.backends.cpu.get_cpu_capability(), `loom version`'s kernels)
is checked before anything is measured.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
import torch_ref  # noqa: E402

# (warm-up, measured) steps per config; --quick uses the second pair. Never fewer than 10
# measured steps: fewer make the median a coin toss on a shared machine.
STEPS = {"byte-tiny": ((3, 20), (2, 10)), "gpt2-small": ((2, 10), (1, 10))}
DEFAULT_STEPS = ((3, 10), (2, 10))
MIN_MEASURED = 10


def cpu_ticks():
    """(busy, total) CPU ticks of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    busy = sum(v[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy, busy + idle


def own_cpu_s():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherWork:
    """CPU seconds that processes other than this one and its children used meanwhile."""

    def __init__(self):
        self.busy0, self.total0 = cpu_ticks()
        self.own0 = own_cpu_s()

    def result(self):
        busy1, total1 = cpu_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        busy = (busy1 - self.busy0) / hz
        avail = (total1 - self.total0) / hz
        other = max(0.0, busy - (own_cpu_s() - self.own0))
        return other, avail


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_config(name):
    path = os.path.join(REPO, "configs", name + ".yaml")
    with open(path) as f:
        y = yaml.safe_load(f)
    m, tr = y.get("model", {}), y.get("training", {})
    T = int(tr.get("seq_len", 256))
    B = int(tr.get("batch_size", 8))
    cfg = {k: m.get(k) for k in ("flavor", "vocab_size", "d_model", "n_layer", "n_head",
                                 "n_kv_head", "d_ff", "norm_eps", "rope_theta", "init_std")}
    cfg["max_seq_len"] = m.get("max_seq_len") or T
    return path, torch_ref.normalize_config({k: v for k, v in cfg.items() if v is not None}), B, T


def measure_peak(threads):
    """Best fp32 GEMM rate (FLOP/s) on `threads` threads: torch.matmul and numpy, 2048^3."""
    torch.set_num_threads(threads)
    n = 2048
    best = 0.0
    a, b = torch.randn(n, n), torch.randn(n, n)
    an, bn = a.numpy(), b.numpy()
    # the best of many short trials: on shared cores one clean trial is enough
    for fn in (lambda: torch.matmul(a, b), lambda: an @ bn) * 3:
        fn()
        for _ in range(5):
            t = time.perf_counter()
            fn()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


def find_loom(path):
    for p in ([path] if path else []) + [os.environ.get("LOOM_BIN"),
                                         os.path.join(REPO, "build", "loom")]:
        if p and os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def ensure_data(loom):
    train = os.path.join(REPO, "data", "fortunes", "train")
    if not os.path.exists(os.path.join(train, "manifest.jsonl")):
        log("building data/fortunes (loom data build recipes/fortunes.yaml)")
        subprocess.run([loom, "data", "build", "recipes/fortunes.yaml"], cwd=REPO, check=True)
    return train


def run_rss(cmd):
    """runs cmd (stdout, stderr to files); returns (returncode, stdout, stderr, peak RSS bytes of
    that process alone: os.wait4's ru_maxrss)"""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=fo, stderr=fe, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return p.returncode, fo.read(), fe.read(), ru.ru_maxrss * 1024


def bench_loom(loom, cfg_path, data, warmup, measured, peak, threads, precision="fp32"):
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as run_dir:
        cmd = [loom, "train", cfg_path, "--set", f"run.dir={run_dir}",
               "--set", f"training.steps={warmup + measured}", "--set", "checkpoint.every=0",
               "--set", f"data.train={data}", "--set", "data.val=",
               "--set", f"training.peak_flops={peak:.6g}", "--set", f"training.threads={threads}",
               "--set", f"training.precision={precision}"]
        log("  " + " ".join(cmd))
        t0 = time.perf_counter()
        rc, _, stderr, rss = run_rss(cmd)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"loom train failed ({rc}):\n{stderr[-2000:]}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r.get("step", 0) > warmup]
    if not rows:
        raise RuntimeError("loom wrote no measured steps to metrics.jsonl")
    return {"tok_s": statistics.median(r["tokens_per_s"] for r in rows),
            "best_tok_s": max(r["tokens_per_s"] for r in rows), "proc_rss": rss,
            # the resident high-water mark while training (the process's own, from its
            # metrics; ru_maxrss also counts what the end of a run does)
            "rss": max(max(r.get("rss_hwm_bytes") or [0]) for r in rows),
            "act_bytes": rows[0].get("act_bytes"),
            "mfu_logged": statistics.median(r["mfu"] for r in rows),
            "peak_logged": rows[0]["peak_flops"],
            "losses": [r["loss"] for r in rows], "wall_s": wall, "steps": len(rows)}


def torch_steps(cfg, B, T, n, threads, compile_, autocast=False):
    """n training steps of PyTorch on random (B, T) tokens (clipping, fused AdamW; eager or
    torch.compile; autocast: the forward under torch.autocast("cpu", bfloat16)): yields
    (wall s, CPU s of this process, loss) per step"""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_ref.Ref(cfg, dtype=torch.float32)
    fwd = torch.compile(model) if compile_ else model
    # fused=True (one kernel over all tensors) was the fastest AdamW variant here, ahead of
    # foreach=True and the per-tensor loop (see bench/README.md)
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            fused=True)
    g = torch.Generator().manual_seed(1)
    V = cfg["vocab_size"]
    for _ in range(n):
        x = torch.randint(0, V, (B, T), generator=g)
        y = torch.randint(0, V, (B, T), generator=g)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = fwd(x, y)
        loss.float().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        yield time.perf_counter() - t0, time.process_time() - c0, lv


def bench_torch(cfg, B, T, warmup, measured, threads, compile_, autocast=False):
    times, losses = [], []
    t_first = None
    for i, (dt, _, lv) in enumerate(torch_steps(cfg, B, T, warmup + measured, threads, compile_,
                                                autocast)):
        if i == 0:
            t_first = dt
        if i >= warmup:
            times.append(dt)
            losses.append(lv)
    med = statistics.median(times)
    return {"tok_s": B * T / med, "best_tok_s": B * T / min(times), "step_s": med, "first_step_s": t_first, "losses": losses,
            "steps": len(times)}


def bench_torch_process(name, B, T, warmup, measured, threads, compile_):
    """bench_torch with autocast bf16 in a process of its own (its peak RSS alone)"""
    job = json.dumps({"config": name, "B": B, "T": T, "warmup": warmup, "measured": measured,
                      "threads": threads, "compile": compile_})
    rc, out, err, rss = run_rss([sys.executable, os.path.abspath(__file__), "--torch-worker",
                                 job])
    if rc != 0:
        raise RuntimeError(f"torch worker failed ({rc}):\n{err[-2000:]}")
    r = json.loads(out.strip().split("\n")[-1])
    r["rss"] = rss
    return r


def torch_worker(job):
    j = json.loads(job)
    _, cfg, _, _ = read_config(j["config"])
    r = bench_torch(cfg, j["B"], j["T"], j["warmup"], j["measured"], j["threads"], j["compile"],
                    autocast=True)
    print(json.dumps(r))


def fmt_row(cols, widths):
    return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cols, widths)) + " |"


def side_median(runs):
    return statistics.median(t["tok_s"] for t in runs) if runs else None


def table(results):
    head = ["config", "params", "B x T", "loom tok/s", "torch tok/s", "torch mode",
            "loom/torch", "loom MFU", "torch MFU", "loom MFU (logged)"]
    rows = []
    for r in results:
        lt, tt = side_median(r.get("loom")), side_median(r.get("torch"))
        modes = sorted({t["mode"] for t in r.get("torch", [])})
        rows.append([
            r["name"], f"{r['params'] / 1e6:.1f}M", f"{r['B']} x {r['T']}",
            f"{lt:.0f}" if lt else "-",
            f"{tt:.0f}" if tt else "-",
            "/".join(modes) if modes else "-",
            f"{lt / tt:.2f}" if lt and tt else "-",
            f"{100 * lt * r['flops_tok'] / r['peak']:.1f}%" if lt else "-",
            f"{100 * tt * r['flops_tok'] / r['peak']:.1f}%" if tt else "-",
            f"{100 * statistics.median(t['mfu_logged'] for t in r['loom']):.1f}%" if lt else "-"])
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    lines = [fmt_row(head, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt_row(x, widths) for x in rows]
    return "\n".join(lines)


def versions(loom):
    v = {"torch": torch.__version__, "numpy": np.__version__,
         "python": platform.python_version()}
    if loom:
        try:
            v["loom"] = subprocess.run([loom, "--version"], capture_output=True, text=True,
                                       timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        v["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                     capture_output=True, text=True,
                                     timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return v


SECTION = "## Training throughput: loom vs PyTorch"
SECTION_BF16 = "## Training throughput in bf16: loom vs PyTorch autocast"


def table_bf16(results):
    mib = lambda b: f"{b / 2**20:.0f}" if b else "-"  # noqa: E731
    head = ["config", "B x T", "loom bf16 tok/s", "loom fp32 tok/s", "torch bf16 tok/s",
            "torch mode", "bf16/fp32", "loom/torch", "peak RSS MiB (loom bf16 / fp32 / torch)",
            "act arena bf16/fp32"]
    rows = []
    for r in results:
        lb, lf, tt = (side_median(r.get(s)) for s in ("loom", "loom_fp32", "torch"))
        modes = sorted({t["mode"] for t in r.get("torch", [])})
        rss = [max((t["rss"] for t in r.get(s, [])), default=None)
               for s in ("loom", "loom_fp32", "torch")]
        ab = r["loom"][0]["act_bytes"] if r.get("loom") else None
        af = r["loom_fp32"][0]["act_bytes"] if r.get("loom_fp32") else None
        rows.append([r["name"], f"{r['B']} x {r['T']}", f"{lb:.0f}" if lb else "-",
                     f"{lf:.0f}" if lf else "-", f"{tt:.0f}" if tt else "-",
                     "/".join(modes) if modes else "-",
                     f"{lb / lf:.2f}" if lb and lf else "-",
                     f"{lb / tt:.2f}" if lb and tt else "-",
                     " / ".join(mib(x) for x in rss),
                     f"{ab / af:.3f} ({mib(ab)} / {mib(af)} MiB)" if ab and af else "-"])
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    lines = [fmt_row(head, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt_row(x, widths) for x in rows]
    return "\n".join(lines)


def write_section(path, text):
    """Replaces our section of the shared bench/RESULTS.md (bench/results_md.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_md import replace_section
    replace_section(text, SECTION, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="byte-tiny,gpt2-small",
                    help="comma-separated names under configs/")
    ap.add_argument("--quick", action="store_true", help="fewer steps")
    ap.add_argument("--steps", type=int, help="measured steps (after warm-up) per side")
    ap.add_argument("--warmup", type=int, help="warm-up steps per side")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads per side")
    ap.add_argument("--loom-bin", help="loom binary (default $LOOM_BIN, then build/loom)")
    ap.add_argument("--no-loom", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-compile", action="store_true",
                    help="skip torch.compile (eager only: not PyTorch's best, the results say so)")
    ap.add_argument("--peak", type=float,
                    help="peak fp32 GFLOP/s for MFU (default: measured now, best of 30 GEMMs)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="run each side R times, alternating; the median over the runs is "
                         "reported (--quick: 2)")
    ap.add_argument("--write", action="store_true",
                    help="write (or replace) the training section of bench/RESULTS.md")
    ap.add_argument("--level", choices=["avx512", "avx2"],
                    help="pin both sides to this instruction-set level (bench/levels.py)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: loom bf16 and fp32 against PyTorch autocast bf16")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(args.torch_worker)
        return
    bf16 = args.precision == "bf16"
    global SECTION
    if args.level:
        from levels import check_used, level_env
        if os.environ.get("LOOM_BENCH_LEVEL") != args.level:  # PyTorch reads it at start-up
            env = dict(os.environ, LOOM_BENCH_LEVEL=args.level, **level_env(args.level))
            os.execve(sys.executable, [sys.executable] + sys.argv, env)
        SECTION = f"{SECTION}, both pinned to {args.level}"
    if args.steps is not None and args.steps < MIN_MEASURED:
        sys.exit(f"bench: --steps {args.steps}: at least {MIN_MEASURED} measured steps")
    if args.quick and "--repeat" not in " ".join(sys.argv):
        args.repeat = 2

    loom = None if args.no_loom else find_loom(args.loom_bin)
    if not args.no_loom and not loom:
        sys.exit("bench: no loom binary (build it with `make`, or pass --loom-bin / --no-loom)")
    data = ensure_data(loom) if loom else None
    if args.level:  # what each side says it runs, before anything is measured
        rep = {"torch": torch.backends.cpu.get_cpu_capability()}
        if loom:
            out = subprocess.run([loom, "version"], capture_output=True, text=True).stdout
            rep["loom"] = out.split("kernels: ")[-1].split(",")[0].strip()
        err = check_used(args.level, rep, "bench_train")
        if err:
            sys.exit(err)
        log(f"pinned to {args.level}: PyTorch reports {rep['torch']}, loom runs its "
            f"{rep.get('loom', '(not run)')} kernels")

    other = OtherWork()
    load_before = loadavg()
    if float(load_before.split()[0]) > 0.5:
        log(f"warning: load average {load_before}: other work shares the cores, timings will "
            "be low and noisy")
    log(f"measuring peak fp32 GEMM on {args.threads} threads")
    peak = args.peak * 1e9 if args.peak else measure_peak(args.threads)
    log(f"peak {peak / 1e9:.1f} GFLOP/s")

    results = []
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        cfg_path, cfg, B, T = read_config(name)
        (w, n) = STEPS.get(name, DEFAULT_STEPS)[1 if args.quick else 0]
        w = args.warmup if args.warmup is not None else w
        n = args.steps if args.steps is not None else n
        r = {"name": name, "B": B, "T": T, "peak": peak,
             "params": torch_ref.Ref(cfg, dtype=torch.float32).num_params(),
             "flops_tok": torch_ref.train_flops_per_token(cfg, T)}
        for rep in range(args.repeat):
            # alternate which side goes first; every run is kept (median over runs)
            sides = ["loom", "torch"] if rep % 2 == 0 else ["torch", "loom"]
            if bf16:
                sides = (["loom", "loom_fp32", "torch"] if rep % 2 == 0
                         else ["torch", "loom_fp32", "loom"])
            for side in sides:
                if side in ("loom", "loom_fp32") and loom:
                    prec = "bf16" if bf16 and side == "loom" else "fp32"
                    log(f"[{name}] loom {prec}: {w} warm-up + {n} measured steps")
                    t = bench_loom(loom, cfg_path, data, w, n, peak, args.threads, prec)
                    log(f"  loom {prec} {t['tok_s']:.0f} tok/s, peak RSS "
                        f"{t['rss'] / 2**20:.0f} MiB")
                elif side == "torch" and not args.no_torch and bf16:
                    t, tried = None, {}
                    for comp in ([False] if args.no_compile else [False, True]):
                        log(f"[{name}] torch autocast bf16 ({'compiled' if comp else 'eager'}):"
                            f" {w} warm-up + {n} measured steps (own process)")
                        c = bench_torch_process(name, B, T, max(w, 2) if comp else w, n,
                                                args.threads, comp)
                        c["mode"] = "compiled" if comp else "eager"
                        log(f"  torch bf16 {c['mode']} {c['tok_s']:.0f} tok/s, peak RSS "
                            f"{c['rss'] / 2**20:.0f} MiB")
                        tried[c["mode"]] = c["tok_s"]
                        if t is None or c["tok_s"] > t["tok_s"]:
                            t = c
                    t["tried"] = tried
                elif side == "torch" and not args.no_torch:
                    t, tried = None, {}
                    for comp in ([False] if args.no_compile else [False, True]):
                        log(f"[{name}] torch ({'compiled' if comp else 'eager'}): {w} warm-up"
                            f" + {n} measured steps")
                        c = bench_torch(cfg, B, T, max(w, 2) if comp else w, n, args.threads,
                                        comp)
                        c["mode"] = "compiled" if comp else "eager"
                        log(f"  torch {c['mode']} {c['tok_s']:.0f} tok/s ({c['step_s']:.3f} "
                            f"s/step, first step {c['first_step_s']:.1f} s)")
                        tried[c["mode"]] = c["tok_s"]
                        if t is None or c["tok_s"] > t["tok_s"]:
                            t = c
                    t["tried"] = tried
                else:
                    continue
                r.setdefault(side, []).append(t)
        results.append(r)
        # re-measure after each config and keep the best: one quiet moment is enough
        peak = max(peak, measure_peak(args.threads)) if not args.peak else peak
    for r in results:
        r["peak"] = peak

    load_after = loadavg()
    other_s, avail_s = other.result()
    quiet = avail_s > 0 and other_s / avail_s < 0.05
    out = table_bf16(results) if bf16 else table(results)
    notes = [f"peak fp32 GEMM {peak / 1e9:.1f} GFLOP/s on {args.threads} threads (GEMMs only, "
             "never training throughput)",
             f"load average before {load_before}, after {load_after}; other processes used "
             f"{other_s:.0f} of the {avail_s:.0f} CPU-seconds available while it ran "
             f"({100 * other_s / max(avail_s, 1e-9):.0f}%): "
             + ("a quiet machine" if quiet else "NOT a quiet machine (shared with other work): "
                "both sides are slowed and noisy; compare them only with each other"),
             "MFU = tok/s * (6N + 12*L*C*pairs(T)/T) / peak for both sides (causal attention as "
             "loom's kernels compute it: pairs(T) = T(T+64)/2); 'logged' is loom's own figure "
             "(the same count, against the peak as measured before that config, passed as "
             "training.peak_flops)."]
    notes.append(f"each side run {args.repeat} times (alternating which goes first); "
                 "tok/s = median over the runs of each run's median step")
    if args.no_compile:
        notes.append("PyTorch eager only (--no-compile): not PyTorch's best")
    if bf16:
        notes.append("loom bf16: training.precision = bf16 (fp32 masters and moments, bf16 "
                     "weight copies, activations and logits, fp32 accumulation, statistics, "
                     "losses and gradients); torch bf16: the same model (tests/reference/"
                     "torch_ref.py) in fp32 under torch.autocast(\"cpu\", torch.bfloat16), "
                     "fused AdamW; peak RSS = loom's resident high-water mark while training "
                     "(metrics.jsonl rss_hwm_bytes), PyTorch's process ru_maxrss (each run its "
                     "own process; largest over the runs); act arena = loom's activation arena (metrics.jsonl "
                     "act_bytes), bf16 over fp32")
    for r in results:
        parts = []
        for side in (("loom", "loom_fp32", "torch") if bf16 else ("loom", "torch")):
            if side not in r:
                continue
            runs = r[side]
            desc = ", ".join(f"{t['tok_s']:.0f}" if side != "torch" else
                             " / ".join(f"{v:.0f} {k}" for k, v in t["tried"].items())
                             for t in runs)
            parts.append(f"{side} per-run medians {desc} tok/s, {runs[0]['steps']} measured steps each")
        notes.append(f"{r['name']}: " + "; ".join(parts))
    if any(side in r and side_median(r[side]) * r["flops_tok"] > peak for r in results
           for side in ("loom", "torch")):
        notes.append("WARNING: an MFU above 100% means the peak is wrong (measured while other "
                     "work ran); it is printed as it is; rerun on an idle machine or pass --peak")
    print(out)
    for line in notes:
        print(line)

    if args.write:
        v = versions(loom)
        md = [SECTION_BF16 if bf16 else SECTION, "",
              f"Generated by `python3 bench/bench_train.py{' --quick' if args.quick else ''}"
              f"{' --precision bf16' if bf16 else ''}"
              f"{' --no-compile' if args.no_compile else ''}"
              f"{' --level ' + args.level if args.level else ''} --repeat {args.repeat} --write` "
              f"on {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
              + (" on a quiet machine." if quiet else ", on a machine shared with other work "
                 "(see the load below): not quiet-machine figures."), "",
              f"- machine: {cpu_model()}, {os.cpu_count()} cores, {args.threads} threads per "
              f"side",
              "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), "",
              out, ""] + [f"- {line}" for line in notes] + [""]
        path = os.path.join(REPO, "bench", "RESULTS.md")
        write_section(path, "\n".join(md))
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
