#!/usr/bin/env python3
"""Generation tokens/s: loom's engine against transformers' generate on the same weights.

One checkpoint of CONFIG's shape (one training step: speed does not depend on the weights),
exported to Hugging Face layout (`loom export --hf`). Prompts: 16 lines of 16 random letters
(the byte tokenizer: 16 tokens each; transformers gets the same ids). Greedy, TOKENS new tokens.

  batch 16: `loom generate --prompts (16 lines) --batch 16` / `generate()` on a (16, 16) batch
  batch 1:  `loom generate --prompts (line 0) --batch 1`    / `generate()` on a (1, 16) batch

transformers: float32, use_cache=True, do_sample=False, max_new_tokens=TOKENS, the model loaded
once per thread count and warmed up with one untimed generate; loom: a fresh process per run
(its own timing covers the engine's steps, not loading). Both include prefill. Runs alternate
(loom, transformers, loom, ...), REPEAT of each, for each thread count (torch.set_num_threads /
OMP_NUM_THREADS). Two rates per run: generated tokens over wall time, and over the CPU time of
the process (all threads) during generation, which on a loaded machine leaves out the time
other processes held the cores. Medians; ratios loom / transformers.

  python3 bench/bench_infer.py [--config gpt2-small] [--tokens 64] [--repeat 5]
                               [--threads 1,2] [--write]
"""
import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom"))
STATS = re.compile(r"generated (\d+) tokens in ([\d.]+) s .*?; ([\d.]+) s of CPU")


