#!/usr/bin/env python3
"""loom's CUDA backend against PyTorch on the same GPU (scripts/gpu_check.sh runs it).

Three sections, each side by side in one run, each in its own time budget (a section that
fails or runs out of time is reported as such; the others still run):

  train      GPT-2 124M (configs/gpt2-small.yaml's shape), T = 1024, bf16 mixed precision:
             `loom train` with model.backend cuda (median tokens/s of the measured steps from
             metrics.jsonl, and its MFU against the device's peak from data/hardware) against
             PyTorch's best of eager and torch.compile: tests/reference/torch_ref.Ref (the same
             decoder) in fp32 parameters under torch.autocast(bfloat16), SDPA (its flash
             backend), fused AdamW, clipping. Same FLOPs per token for both
             (torch_ref.train_flops_per_token), same peak.
  attention  causal flash attention forward + backward, bf16, B*T = 16384 tokens, H*D = 2048
             (FlashAttention-3's paper's sizing), T = 1k, 4k, 16k, D = 64, 128:
             bench/bench_gpu_attn (loom's bf16_flash_attention_* ops) against
             F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION); TFLOP/s with 4
             D FLOPs per causal (query, key) pair forward and 10 D backward for both.
  generate   greedy decoding, 128 new tokens after a 16-token prompt, batch 1 and 64:
             `loom generate --prompts` on cuda against transformers' generate() on the same
             weights (`loom export --hf`), bf16 and fp32, on the GPU.

  python3 bench/bench_gpu.py --out DIR [--loom build/loom] [--sections train,attention,generate]
  python3 bench/bench_gpu.py --smoke --out DIR    # tiny shapes on cuda-emu and PyTorch's CPU:
                                                  # checks the script itself, measures nothing
Writes DIR/bench_gpu.json and prints one table per section (DIR/bench_gpu.md)."""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))


