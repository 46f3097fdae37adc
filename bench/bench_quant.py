#!/usr/bin/env python3
"""Decode speed of loom's weight precisions and of llama.cpp on the same weights, one run:
loom fp32, --weights bf16, int8 (GGUF's Q8_0) and int4 (Q4_K where a matrix's rows are whole
256-blocks, Q8_0 elsewhere; docs/inference.md), and llama.cpp (through PyPI's llama-cpp-python)
on the GGUF files `loom export --gguf` writes of the same checkpoint: F32, BF16, Q8_0 and Q4_K
(the q4_k file holds the bytes loom's int4 computes with).

The models: bench/smollm2-135m.yaml, a SmolLM2-135M-shaped Llama (30 layers, d 576, GQA 9/3,
d_ff 1536, vocab 49,152, tied: issue 29's model; d 576 is not a multiple of 256, so int4 holds
only fc_proj in Q4_K there, as llama.cpp's Q4_K mixes fall back for such widths), and
bench/llama-100m.yaml (12 layers, d 768, GQA 12/4, d_ff 2048, vocab 32,000, tied: every linear
in Q4_K). Random weights (one training step on the byte data; speed does not depend on them).
Prompts: 16 lines of 16 random letters (16 tokens each, byte ids). Greedy, TOKENS new tokens;
batch 1: one prompt; batch 16 (loom only: llama-cpp-python's generate is one sequence): the 16
prompts together. Each run a fresh process: `loom generate --stats` (its own timing covers the
engine's steps, prefill included; not loading), and for llama.cpp a Python process timing
Llama.generate over the same prompt ids (prefill included; not loading). Runs alternate over
the precisions and both systems, REPEAT of each, for each thread count; medians. Two rates per
run: tokens over wall time, and over the CPU time of the process (on a loaded machine the
second leaves out the time other processes held the cores). MB per token: the weight bytes a
decode step streams (loom's --stats figure; for llama.cpp the GGUF file's tensor bytes, the
embedding lookup left out when untied) over the rows of a step; the KV cache's reads are not
counted. The greedy tokens of llama.cpp's F32 run against loom's fp32 run are compared and the
length of their common prefix printed (random weights give flat logits: near-ties part
greedy paths early in any two implementations; both systems' Q8_0 and Q4_K against their F32 too).

llama-cpp-python is not a test dependency: without it the llama.cpp rows say so.

  python3 bench/bench_quant.py [--tokens 32] [--repeat 3] [--threads 1,2]
      [--models smollm2-135m,llama-100m] [--write]
"""
import argparse
import datetime
import json
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
WB = re.compile(r"weight bytes: ([\d.]+) MB a step")
MODES = ["fp32", "bf16", "int8", "int4"]
GGUF = {"fp32": "f32", "bf16": "bf16", "int8": "q8_0", "int4": "q4_k"}  # the same weights
MODELS = {"smollm2-135m": "bench/smollm2-135m.yaml", "llama-100m": "bench/llama-100m.yaml"}

# run in a fresh Python process per llama.cpp measurement
LLAMA_RUN = r"""
import json, sys, time
import llama_cpp
path, threads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = [int(t) for t in sys.argv[4].split(",")]
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=64, n_threads=threads,
                      n_threads_batch=threads, verbose=False, seed=0)
w0, c0 = time.perf_counter(), time.process_time()
out = []
for t in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
    out.append(int(t))
    if len(out) == tokens:
        break
w1, c1 = time.perf_counter(), time.process_time()
print(json.dumps({"ids": out, "wall": w1 - w0, "cpu": c1 - c0,
                  "version": getattr(llama_cpp, "__version__", "?")}))
"""


def sh(args, **kw):
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


ISA_ENV = {}      # --isa: loom's kernel level and its libraries' pinned alike (scripts/ci_levels.sh)
LLAMA_PATH = None  # --llama-path: a llama-cpp-python installed there (pip install --target)


