#!/usr/bin/env python3
"""Generation tokens/s: loom's engine against transformers' generate on the same weights.

One checkpoint of CONFIG's shape (one training step: speed does not depend on the weights),
exported to Hugging Face layout (`loom export --hf`). Prompts: 16 lines of 16 random letters
(the byte tokenizer: 16 tokens each; transformers gets the same ids). Greedy, TOKENS new tokens.

  batch 16: `loom generate --prompts (16 lines) --batch 16` / `generate()` on a (16, 16) batch
  batch 1:  `loom generate --prompts (line 0) --batch 1`    / `generate()` on a (1, 16) batch

transformers: use_cache=True, do_sample=False, max_new_tokens=TOKENS, the model loaded once per
thread count and configuration and warmed up with one untimed generate: float32 eager, and with
--hf-compile torch.compile(mode="reduce-overhead") with a static cache; with --bf16 the same in
bfloat16 (dtype=torch.bfloat16), and loom also with --weights bf16 and with --compute bf16
(bf16 weights and bf16 activations into the linears, fp32 accumulation: docs/inference.md). The
peer of each loom row is the fastest transformers configuration (per column); the fp32-only
peer is reported too. With --bf16 the quality cost of both bf16 modes is measured on the same
weights: max |logit diff| (over the 64-token greedy continuation of every prompt, relative to
the largest |logit|) against fp32 of PyTorch with the matrices rounded to bf16 (what loom
--weights bf16 computes to ~1e-6: tests/reference/test_infer_bf16.py), and of the same with
the linears' and the head's inputs rounded to bf16 too (what loom --compute bf16 computes:
tests/reference/test_infer_bf16c.py), and the greedy agreement of each loom mode with loom
fp32 over 64 tokens. loom: a fresh process per run
(its own timing covers the engine's steps, not loading). Both include prefill. Runs alternate
(loom, transformers, loom, ...), REPEAT of each, for each thread count (torch.set_num_threads /
OMP_NUM_THREADS). Two rates per run: generated tokens over wall time, and over the CPU time of
the process (all threads) during generation, which on a loaded machine leaves out the time
other processes held the cores. Medians; ratios loom / transformers.

  python3 bench/bench_infer.py [--config gpt2-small] [--tokens 64] [--repeat 5]
                               [--threads 1,2] [--hf-compile] [--bf16] [--write]
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
RSS = re.compile(r"resident memory ([\d.]+) MiB")
RESIDENT = {}  # mode -> resident MiB at the end of each loom run
MODES = {"fp32": ["--weights", "fp32"], "bf16": ["--weights", "bf16"],
         "bf16c": ["--compute", "bf16"]}  # loom's modes: the flags
LOOMS = {"loom": "fp32", "loomb": "bf16", "loomc": "bf16c"}  # configuration -> mode
LABEL = {"fp32": "fp32", "bf16": "bf16 weights", "bf16c": "bf16 compute"}


def sh(args, **kw):
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r


def loom_run(ckpt, prompts, batch, tokens, threads, mode="fp32"):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = sh([LOOM, "generate", ckpt, "--prompts", prompts, "--tokens", str(tokens),
            "--temperature", "0", "--batch", str(batch), "--stats", *MODES[mode]], env=env)
    m = STATS.search(r.stderr)
    if not m:
        sys.exit(f"no --stats line in: {r.stderr[-500:]}")
    n, wall, cpu = int(m[1]), float(m[2]), float(m[3])
    rss = RSS.search(r.stderr)
    if rss:
        RESIDENT.setdefault(mode, []).append(float(rss[1]))
    return n / wall, n / cpu


class HF:
    def __init__(self, d, threads, compiled=False, bf16=False):
        import torch
        import transformers
        self.torch = torch
        torch.set_num_threads(threads)
        dt = torch.bfloat16 if bf16 else torch.float32
        self.m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dt).eval()
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


def quality(ckpt, hfdir, prompts_file, ids, threads):
    """the bf16 modes' cost: PyTorch logits with the matrices rounded (what loom --weights bf16
    computes), and with the linears' inputs rounded too (--compute bf16), against fp32 along
    each prompt's 64-token greedy continuation; loom fp32 vs each loom bf16 mode's greedy
    tokens over 64 tokens"""
    import json

    import torch
    import transformers
    torch.set_num_threads(threads)
    m32 = transformers.AutoModelForCausalLM.from_pretrained(hfdir, dtype=torch.float32).eval()
    mbf = transformers.AutoModelForCausalLM.from_pretrained(hfdir, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in mbf.named_parameters():
            if p.dim() == 2 and not name.endswith("wpe.weight") and "embed_tokens" not in name:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    mbc = transformers.AutoModelForCausalLM.from_pretrained(hfdir, dtype=torch.float32).eval()
    mbc.load_state_dict(mbf.state_dict())
    for mod in mbc.modules():  # the inputs of the linears and the head rounded to bf16
        if isinstance(mod, (torch.nn.Linear, transformers.pytorch_utils.Conv1D)):
            mod.register_forward_pre_hook(
                lambda _, a: (a[0].to(torch.bfloat16).to(torch.float32),) + tuple(a[1:]))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    maxT = getattr(m32.config, "n_positions", None) or m32.config.max_position_embeddings
    n_new = min(64, maxT - max(len(p) for p in ids))
    outs = {}
    for mode in MODES:
        r = sh([LOOM, "generate", ckpt, "--prompts", prompts_file, "--tokens", str(n_new),
                "--temperature", "0", "--batch", "16", "--format", "ids", *MODES[mode]], env=env)
        outs[mode] = [json.loads(l)["ids"] for l in r.stdout.splitlines()]
    mhf = transformers.AutoModelForCausalLM.from_pretrained(hfdir, dtype=torch.bfloat16).eval()
    worst = {"bf16": 0.0, "bf16c": 0.0, "hf": 0.0}
    with torch.no_grad():
        for p, g in zip(ids, outs["fp32"]):
            x = torch.tensor([p + g])
            a = m32(x).logits[0]
            for k, m in (("bf16", mbf), ("bf16c", mbc), ("hf", mhf)):
                d = m(x).logits[0].float()
                worst[k] = max(worst[k], float((a - d).abs().max() / a.abs().max()))
    agree = {}
    for mode in ("bf16", "bf16c"):
        ks = []
        for a, b in zip(outs["fp32"], outs[mode]):
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            ks.append(k)
        same = sum(a == b for a, b in zip(outs["fp32"], outs[mode]))
        agree[mode] = (same, statistics.mean(ks), min(ks))
    return worst, agree, len(ids), n_new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt2-small")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--hf-compile", action="store_true",
                    help="also transformers with torch.compile and a static cache")
    ap.add_argument("--bf16", action="store_true",
                    help="also loom --weights bf16, loom --compute bf16 and transformers in "
                         "bfloat16, and the quality cost")
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
    if a.bf16:
        hfs += ["hfb", "hfbc"] if a.hf_compile else ["hfb"]
    looms = ["loom", "loomb", "loomc"] if a.bf16 else ["loom"]
    for t in threads:
        models = {}
        for h in hfs:
            models[h] = HF(f"{w}/hf", t, compiled=h.endswith("c"), bf16=h.startswith("hfb"))
            for b in (16, 1):  # warm-up (compiles for both shapes), untimed
                c0 = time.perf_counter()
                models[h].run(ids[:b], a.tokens if h.endswith("c") else 4)
                print(f"threads {t} batch {b}: {h} warm-up {time.perf_counter() - c0:.0f} s",
                      file=sys.stderr, flush=True)
        for r in range(a.repeat):
            for b in (16, 1):
                for k in looms + hfs:  # interleaved: every configuration once per round
                    if k.startswith("loom"):
                        v = loom_run(ckpt, f"{w}/p{b}.txt", b, a.tokens, t, LOOMS[k])
                    else:
                        v = models[k].run(ids[:b], a.tokens)
                    res.setdefault((t, b, k), []).append(v)
                print(f"threads {t} batch {b} run {r + 1}: " +
                      " ".join(f"{k} {res[(t, b, k)][-1][0]:.1f}/{res[(t, b, k)][-1][1]:.1f}"
                               for k in looms + hfs), file=sys.stderr, flush=True)
        del models
    qual = quality(ckpt, f"{w}/hf", f"{w}/p16.txt", ids, threads[0]) if a.bf16 else None
    load1 = open("/proc/loadavg").read().split()[:3]
    med = lambda t, b, who, k: statistics.median(x[k] for x in res[(t, b, who)])
    names = {"hf": "fp32 eager", "hfc": "fp32 compiled", "hfb": "bf16 eager",
             "hfbc": "bf16 compiled"}
    out = [f"## Generation vs transformers ({datetime.date.today()})", "",
           f"`python3 bench/bench_infer.py --threads {a.threads} --repeat {a.repeat} --tokens "
           f"{a.tokens}{' --hf-compile' if a.hf_compile else ''}{' --bf16' if a.bf16 else ''}"
           f"{' --write' if a.write else ''}` ({datetime.datetime.now():%Y-%m-%d %H:%M}): "
           f"{a.config} (one training step), greedy, {a.tokens} new tokens after "
           "16-token prompts; loom `generate --prompts` (16 prompts at `--batch 16`, one at "
           "`--batch 1`) against transformers `generate(do_sample=False, use_cache=True)` on the "
           "same weights (`loom export --hf`), same thread count, prefill included. Runs "
           f"interleaved (every configuration once per round), {a.repeat} rounds; medians. "
           "Wall: generated tokens over wall time; CPU: over the CPU seconds of the process "
           "during generation (on a loaded machine the comparable figure). HF: the fastest of "
           f"the configurations run ({', '.join(names[h] for h in hfs)}; compiled = "
           "`torch.compile(mode=\"reduce-overhead\")` with `cache_implementation=\"static\"`, "
           "compiled before timing), per column; every configuration is listed below the table. "
           "loom fp32 is bit-identical to the default; bf16 weights is `--weights bf16`, bf16 "
           "compute `--compute bf16` (docs/inference.md).", "",
           "| threads | batch | loom | loom tok/s (wall) | HF best tok/s (wall) | "
           "loom/HF (wall) | loom tok/CPU-s | HF best tok/CPU-s | loom/HF (CPU) | "
           "loom/HF fp32 best (CPU) |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    fp32s = [h for h in hfs if not h.startswith("hfb")]
    best = lambda t, b, k, pool: max(pool, key=lambda h: med(t, b, h, k))
    for t in threads:
        for b in (1, 16):
            for lk in looms:
                lw, lc = med(t, b, lk, 0), med(t, b, lk, 1)
                bw, bc = best(t, b, 0, hfs), best(t, b, 1, hfs)
                hw, hc = med(t, b, bw, 0), med(t, b, bc, 1)
                fc = med(t, b, best(t, b, 1, fp32s), 1)
                out.append(f"| {t} | {b} | {LABEL[LOOMS[lk]]} | {lw:.1f} | "
                           f"{hw:.1f} ({names[bw]}) | {lw / hw:.2f}x | {lc:.1f} | {hc:.1f} "
                           f"({names[bc]}) | {lc / hc:.2f}x | {lc / fc:.2f}x |")
    out.append("")
    for t in threads:
        for b in (1, 16):
            out.append(f"- {t} thread(s), batch {b}: " + "; ".join(
                f"HF {names[h]} {med(t, b, h, 0):.1f} tok/s, {med(t, b, h, 1):.1f} tok/CPU-s"
                for h in hfs) + "; " + "; ".join(
                f"loom {LABEL[LOOMS[k]]} {med(t, b, k, 0):.1f} tok/s, "
                f"{med(t, b, k, 1):.1f} tok/CPU-s" for k in looms) + ".")
    if len(RESIDENT) >= 2:
        out.append("")
        out.append("Resident memory of `loom generate` at the end of a run (largest over the "
                   "runs, KV cache and workspace included): " + ", ".join(
                       f"{LABEL[k]} {max(v):.0f} MiB" for k, v in RESIDENT.items()) + ".")
    if qual:
        worst, agree, n, n_new = qual
        out.append("")
        out.append(f"Quality cost of the bf16 modes on these weights (a one-step checkpoint, "
                   f"not a trained language model), max |logit diff| / max |logit| against "
                   f"fp32 over each prompt and its {n_new}-token greedy continuation (PyTorch "
                   f"computing what each mode computes): `--weights bf16` {worst['bf16']:.2e}, "
                   f"`--compute bf16` {worst['bf16c']:.2e}; greedy tokens against loom fp32, "
                   f"{n_new} tokens: " + "; ".join(
                       f"{LABEL[k]} {agree[k][0]} of {n} prompts identical, on average the "
                       f"first {agree[k][1]:.1f} tokens agree (fewest {agree[k][2]})"
                       for k in ("bf16", "bf16c")) + f". For comparison, transformers in "
                   f"bfloat16 (all arithmetic in bf16): {worst['hf']:.2e}.")
    out.append("")
    out.append(f"Load average (1, 5, 15 min) before: {' '.join(load0)}; after: {' '.join(load1)} "
               f"({os.cpu_count()} CPUs).")
    text = "\n".join(out) + "\n"
    print(text)
    if a.write:  # our section of the shared RESULTS.md (bench/results_md.py)
        from results_md import replace_section
        replace_section(text, "## Generation vs transformers (", os.path.join(REPO, "bench/RESULTS.md"))
    subprocess.run(["rm", "-rf", w])


if __name__ == "__main__":
    main()
