#!/usr/bin/env python3
"""Long-context training step, loom against PyTorch, byte-tiny shape, one thread each, full
causal attention, batch 1, at sequence lengths T (default 4096,16384):

  loom none     `loom train configs/byte-tiny.yaml` with flash attention, model.recompute none,
                model.loss_chunk 0 (every activation kept, like PyTorch's autograd)
  loom full     the same with model.recompute full and model.loss_chunk 4096
  torch eager   tests/reference/torch_ref.py's model (the same shapes and flavor) in float32,
                F.scaled_dot_product_attention(is_causal=True) (PyTorch's CPU flash kernel),
                cross-entropy, backward, gradient clipping and fused AdamW: one training step
  torch compile the same under torch.compile (the first step compiles; it is the warm-up)

Every run is its own process (so peak RSS is per run: getrusage ru_maxrss of the child for
loom, of the worker itself for torch, which includes torch's import, about 0.3 GiB); the four
run in rotation (A B C D A B C D ...) for --rounds rounds, each --warmup + --steps steps,
so on a shared machine every side sees the same load. Per run: the median step time over the
measured steps and the CPU seconds per measured step (torch: process_time around the step;
loom: the process's utime+stime sampled from /proc every 0.1 s at the moments its
metrics.jsonl gains a line). The table gives the median over the rounds, tokens/s = T / step,
the ratio to loom none, and the load average. --skip NAME,... leaves variants out at lengths
(e.g. --skip "torch compile@65536").

    python3 bench/bench_longctx_torch.py [--T 4096,16384] [--rounds 3] [--steps 2] [--warmup 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
from bench_train import OtherWork, cpu_model, loadavg, log  # noqa: E402

VARIANTS = ["loom none", "loom full", "torch eager", "torch compile"]
ENV1 = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    except (OSError, IndexError):
        return None


WRAP_RSS = ("import resource, subprocess, sys\n"
            "rc = subprocess.run(sys.argv[1:]).returncode\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(rc)\n")


def child_cpu(pid):
    """CPU seconds of the wrapper's child (loom itself)"""
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return None
    return proc_cpu(int(kids[0])) if kids else None


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def run_loom(loom, data, work, T, recompute, chunk, steps):
    """one `loom train` run under a wrapper that prints its peak RSS (getrusage of the
    children): (metrics rows, CPU seconds at each metrics line, peak RSS bytes)"""
    run_dir = tempfile.mkdtemp(prefix=f"T{T}_{recompute}_", dir=work)
    sets = {"data.train": data, "data.val": "", "run.dir": run_dir, "training.seq_len": T,
            "model.max_seq_len": T, "training.batch_size": 1, "training.steps": steps,
            "training.warmup": 0, "checkpoint.every": 0, "eval.every": 0,
            "training.threads": 1, "training.memory_limit": "off", "training.peak_flops": 1e11,
            "model.attention": "flash", "model.recompute": recompute, "model.loss_chunk": chunk,
            "model.doc_mask": "false"}
    cmd = [sys.executable, "-c", WRAP_RSS, loom, "train",
           os.path.join(REPO, "configs", "byte-tiny.yaml")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    errf = os.path.join(run_dir, "stderr")
    with open(errf, "w") as ef:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=ef, text=True, env=ENV1)
        cpu_at = []  # CPU seconds when metrics.jsonl reached 1, 2, ... lines
        seen, last = 0, None
        while p.poll() is None:
            time.sleep(0.1)
            c = child_cpu(p.pid)
            last = c if c is not None else last
            n = lines(metrics)
            if n > seen and last is not None:
                cpu_at += [last] * (n - seen)
                seen = n
        out = p.stdout.read()
    # a last line written just before the exit: the CPU seen last (within 0.1 s of the exit)
    n = lines(metrics)
    if n > seen and last is not None:
        cpu_at += [last] * (n - seen)
    if p.returncode != 0:
        raise RuntimeError(f"loom train failed ({p.returncode}): {open(errf).read()[-1500:]}")
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    return rows, cpu_at, int(out.split()[-1]) * 1024


def loom_result(rows, cpu_at, warmup, rss):
    meas = rows[warmup:]
    # CPU of step i: between metrics lines i-1 and i; with no warm-up, the first step's is
    # counted from the process's start (its start-up, well under a second, included)
    cpu = [cpu_at[i] - (cpu_at[i - 1] if i else 0.0) for i in range(warmup, len(cpu_at))]
    return {"step_s": statistics.median(r["step_ms"] for r in meas) / 1e3,
            "cpu_s": statistics.median(cpu) if cpu else None, "rss": rss,
            "act": meas[-1]["act_bytes"], "loss": meas[-1]["loss"]}