def loom_run(ckpt, prompts, batch, tokens, threads, mode):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **ISA_ENV)
    r = sh([LOOM, "generate", ckpt, "--prompts", prompts, "--tokens", str(tokens),
            "--temperature", "0", "--batch", str(batch), "--stats", "--weights", mode,
            "--format", "ids"], env=env)
    m = STATS.search(r.stderr)
    if not m:
        sys.exit(f"no --stats line in: {r.stderr[-500:]}")
    n, wall, cpu = int(m[1]), float(m[2]), float(m[3])
    rss, wb = RSS.search(r.stderr), WB.search(r.stderr)
    ids = json.loads(r.stdout.splitlines()[0])["ids"]
    return {"wall": n / wall, "cpu": n / cpu, "rss": float(rss[1]) if rss else 0.0,
            "mb": float(wb[1]) / batch if wb else 0.0, "ids": ids}


def llama_env(threads=None):
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if LLAMA_PATH:
        env["PYTHONPATH"] = LLAMA_PATH + os.pathsep + env.get("PYTHONPATH", "")
    return env


def have_llama():
    r = subprocess.run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__, "
                        "llama_cpp.llama_print_system_info().decode())"],
                       capture_output=True, text=True, env=llama_env())
    return r.stdout.strip() if r.returncode == 0 else None


def llama_run(path, prompt, tokens, threads):
    env = llama_env(threads)
    r = subprocess.run([sys.executable, "-c", LLAMA_RUN, path, str(threads), str(tokens),
                        ",".join(map(str, prompt))], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"llama.cpp on {path}: exit {r.returncode}\n{r.stderr[-2000:]}")
    o = json.loads(r.stdout.strip().splitlines()[-1])
    n = len(o["ids"])
    return {"wall": n / o["wall"], "cpu": n / o["cpu"], "ids": o["ids"]}