def sh(args, **kw):
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def loom_run(ckpt, prompts, batch, tokens, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = sh([LOOM, "generate", ckpt, "--prompts", prompts, "--tokens", str(tokens),
            "--temperature", "0", "--batch", str(batch), "--stats"], env=env)
    m = STATS.search(r.stderr)
    if not m:
        sys.exit(f"no --stats line in: {r.stderr[-500:]}")
    n, wall, cpu = int(m[1]), float(m[2]), float(m[3])
    return n / wall, n / cpu


class HF:
    def __init__(self, d, threads, compiled=False):
        import torch
        import transformers
        self.torch = torch
        torch.set_num_threads(threads)
        self.m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        self.kw = {}
        if compiled:  # a static cache and the compiled forward (recompiles per batch shape)
            self.m.forward = torch.compile(self.m.forward, mode="reduce-overhead")
            self.kw = {"cache_implementation": "static"}

    def run(self, ids, tokens):
        torch = self.torch
        x = torch.tensor(ids, dtype=torch.long)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = self.m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens,
                                  do_sample=False, use_cache=True, pad_token_id=0, **self.kw)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = out.shape[0] * (out.shape[1] - x.shape[1])
        return n / wall, n / cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt2-small")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--hf-compile", action="store_true",
                    help="also transformers with torch.compile and a static cache")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    w = tempfile.mkdtemp(prefix="loom-bench-infer.")
    import random
    rnd = random.Random(1)
    lines = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16)) for _ in range(16)]
    with open(f"{w}/p16.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{w}/p1.txt", "w") as f:
        f.write(lines[0] + "\n")
    ids = [[ord(c) for c in s] for s in lines]
    if not os.path.exists(os.path.join(REPO, "data/fortunes/train/manifest.jsonl")):
        sh([LOOM, "data", "build", "recipes/fortunes.yaml"])
    ckpt = f"{w}/{a.config}"
    sh([LOOM, "train", f"configs/{a.config}.yaml", "--set", f"run.dir={ckpt}", "--set",
        "training.steps=1", "--set", "checkpoint.every=1", "--set", "data.val=", "--set",
        "training.batch_size=1", "--set", "training.seq_len=32", "--set",
        "training.peak_flops=1e11"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    sh([LOOM, "export", "--hf", ckpt, f"{w}/hf"])
    load0 = open("/proc/loadavg").read().split()[:3]
    res = {}  # (threads, batch, who) -> [(wall, cpu)]
    hfs = ["hf", "hfc"] if a.hf_compile else ["hf"]
    for t in threads:
        models = {"hf": HF(f"{w}/hf", t)}
        models["hf"].run(ids[:1], 4)  # warm-up, untimed
        if a.hf_compile:
            models["hfc"] = HF(f"{w}/hf", t, compiled=True)
            for b in (16, 1):  # compiles for both shapes, untimed
                c0 = time.perf_counter()
                models["hfc"].run(ids[:b], a.tokens)
                print(f"threads {t} batch {b}: torch.compile warm-up {time.perf_counter() - c0:.0f} s",
                      file=sys.stderr, flush=True)
        for r in range(a.repeat):
            for b in (16, 1):
                res.setdefault((t, b, "loom"), []).append(
                    loom_run(ckpt, f"{w}/p{b}.txt", b, a.tokens, t))
                for h in hfs:
                    res.setdefault((t, b, h), []).append(models[h].run(ids[:b], a.tokens))
                print(f"threads {t} batch {b} run {r + 1}: " +
                      " ".join(f"{k} {res[(t, b, k)][-1][0]:.1f}/{res[(t, b, k)][-1][1]:.1f}"
                               for k in ["loom"] + hfs), file=sys.stderr, flush=True)
        del models
    load1 = open("/proc/loadavg").read().split()[:3]
    med = lambda t, b, who, k: statistics.median(x[k] for x in res[(t, b, who)])
    out = [f"## Generation vs transformers ({datetime.date.today()})", "",
           f"`python3 bench/bench_infer.py --threads {a.threads} --repeat {a.repeat} --tokens "
           f"{a.tokens}{' --hf-compile' if a.hf_compile else ''}`: {a.config} (one training step), greedy, {a.tokens} new tokens after "
           "16-token prompts; loom `generate --prompts` (16 prompts at `--batch 16`, one at "
           "`--batch 1`) against transformers `generate(do_sample=False, use_cache=True)` in "
           "float32 on the same weights (`loom export --hf`), same thread count, prefill "
           f"included. Runs alternate loom / transformers, {a.repeat} of each; medians. "
           "Wall: generated tokens over wall time; CPU: over the CPU seconds of the process "
           "during generation (on a loaded machine the comparable figure).", "",
           "| threads | batch | loom tok/s (wall) | HF tok/s (wall) | loom/HF (wall) | "
           "loom tok/CPU-s | HF tok/CPU-s | loom/HF (CPU) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if a.hf_compile:
        out[-4] += (" HF: the faster of eager and `torch.compile(mode=\"reduce-overhead\")` with "
                    "`cache_implementation=\"static\"` (compiled before timing) per column; "
                    "both are listed below the table.")
    best = lambda t, b, k: max(hfs, key=lambda h: med(t, b, h, k))
    for t in threads:
        for b in (1, 16):
            lw, lc = med(t, b, "loom", 0), med(t, b, "loom", 1)
            hw, hc = med(t, b, best(t, b, 0), 0), med(t, b, best(t, b, 1), 1)
            out.append(f"| {t} | {b} | {lw:.1f} | {hw:.1f} | {lw / hw:.2f}x | {lc:.1f} | "
                       f"{hc:.1f} | {lc / hc:.2f}x |")
    if a.hf_compile:
        out.append("")
        for t in threads:
            for b in (1, 16):
                out.append(f"- {t} thread(s), batch {b}: HF eager {med(t, b, 'hf', 0):.1f} tok/s, "
                           f"{med(t, b, 'hf', 1):.1f} tok/CPU-s; compiled {med(t, b, 'hfc', 0):.1f} "
                           f"tok/s, {med(t, b, 'hfc', 1):.1f} tok/CPU-s.")
    out.append("")
    out.append(f"Load average (1, 5, 15 min) before: {' '.join(load0)}; after: {' '.join(load1)} "
               f"({os.cpu_count()} CPUs).")
    text = "\n".join(out) + "\n"
    print(text)
    if a.write:
        p = os.path.join(REPO, "bench/RESULTS.md")
        s = open(p).read()
        s2 = re.sub(r"## Generation vs transformers \(.*?\)\n.*?(?=\n## |\Z)", text.rstrip("\n") + "\n",
                    s, flags=re.S)
        if s2 == s:
            s2 = s.rstrip("\n") + "\n\n" + text
        open(p, "w").write(s2)
    subprocess.run(["rm", "-rf", w])


if __name__ == "__main__":
    main()