def torch_worker(T, steps, warmup, compile_):
    import resource
    import bench_train
    _, cfg, _, _ = bench_train.read_config("byte-tiny")
    cfg = dict(cfg, max_seq_len=T)
    out = [s for i, s in enumerate(bench_train.torch_steps(cfg, 1, T, warmup + steps, 1, compile_))
           if i >= warmup]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"steps": out, "rss": rss}))


def run_torch(T, steps, warmup, compile_):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", str(T), str(steps),
           str(warmup), "1" if compile_ else "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV1)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-300:]}
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return {"step_s": statistics.median(s[0] for s in d["steps"]),
            "cpu_s": statistics.median(s[1] for s in d["steps"]), "rss": d["rss"],
            "loss": d["steps"][-1][2]}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        T, steps, warmup, comp = (int(x) for x in sys.argv[2:6])
        torch_worker(T, steps, warmup, comp == 1)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--skip", default="", help="VARIANT@T,... not run")
    ap.add_argument("--json", help="also write every run's result here")
    a = ap.parse_args()
    loom = os.path.abspath(os.environ.get("LOOM_BIN", os.path.join(REPO, "build/loom")))
    data = os.path.join(REPO, "data", "fortunes", "train")
    if not os.path.exists(os.path.join(data, "manifest.jsonl")):
        subprocess.run([loom, "data", "build", "recipes/fortunes.yaml"], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
    Ts = [int(x) for x in a.T.split(",") if x]
    variants = [v for v in a.variants.split(",") if v]
    skip = {s for s in a.skip.split(",") if s}
    load_before, other = loadavg(), OtherWork()
    res = {}  # (T, variant) -> [run results]
    with tempfile.TemporaryDirectory(prefix="loom-bench-lctorch.") as work:
        for T in Ts:
            for r in range(a.rounds):
                for v in variants:
                    if f"{v}@{T}" in skip:
                        continue
                    log(f"T={T} round {r + 1} {v} (load {loadavg()}) ...")
                    if v.startswith("loom"):
                        rc, ch = ("none", 0) if v == "loom none" else ("full", 4096)
                        rows, cpu_at, rss = run_loom(loom, data, work, T, rc, ch,
                                                     a.warmup + a.steps)
                        out = loom_result(rows, cpu_at, a.warmup, rss)
                    else:
                        out = run_torch(T, a.steps, a.warmup, v == "torch compile")
                    log(f"  {out}")
                    res.setdefault((T, v), []).append(out)
    other_s, avail_s = other.result()
    load_after = loadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{T}|{v}": runs for (T, v), runs in res.items()}, f, indent=1)
    print(f"CPU: {cpu_model()}; load average before {load_before}, after {load_after}; other "
          f"processes used {other_s:.0f} of the {avail_s:.0f} CPU-seconds available")
    print(f"{a.rounds} round(s), {a.warmup} warm-up + {a.steps} measured step(s) per run, "
          "medians over the rounds of each run's median\n")
    print("| T | run | step s | tokens/s | vs loom none | CPU s/step | vs loom none (CPU) | "
          "peak RSS GiB | rounds' step s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for T in Ts:
        base = None
        for v in variants:
            runs = [x for x in res.get((T, v), []) if "error" not in x]
            if not runs:
                errs = [x["error"] for x in res.get((T, v), [])]
                if errs:
                    print(f"| {T} | {v} | failed: {errs[0][-120:]} |")
                continue
            s = statistics.median(x["step_s"] for x in runs)
            cpus = [x["cpu_s"] for x in runs if x.get("cpu_s")]
            c = statistics.median(cpus) if cpus else None
            if v == "loom none":
                base = (s, c)
            ratio = f"{base[0] / s:.2f}" if base else "-"
            cratio = f"{base[1] / c:.2f}" if base and base[1] and c else "-"
            print(f"| {T} | {v} | {s:.2f} | {T / s:.0f} | {ratio} | "
                  f"{'-' if c is None else f'{c:.2f}'} | {cratio} | "
                  f"{max(x['rss'] for x in runs) / 2**30:.3f} | "
                  + "/".join(f"{x['step_s']:.1f}" for x in runs) + " |")


if __name__ == "__main__":
    main()