def gguf_stream_mb(path):
    """the tensor bytes of a GGUF file a decode step reads (an untied token_embd is a lookup)"""
    import gguf
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    tot = sum(int(t.n_bytes) for t in r.tensors
              if not (t.name == "token_embd.weight" and "output.weight" in names))
    return tot / 1e6


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="smollm2-135m,llama-100m")
    ap.add_argument("--isa", choices=["", "avx2", "avx512"], default="",
                    help="pin loom's kernels (LOOM_ISA) and oneDNN / OpenBLAS to this level")
    ap.add_argument("--llama-path", default="",
                    help="a folder holding a llama-cpp-python build (e.g. one without AVX-512)")
    ap.add_argument("--write", action="store_true", help="append the tables to bench/RESULTS.md")
    a = ap.parse_args()
    global LLAMA_PATH
    LLAMA_PATH = a.llama_path or None
    if a.isa:
        ISA_ENV.update({"LOOM_ISA": a.isa,
                        "ONEDNN_MAX_CPU_ISA": "AVX2" if a.isa == "avx2" else "AVX512_CORE",
                        "OPENBLAS_CORETYPE": "Haswell" if a.isa == "avx2" else "SkylakeX"})
    threads = [int(t) for t in a.threads.split(",")]
    models = a.models.split(",")
    w = tempfile.mkdtemp(prefix="loom-bench-quant.")
    rnd = random.Random(1)
    lines = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16)) for _ in range(16)]
    with open(f"{w}/p16.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{w}/p1.txt", "w") as f:
        f.write(lines[0] + "\n")
    prompt_ids = list(lines[0].encode())  # the byte tokenizer: id = byte
    llama_ver = have_llama()
    if not os.path.exists(os.path.join(REPO, "data/fortunes/train/manifest.jsonl")):
        sh([LOOM, "data", "build", "recipes/fortunes.yaml"])
    isa = sh([LOOM, "version"], env=dict(os.environ, **ISA_ENV)).stdout.strip().splitlines()
    load0 = open("/proc/loadavg").read().split()[:3]
    out = []
    for model in models:
        ckpt = f"{w}/{model}"
        sh([LOOM, "train", MODELS[model], "--set", f"run.dir={ckpt}"],
           env=dict(os.environ, OMP_NUM_THREADS="2"))
        files = {}
        if llama_ver:
            for mode in MODES:
                files[mode] = f"{w}/{model}-{GGUF[mode]}.gguf"
                sh([LOOM, "export", "--gguf", ckpt, files[mode], "--type", GGUF[mode]])
        res = {}
        for t in threads:
            for r in range(a.repeat):
                for b in (1, 16):
                    for mode in MODES:
                        res.setdefault(("loom", t, b, mode), []).append(
                            loom_run(ckpt, f"{w}/p{b}.txt", b, a.tokens, t, mode))
                        if llama_ver and b == 1:
                            res.setdefault(("llama.cpp", t, b, mode), []).append(
                                llama_run(files[mode], prompt_ids, a.tokens, t))
                    print(f"{model} threads {t} batch {b} run {r + 1}: " + " ".join(
                        f"{sy}:{mode} {res[(sy, t, b, mode)][-1]['wall']:.1f}/"
                        f"{res[(sy, t, b, mode)][-1]['cpu']:.1f}"
                        for sy in ("loom", "llama.cpp") for mode in MODES
                        if (sy, t, b, mode) in res), file=sys.stderr, flush=True)
        med = lambda k, f: statistics.median(x[f] for x in res[k])
        out += [f"### {model}", "", "| threads | batch | weights | loom tokens/s (wall) | loom "
                "tokens/s (CPU) | llama.cpp tokens/s (wall) | llama.cpp tokens/s (CPU) | "
                "loom / llama.cpp (CPU) | MB per token loom / llama.cpp | loom resident MiB |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for t in threads:
            for b in (1, 16):
                for mode in MODES:
                    k, kl = ("loom", t, b, mode), ("llama.cpp", t, b, mode)
                    lc = kl in res
                    lw = f"{med(kl, 'wall'):.1f}" if lc else "—"
                    lcpu = f"{med(kl, 'cpu'):.1f}" if lc else "—"
                    ratio = f"{med(k, 'cpu') / med(kl, 'cpu'):.2f}x" if lc else "—"
                    mb = f"{med(k, 'mb'):.1f}"
                    if lc:
                        mb += f" / {gguf_stream_mb(files[mode]):.1f}"
                    out.append(f"| {t} | {b} | {mode} ({GGUF[mode]}) | {med(k, 'wall'):.1f} | "
                               f"{med(k, 'cpu'):.1f} | {lw} | {lcpu} | {ratio} | {mb} | "
                               f"{med(k, 'rss'):.0f} |")
        if llama_ver:
            lf = res[("loom", threads[0], 1, "fp32")][0]["ids"]
            cf = res[("llama.cpp", threads[0], 1, "fp32")][0]["ids"]
            agree = [f"greedy tokens, common prefix of {a.tokens}: loom fp32 vs llama.cpp F32 "
                     f"{common_prefix(lf, cf)}"]
            for mode in ("int8", "int4"):
                agree.append(f"loom {mode} vs loom fp32 "
                             f"{common_prefix(res[('loom', threads[0], 1, mode)][0]['ids'], lf)}, "
                             f"llama.cpp {GGUF[mode]} vs loom {mode} "
                             f"{common_prefix(res[('llama.cpp', threads[0], 1, mode)][0]['ids'], res[('loom', threads[0], 1, mode)][0]['ids'])}")
            out += ["", "; ".join(agree) + "."]
        out.append("")
    load1 = open("/proc/loadavg").read().split()[:3]
    head = [f"## Weight precisions: loom fp32 / bf16 / int8 / int4 and llama.cpp, decode "
            f"({datetime.date.today()})", "",
            f"`python3 bench/bench_quant.py --tokens {a.tokens} --repeat {a.repeat} --threads "
            f"{a.threads} --models {a.models}"
            + (f" --isa {a.isa}" if a.isa else "") + (f" --llama-path {a.llama_path}" if a.llama_path else "")
            + f"`: 16-token prompts, {a.tokens} greedy tokens, "
            f"prefill included; medians of {a.repeat} alternating runs; llama.cpp: "
            + (f"llama-cpp-python {llama_ver.split()[0]} (built from source here; ggml reports "
               f"`{' '.join(llama_ver.split()[1:])}`) on the GGUF files loom exported from the "
               "same checkpoint" if llama_ver else
               "not installed (pip install llama-cpp-python), its columns empty")
            + f". {'; '.join(isa[:2])}. Load average {'/'.join(load0)} before, "
            f"{'/'.join(load1)} after.", ""]
    text = "\n".join(head + out)
    print(text)
    if a.write:
        with open(os.path.join(REPO, "bench", "RESULTS.md"), "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
