#!/usr/bin/env python3
"""Decode speed of loom's weight precisions side by side: fp32, --weights bf16, --weights int8
(GGUF's Q8_0; docs/inference.md "Weights in int8"), one run.

The model: bench/smollm2-135m.yaml, a SmolLM2-135M-shaped Llama (30 layers, d 576, GQA 9/3,
d_ff 1536, vocab 49,152, tied), random weights (one training step on the byte data; speed does
not depend on the weights). Prompts: 16 lines of 16 random letters (16 tokens each, byte ids).
Greedy, TOKENS new tokens. batch 1: one prompt; batch 16: the 16 prompts together. Each run a
fresh `loom generate --stats` process (its own timing covers the engine's steps, prefill
included; not loading). Runs alternate over the precisions, REPEAT of each, for each thread
count; medians. Two rates per run: tokens over wall time, and over the CPU time of the process
(on a loaded machine the second leaves out the time other processes held the cores).

Bytes per token: the weight bytes one decode step streams (every linear's and the head's
matrix at the precision's size: 4, 2 or 34/32 bytes per weight; the norms in fp32; the tied
embedding's rows are a lookup and not counted), divided by the rows of the step (1 or 16). The
KV cache's reads are not counted (at 16 + TOKENS positions they are under 1% of the weights).

llama.cpp's side (issue 29's table) is not run here: building llama-cpp-python is too heavy
for the shared 2-core machine this was written on; bench/RESULTS.md says so.

  python3 bench/bench_quant.py [--tokens 32] [--repeat 2] [--threads 1,2] [--write]
"""
import argparse
import datetime
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom"))
STATS = re.compile(r"generated (\d+) tokens in ([\d.]+) s .*?; ([\d.]+) s of CPU")
RSS = re.compile(r"resident memory ([\d.]+) MiB")
MODES = ["fp32", "bf16", "int8"]
WBYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 34 / 32}
# SmolLM2-135M's shape (bench/smollm2-135m.yaml)
L_, C_, H_, KVH_, F_, V_ = 30, 576, 9, 3, 1536, 49152


def matrix_params():
    D = C_ // H_
    per_layer = C_ * (H_ + 2 * KVH_) * D + H_ * D * C_ + 3 * C_ * F_
    return L_ * per_layer + V_ * C_, L_ * 2 * C_ + C_  # matrices, norms


def sh(args, **kw):
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def loom_run(ckpt, prompts, batch, tokens, threads, mode):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = sh([LOOM, "generate", ckpt, "--prompts", prompts, "--tokens", str(tokens),
            "--temperature", "0", "--batch", str(batch), "--stats", "--weights", mode], env=env)
    m = STATS.search(r.stderr)
    if not m:
        sys.exit(f"no --stats line in: {r.stderr[-500:]}")
    n, wall, cpu = int(m[1]), float(m[2]), float(m[3])
    rss = RSS.search(r.stderr)
    return n / wall, n / cpu, float(rss[1]) if rss else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    w = tempfile.mkdtemp(prefix="loom-bench-quant.")
    rnd = random.Random(1)
    lines = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16)) for _ in range(16)]
    with open(f"{w}/p16.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{w}/p1.txt", "w") as f:
        f.write(lines[0] + "\n")
    if not os.path.exists(os.path.join(REPO, "data/fortunes/train/manifest.jsonl")):
        sh([LOOM, "data", "build", "recipes/fortunes.yaml"])
    ckpt = f"{w}/smol"
    sh([LOOM, "train", "bench/smollm2-135m.yaml", "--set", f"run.dir={ckpt}"],
       env=dict(os.environ, OMP_NUM_THREADS="2"))
    load0 = open("/proc/loadavg").read().split()[:3]
    res = {}
    for t in threads:
        for r in range(a.repeat):
            for b in (1, 16):
                for mode in MODES:
                    res.setdefault((t, b, mode), []).append(
                        loom_run(ckpt, f"{w}/p{b}.txt", b, a.tokens, t, mode))
                print(f"threads {t} batch {b} run {r + 1}: " + " ".join(
                    f"{mode} {res[(t, b, mode)][-1][0]:.1f}/{res[(t, b, mode)][-1][1]:.1f}"
                    for mode in MODES), file=sys.stderr, flush=True)
    load1 = open("/proc/loadavg").read().split()[:3]
    mats, norms = matrix_params()
    med = lambda k, i: statistics.median(x[i] for x in res[k])
    out = [f"## Weight precisions: fp32 / bf16 / int8 decode ({datetime.date.today()})", "",
           "`python3 bench/bench_quant.py --tokens {} --repeat {} --threads {}`: a "
           "SmolLM2-135M-shaped Llama (bench/smollm2-135m.yaml, random weights), 16-token "
           "prompts, {} greedy tokens, prefill included; tokens/s over wall time and over the "
           "process's CPU time (medians of {}); bytes per token = the weight bytes a decode "
           "step streams / rows per step (KV cache not counted). Load average {} before, {} "
           "after (the machine is shared: the CPU-time rate is the comparable one).".format(
               a.tokens, a.repeat, a.threads, a.tokens, a.repeat, "/".join(load0), "/".join(load1)),
           "", "| threads | batch | precision | tokens/s (wall) | tokens/s (CPU) | MB per token "
           "| resident MiB |", "|---|---|---|---|---|---|---|"]
    for t in threads:
        for b in (1, 16):
            for mode in MODES:
                k = (t, b, mode)
                mb = (mats * WBYTES[mode] + norms * 4) / b / 1e6
                out.append(f"| {t} | {b} | {mode} | {med(k, 0):.1f} | {med(k, 1):.1f} | "
                           f"{mb:.1f} | {med(k, 2):.0f} |")
    out += ["", "llama.cpp (F32, BF16, Q8_0 through llama-cpp-python) is still to be run beside "
            "these: it was not built on this shared 2-core machine.", ""]
    text = "\n".join(out)
    print(text)
    if a.write:
        with open(os.path.join(REPO, "bench", "RESULTS.md"), "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