def log(msg):
    print(f"[bench_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, timeout, env=None):
    log("  " + " ".join(cmd))
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed "
                           f"({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def make_corpus(loom, work, timeout):
    """a word corpus built into byte-token shards (the GPU machine has no fortunes)"""
    import random
    rnd = random.Random(5)
    words = ("the of and to in is was for on that with as by at from his her an which or "
             "model token layer gradient tensor kernel memory device stream").split()
    os.makedirs(os.path.join(work, "corpus"), exist_ok=True)
    with open(os.path.join(work, "corpus", "a.txt"), "w") as f:
        for _ in range(4000):
            f.write(" ".join(rnd.choice(words) for _ in range(rnd.randint(50, 400))) + "\n%\n")
    recipe = os.path.join(work, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write(f"name: gpu\nsources:\n  - name: c\n    kind: text\n    path: {work}/corpus\n"
                f"    split: \"\\n%\\n\"\ntokenizer: byte\nseq_len: 1024\nval_fraction: 0.02\n"
                f"output: {work}/data\nshard_tokens: 1048576\n")
    run([loom, "data", "build", recipe], timeout)
    return os.path.join(work, "data", "train")


# ---- train ------------------------------------------------------------------------------

def train_cfg(smoke):
    if smoke:
        return {"flavor": "gpt2", "vocab_size": 256, "d_model": 32, "n_layer": 2, "n_head": 2,
                "max_seq_len": 64}, 2, 64
    return {"flavor": "gpt2", "vocab_size": 50257, "d_model": 768, "n_layer": 12,
            "n_head": 12, "max_seq_len": 1024}, 16, 1024


def bench_train_loom(loom, backend, data, cfg, B, T, warmup, measured, timeout):
    with tempfile.TemporaryDirectory(prefix="loom-gpu-") as rd:
        sets = {"run.dir": rd, "data.train": data, "data.val": "", "model.backend": backend,
                "training.precision": "bf16", "training.batch_size": B, "training.seq_len": T,
                "training.steps": warmup + measured, "checkpoint.every": 0, "eval.every": 0,
                "training.warmup": 2}
        for k, v in cfg.items():
            sets["model." + k] = v
        cmd = [loom, "train", os.path.join(REPO, "configs", "gpt2-small.yaml")]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        run(cmd, timeout)
        rows = [json.loads(l) for l in open(os.path.join(rd, "metrics.jsonl")) if l.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r.get("step", 0) > warmup]
    if not rows:
        raise RuntimeError("loom wrote no measured steps")
    mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
    return {"tok_s": statistics.median(r["tokens_per_s"] for r in rows),
            "mfu": statistics.median(mfu) if mfu else None,
            "peak": rows[0].get("peak_flops"), "steps": len(rows),
            "losses": [r["loss"] for r in rows]}


def bench_train_torch(cfg, B, T, warmup, measured, compile_, device):
    import torch
    import torch_ref
    torch.manual_seed(0)
    model = torch_ref.Ref(cfg, dtype=torch.float32, device=device)
    fwd = torch.compile(model) if compile_ else model
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            fused=True)
    V = cfg["vocab_size"]
    times, losses = [], []
    for i in range(warmup + measured):
        x = torch.randint(0, V, (B, T), device=device)
        y = torch.randint(0, V, (B, T), device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            _, loss = fwd(x, y)
        loss.float().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()  # (synchronizes)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(lv)
    med = statistics.median(times)
    return {"tok_s": B * T / med, "steps": len(times), "losses": losses}


def section_train(a, res):
    import torch_ref
    cfg, B, T = train_cfg(a.smoke)
    warmup, measured = (1, 2) if a.smoke else (3, 10)
    fpt = torch_ref.train_flops_per_token(dict(cfg), T)
    out = {"B": B, "T": T, "flops_per_token": fpt}
    work = tempfile.mkdtemp(prefix="loom-gpu-data-")
    data = make_corpus(a.loom, work, 300)
    out["loom"] = bench_train_loom(a.loom, a.backend, data, cfg, B, T, warmup, measured, 900)
    best = None
    for comp in ([False] if a.smoke or a.no_compile else [False, True]):
        key = "torch_compile" if comp else "torch_eager"
        try:
            out[key] = bench_train_torch(cfg, B, T, warmup + (2 if comp else 0), measured, comp,
                                         a.device)
            if best is None or out[key]["tok_s"] > out[best]["tok_s"]:
                best = key
        except Exception as e:  # a failed torch.compile leaves eager as the peer
            out[key] = {"error": str(e)[-500:]}
    out["peer"] = best
    peak = out["loom"].get("peak")
    if best:
        out["ratio"] = out["loom"]["tok_s"] / out[best]["tok_s"]
        if peak:
            out[best]["mfu"] = out[best]["tok_s"] * fpt / peak
    res["train"] = out


# ---- attention --------------------------------------------------------------------------

def sdpa_time(B, T, H, D, reps, device):
    import torch
    import torch.nn.functional as F
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(B, H, T, D, device=device, dtype=torch.bfloat16) * 1e-2
    ctx = None
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        ctx.__enter__()
    tf, tb = [], []
    try:
        for r in range(reps + 1):
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            sync()
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            sync()
            t1 = time.perf_counter()
            o.backward(g)
            sync()
            t2 = time.perf_counter()
            if r:
                tf.append((t1 - t0) * 1e3)
                tb.append((t2 - t1) * 1e3)
            q.grad = k.grad = v.grad = None
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    return statistics.median(tf), statistics.median(tb)


def section_attention(a, res):
    attn_bin = os.path.join(os.path.dirname(a.loom), "tests", "bench_gpu_attn")
    shapes = ([(1, 64, 2, 16)] if a.smoke else
              [(16384 // T, T, 2048 // D, D) for D in (64, 128) for T in (1024, 4096, 16384)])
    reps = 2 if a.smoke else 10
    rows = []
    for B, T, H, D in shapes:
        row = {"B": B, "T": T, "H": H, "D": D}
        try:
            j = json.loads(run([attn_bin, a.backend, str(B), str(T), str(H), str(D), str(reps)],
                               600).strip().splitlines()[-1])
            pairs = j["pairs"] * B * H
            row["loom_fwd_ms"], row["loom_bwd_ms"] = j["fwd_ms"], j["bwd_ms"]
            row["loom_tflops"] = 14 * D * pairs / ((j["fwd_ms"] + j["bwd_ms"]) * 1e-3) / 1e12
        except Exception as e:
            row["loom_error"] = str(e)[-400:]
        try:
            f, b = sdpa_time(B, T, H, D, reps, a.device)
            # the same FLOP count for both sides: loom's causal pairs (64-row blocks)
            pairs = (T * (T + 64) // 2) * B * H
            row["sdpa_fwd_ms"], row["sdpa_bwd_ms"] = f, b
            row["sdpa_tflops"] = 14 * D * pairs / ((f + b) * 1e-3) / 1e12
        except Exception as e:
            row["sdpa_error"] = str(e)[-400:]
        if "loom_tflops" in row and "sdpa_tflops" in row:
            row["ratio"] = row["loom_tflops"] / row["sdpa_tflops"]
        rows.append(row)
        log(f"  attention {row}")
    res["attention"] = rows


# ---- generate ---------------------------------------------------------------------------

def section_generate(a, res):
    import torch
    cfg, _, _ = train_cfg(a.smoke)
    work = tempfile.mkdtemp(prefix="loom-gpu-gen-")
    data = make_corpus(a.loom, work, 300)
    rd = os.path.join(work, "run")
    cmd = [a.loom, "train", os.path.join(REPO, "configs", "gpt2-small.yaml"), "--set",
           f"run.dir={rd}", "--set", f"data.train={data}", "--set", "data.val=", "--set",
           "training.steps=1", "--set", "checkpoint.every=1", "--set", "eval.every=0",
           "--set", "training.seq_len=64", "--set", "training.batch_size=2", "--set",
           f"model.backend={a.backend}"]
    for k, v in cfg.items():
        cmd += ["--set", f"model.{k}={v}"]
    run(cmd, 600)
    ck = sorted(d for d in os.listdir(os.path.join(rd, "ckpt")) if d.startswith("step_"))[-1]
    ck = os.path.join(rd, "ckpt", ck)
    hf = os.path.join(work, "hf")
    run([a.loom, "export", "--hf", ck, hf], 600)
    import random
    rnd = random.Random(9)
    tokens = 16 if a.smoke else 128
    out = []
    for batch in (1, 4 if a.smoke else 64):
        prompts = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16))
                   for _ in range(batch)]
        pf = os.path.join(work, f"prompts{batch}.txt")
        with open(pf, "w") as f:
            f.write("\n".join(prompts) + "\n")
        row = {"batch": batch, "tokens": tokens}
        for mode, extra in (("fp32", []), ("bf16", ["--weights", "bf16"])):
            try:
                p = subprocess.run([a.loom, "generate", ck, "--prompts", pf, "--batch",
                                    str(batch), "--tokens", str(tokens), "--temperature", "0",
                                    "--stats"] + extra, cwd=REPO, capture_output=True,
                                   text=True, timeout=600,
                                   env=dict(os.environ, LOOM_BACKEND=a.backend))
                if p.returncode != 0:
                    raise RuntimeError(p.stderr[-2000:])
                # the engine's own rate (prefill and decode, loading not counted), as
                # transformers' generate() is timed below
                m = re.search(r"generated (\d+) tokens in ([0-9.]+) s", p.stderr)
                if not m:
                    raise RuntimeError("no --stats line: " + p.stderr[-500:])
                row[f"loom_{mode}_tok_s"] = int(m.group(1)) / float(m.group(2))
            except Exception as e:
                row[f"loom_{mode}_error"] = str(e)[-400:]
        try:
            from transformers import AutoModelForCausalLM
            for mode, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                m = AutoModelForCausalLM.from_pretrained(hf, dtype=dt).to(a.device).eval()
                ids = torch.tensor([[ord(c) for c in p] for p in prompts], device=a.device)
                with torch.no_grad():
                    m.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    m.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens,
                               do_sample=False)
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                row[f"hf_{mode}_tok_s"] = batch * tokens / (time.perf_counter() - t0)
                del m
        except Exception as e:
            row["hf_error"] = str(e)[-400:]
        for mode in ("fp32", "bf16"):
            if f"loom_{mode}_tok_s" in row and f"hf_{mode}_tok_s" in row:
                row[f"ratio_{mode}"] = row[f"loom_{mode}_tok_s"] / row[f"hf_{mode}_tok_s"]
        out.append(row)
        log(f"  generate {row}")
    res["generate"] = out


def table(res):
    L = []
    t = res.get("train")
    if t:
        L.append("## GPT-2 124M training (bf16, T = %d, batch %d)" % (t["T"], t["B"]))
        L.append("| side | tokens/s | MFU |")
        L.append("|---|---|---|")
        for k in ("loom", "torch_eager", "torch_compile"):
            r = t.get(k)
            if not r:
                continue
            if "error" in r:
                L.append(f"| {k} | failed: {r['error'][:80]} | |")
                continue
            mfu = r.get("mfu")
            L.append(f"| {k} | {r['tok_s']:,.0f} | {'' if mfu is None else f'{100 * mfu:.1f}%'} |")
        if t.get("ratio"):
            L.append(f"\nloom / PyTorch's best ({t['peer']}): {t['ratio']:.2f}x")
    if res.get("attention"):
        L.append("\n## Flash attention forward + backward (bf16, causal), TFLOP/s")
        L.append("| T | D | loom | SDPA flash | loom / SDPA |")
        L.append("|---|---|---|---|---|")
        for r in res["attention"]:
            lo = f"{r['loom_tflops']:.1f}" if "loom_tflops" in r else "failed"
            sd = f"{r['sdpa_tflops']:.1f}" if "sdpa_tflops" in r else "failed"
            ra = f"{r['ratio']:.2f}x" if "ratio" in r else ""
            L.append(f"| {r['T']} | {r['D']} | {lo} | {sd} | {ra} |")
    if res.get("generate"):
        L.append("\n## Generation (greedy), tokens/s")
        L.append("| batch | loom fp32 | transformers fp32 | loom bf16 | transformers bf16 |")
        L.append("|---|---|---|---|---|")
        for r in res["generate"]:
            f = lambda k: f"{r[k]:,.0f}" if k in r else "failed"
            L.append(f"| {r['batch']} | {f('loom_fp32_tok_s')} | {f('hf_fp32_tok_s')} | "
                     f"{f('loom_bf16_tok_s')} | {f('hf_bf16_tok_s')} |")
    for k, v in res.get("errors", {}).items():
        L.append(f"\n{k}: FAILED: {v[:600]}")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--loom", default=os.path.join(REPO, "build", "loom"))
    ap.add_argument("--sections", default="train,attention,generate")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    a.loom = os.path.abspath(a.loom)
    a.backend = "cuda-emu" if a.smoke else "cuda"
    a.device = "cpu" if a.smoke else "cuda"
    os.makedirs(a.out, exist_ok=True)
    res = {"errors": {}, "smoke": a.smoke}
    for s in a.sections.split(","):
        t0 = time.perf_counter()
        try:
            {"train": section_train, "attention": section_attention,
             "generate": section_generate}[s](a, res)
        except Exception as e:
            res["errors"][s] = str(e)[-2000:]
            log(f"{s}: FAILED: {str(e)[-600:]}")
        log(f"{s}: {time.perf_counter() - t0:.0f} s")
        with open(os.path.join(a.out, "bench_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
    md = table(res)
    with open(os.path.join(a.out, "bench_gpu.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
