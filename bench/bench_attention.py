#!/usr/bin/env python3
"""Attention forward+backward, loom's flash kernel vs PyTorch's SDPA and loom's materialized
attention, on the byte-tiny shape (configs/byte-tiny.yaml: d_model 256, 4 heads, so H = KVH = 4,
D = 64), causal, B = 1, at T = 4096 and T = 1024 (--T to change).

Variants (each timed in its own process, so peak RSS is per variant):
  flash          loom flash_attention_forward + _backward, inner loops chosen at run time
                 (AVX-512 here when the CPU has it), on fused qkv rows (B,T,(H+2KVH)D) as the
                 model holds them
  flash-blas     the same with the tile products through OpenBLAS sgemm (the measurement
                 behind using hand-written microkernels)
  flash-avx2     the same with the portable C inner loops compiled for AVX2 + FMA
  flash-portable the same with the portable C inner loops at the x86-64 baseline
  flash-window   flash with a sliding window of --window positions (default 512; a query
                 sees its own and the W - 1 before it): the key tiles outside the window are
                 skipped, so its cost grows as T*W, not T^2/2 (not the same attention as the
                 others: compare it with `flash`)
  sdpa-loom      loom's materialized attention_forward/_backward (the reference path: (B,H,T,T)
                 probabilities and scratch)
  torch          F.scaled_dot_product_attention(is_causal=True) on (B,H,T,D) float32 tensors,
                 forward + backward; eager and torch.compile, the faster kept (PyTorch's best)
  flash-avx2-c   the same with the portable C inner loops compiled for AVX2 + FMA (what the
                 avx2 level ran before its intrinsics)
Levels (--levels, default every one of avx512, avx2 this CPU runs): each variant's processes
are pinned to one instruction-set level on both sides (bench/levels.py: LOOM_ISA,
ONEDNN_MAX_CPU_ISA, OPENBLAS_CORETYPE for loom; ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS
for PyTorch), checked by what each reports it used (loom_isa_active, torch.backends.cpu.
get_cpu_capability()); the levels' runs alternate, so they see the same load. At avx2,
flash-avx2 (= flash there) and flash-blas (AVX-512) are left out.
Threads: all cores on both sides (torch.set_num_threads; omp_set_num_threads for loom).
Each variant runs --repeat times (in rotating order), each run W warm-up + N measured
iterations; the table shows the median over the runs of each run's median, tokens/s = B*T /
time, the ratio to PyTorch's best, the CPU time of the process per iteration (all its
threads; less sensitive than wall time to other work on a shared machine, though spinning
OpenMP threads count too) and its ratio, the process's peak RSS growth during the runs (measured)
(sampled; inputs and outputs allocated before, so it is the attention's own memory: loom's
buffers, torch's autograd tensors) and the attention buffers loom allocates (computed: flash = lse + per-thread tile scratch,
sdpa-loom = probabilities + scratch). The load is recorded as bench_train.py does.

Usage:
  python3 bench/bench_attention.py                 # T = 4096 and 1024
  python3 bench/bench_attention.py --T 1024 --repeat 2
  python3 bench/bench_attention.py --one-thread    # also flash/sdpa-loom/torch on one thread
  python3 bench/bench_attention.py --write         # also update its section of bench/RESULTS.md
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
sys.path.insert(0, os.path.join(REPO, "bench"))

SECTION = "## Attention: flash vs PyTorch SDPA"
B, H, KVH, D = 1, 4, 4, 64  # byte-tiny: d_model 256 / n_head 4 (read and checked in main)
VARIANTS = ["flash", "flash-window", "flash-blas", "flash-avx2", "flash-avx2-c", "flash-portable",
            "sdpa-loom", "torch"]
AVX512_ONLY = ("flash-blas", "flash-avx2")  # left out at the avx2 level
# left out above LONG_T: sdpa-loom's (B,H,T,T) buffers (8 GiB at T = 16384) and the slow
# reference paths (minutes per run there)
LONG_T, SHORT_ONLY = 8192, ("sdpa-loom", "flash-portable", "flash-avx2-c", "flash-blas")
WINDOW = [512]  # --window (set in main; read by make_variants in the child processes too)
STEPS = {16384: (1, 3), 4096: (2, 7), 1024: (3, 15)}


def current_rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Peak of the process's current RSS while running (sampled every millisecond in a thread:
    the kernels release the GIL), so library start-up peaks before the runs do not count."""

    def __init__(self):
        import threading
        self.peak = current_rss()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, current_rss())
            time.sleep(0.001)

    def result(self):
        self.stop.set()
        self.thread.join()
        return max(self.peak, current_rss())


def flash_bytes(T, threads):
    """lse + per-thread scratch of flash_attention_* (sizes as in flash_attention.c)"""
    fwd = 3 * 64 * D + 64 * 64 + 3 * 64
    # + the fused path's per-task (H/KVH, T) row sums and packed scaled Q and dO, (H/KVH, T, D) each
    bwd = 12 * 64 * D + 2 * 64 * 64 + 64 + (H // KVH) * T * (1 + 2 * D)  # 2 key tiles per sweep
    return 4 * (B * H * T + max(fwd, bwd) * threads)


def sdpa_loom_bytes(T):
    return 4 * 2 * B * H * T * T  # att (B,H,T,T) + backward scratch (B,H,T,T)


def make_variants(names, T, threads, mark=lambda: None):
    """{name: (prep, step, fwd)} for each variant named (torch gives torch-eager and
    torch-compiled); prep runs before each timed step, untimed. mark() is called when the
    inputs, outputs and gradients exist, before anything the attention itself allocates."""
    import numpy as np
    rng = np.random.default_rng(0)
    R = (H + 2 * KVH) * D
    x = rng.standard_normal((B, T, R)).astype(np.float32)
    dout = rng.standard_normal((B, T, H * D)).astype(np.float32)
    made = {}
    if "torch" in names:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(threads)
        xt = torch.from_numpy(x)
        q0 = xt[..., :H * D].reshape(B, T, H, D).transpose(1, 2).contiguous()
        k0 = xt[..., H * D:(H + KVH) * D].reshape(B, T, KVH, D).transpose(1, 2).contiguous()
        v0 = xt[..., (H + KVH) * D:].reshape(B, T, KVH, D).transpose(1, 2).contiguous()
        do = torch.from_numpy(dout).reshape(B, T, H, D).transpose(1, 2).contiguous()
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        for t in (q, k, v):
            t.grad = torch.zeros_like(t)  # the gradients' own memory, as loom's dx
        mark()

        def sdpa(a, b, c):
            return F.scaled_dot_product_attention(a, b, c, is_causal=True)

        def prep():
            q.grad = k.grad = v.grad = None

        for mode, fn in (("eager", sdpa), ("compiled", torch.compile(sdpa))):
            def step(fn=fn):
                fn(q, k, v).backward(do)
            made[f"torch-{mode}"] = (prep, step, None)
    loom_names = [n for n in names if n != "torch"]
    if loom_names:
        from loomlib import (ATTN_ISA_AUTO, ATTN_ISA_AVX2, ATTN_ISA_AVX2_C, ATTN_ISA_AVX512_BLAS,
                             ATTN_ISA_PORTABLE, AttnMask, lib)
        L = lib()
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(threads)
        ptr = lambda a: a.ctypes.data  # noqa: E731
        for name in loom_names:
            out = np.zeros((B, T, H * D), np.float32)
            dx = np.zeros_like(x)
            mark()
            if name == "sdpa-loom":
                att = np.zeros((B, H, T, T), np.float32)
                scratch = np.zeros((B, H, T, T), np.float32)

                def fwd(out=out, att=att):
                    L.attention_forward(ptr(out), ptr(att), ptr(x), B, T, H, KVH, D, None)

                def bwd(dx=dx, scratch=scratch, att=att):
                    L.attention_backward(ptr(dx), ptr(scratch), ptr(dout), ptr(x), ptr(att),
                                         B, T, H, KVH, D, None)
            else:
                isa = {"flash": ATTN_ISA_AUTO, "flash-window": ATTN_ISA_AUTO,
                       "flash-blas": ATTN_ISA_AVX512_BLAS, "flash-avx2": ATTN_ISA_AVX2,
                       "flash-avx2-c": ATTN_ISA_AVX2_C, "flash-portable": ATTN_ISA_PORTABLE}[name]
                lse = np.zeros((B, H, T), np.float32)
                dims = L.flash_attention_dims_qkv(B, T, H, KVH, D)
                mk = AttnMask(1, 0, 0, None, None, 0, 0,
                              WINDOW[0] if name == "flash-window" else 0, 0.0, 0.0)
                qp, kp, vp = ptr(x), ptr(x) + 4 * H * D, ptr(x) + 4 * (H + KVH) * D
                dqp, dkp, dvp = ptr(dx), ptr(dx) + 4 * H * D, ptr(dx) + 4 * (H + KVH) * D

                def fwd(out=out, lse=lse, dims=dims, mk=mk, isa=isa, x=x):  # x: keeps it alive
                    rc = L.flash_attention_forward(ptr(out), ptr(lse), qp, kp, vp,
                                                   ctypes.byref(dims), ctypes.byref(mk), isa)
                    assert rc == 0, f"flash_attention_forward: {rc}"

                def bwd(out=out, lse=lse, dims=dims, mk=mk, isa=isa, dqp=dqp, dkp=dkp, dvp=dvp):
                    rc = L.flash_attention_backward(dqp, dkp, dvp, ptr(dout), qp, kp, vp, ptr(out),
                                                    ptr(lse), ctypes.byref(dims), ctypes.byref(mk),
                                                    isa)
                    assert rc == 0, f"flash_attention_backward: {rc}"

            def step(fwd=fwd, bwd=bwd):
                fwd()
                bwd()
            made[name] = (lambda dx=dx: dx.fill(0.0), step, fwd)  # backward accumulates
    return made


def timed(prep, fn):
    prep()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def child(variant, T, warmup, measured, threads):
    """One variant alone in this process: its peak RSS growth (and its own timing)."""
    sampler = RssSampler()
    base = []
    made = make_variants([variant], T, threads, mark=lambda: base.append(current_rss()))
    rss0 = base[-1]
    res = {}
    for name, (prep, step, _) in made.items():
        for _ in range(warmup + (2 if name == "torch-compiled" else 0)):
            timed(prep, step)
        res[name] = statistics.median(timed(prep, step)[0] for _ in range(measured))
    res["rss_growth"] = max(0, sampler.result() - rss0)
    res["_used"] = used_levels()
    print(json.dumps(res))


def interleaved(variants, T, warmup, measured, threads):
    """Every variant in one process, one timed fwd+bwd of each in turn (rotating order, a
    pause between, so OpenMP pools idle down): all see the same load. Medians per variant."""
    made = make_variants(variants, T, threads)
    names = list(made)
    for name in names:
        for _ in range(warmup + (2 if name == "torch-compiled" else 0)):
            timed(*made[name][:2])
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    fwd = {n: [] for n in names}
    for i in range(measured):
        for name in names[i % len(names):] + names[:i % len(names)]:
            prep, step, f = made[name]
            w, c = timed(prep, step)
            wall[name].append(w)
            cpu[name].append(c)
            time.sleep(0.05)
            if f is not None:
                fwd[name].append(timed(prep, f)[0])
                time.sleep(0.05)
    res = {n: {"s": statistics.median(wall[n]), "cpu_s": statistics.median(cpu[n]),
               "fwd_s": statistics.median(fwd[n]) if fwd[n] else None} for n in names}
    res["_used"] = used_levels()
    print(json.dumps(res))


def used_levels():
    """the levels loom and PyTorch report in this process (bench/levels.py)"""
    from levels import used
    L = None
    if "loomlib" in sys.modules:
        L = sys.modules["loomlib"].lib()
    return used(L)


def run_child(variant, T, warmup, measured, threads, level=None):
    """the child's JSON; with `level`, both sides pinned to it and the levels they report
    checked (bench/levels.py)"""
    from levels import check_used, level_env
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(level_env(level) if level else {}))
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant,
                        "--T", str(T), "--warmup", str(warmup), "--measured", str(measured),
                        "--threads", str(threads), "--window", str(WINDOW[0])],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_attention: {variant} T={T} failed:\n{p.stderr[-2000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    rep = res.pop("_used")
    if level:
        err = check_used(level, rep, f"bench_attention: {variant} T={T}")
        if err:
            sys.exit(err)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, action="append", help="sequence lengths (default 4096, 1024)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--measured", type=int)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--one-thread", action="store_true",
                    help="also time flash, sdpa-loom and torch on one thread at the first T "
                         "(CPU contention from other work hurts multi-threaded runs most)")
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    ap.add_argument("--window", type=int, default=512,
                    help="the flash-window variant's sliding window (default 512)")
    ap.add_argument("--levels", help="instruction-set levels to pin both sides to, e.g. "
                    "avx2 or avx512,avx2 (default: each of avx512, avx2 this CPU runs; "
                    "'none' for no pinning)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    WINDOW[0] = args.window
    if args.child:
        if args.child.startswith("interleaved:"):
            interleaved(args.child.split(":", 1)[1].split(","), args.T[0], args.warmup,
                        args.measured, args.threads)
        else:
            child(args.child, args.T[0], args.warmup, args.measured, args.threads)
        return

    import yaml
    from bench_train import OtherWork, cpu_model, loadavg, log
    with open(os.path.join(REPO, "configs", "byte-tiny.yaml")) as f:
        m = yaml.safe_load(f)["model"]
    assert m["d_model"] // m["n_head"] == D and m["n_head"] == H, "byte-tiny's shape changed"
    Ts = args.T or [4096, 1024]
    variants = args.variants.split(",")
    from levels import machine_levels
    loom_bin = os.environ.get("LOOM_BIN") or os.path.join(REPO, "build", "loom")
    levels = ([None] if args.levels == "none" else
              args.levels.split(",") if args.levels else machine_levels(loom_bin) or [None])

    def at(level, names, T):
        return [v for v in names if not (level == "avx2" and v in AVX512_ONLY)
                and not (T > LONG_T and v in SHORT_ONLY)]

    load_before = loadavg()
    other = OtherWork()
    rss, runs = {}, {}
    for T in Ts:
        w, n = STEPS.get(T, (2, 10))
        w = args.warmup if args.warmup is not None else w
        n = args.measured if args.measured is not None else n
        for lv in levels:
            for var in at(lv, variants, T):  # memory: each variant alone in a process
                log(f"T={T} level {lv}: {var} alone (peak RSS)")
                rss[(lv, T, var)] = run_child(var, T, 1, 1, args.threads, lv)["rss_growth"]
        for r in range(args.repeat):  # time: all variants interleaved in one process per level
            for lv in levels:  # the levels alternate: both see the same load
                log(f"T={T} level {lv} run {r + 1}/{args.repeat}: {','.join(at(lv, variants, T))} "
                    f"interleaved ({w} warm-up, {n} measured each)")
                runs.setdefault((lv, T), []).append(
                    run_child("interleaved:" + ",".join(at(lv, variants, T)), T, w, n,
                              args.threads, lv))
    one = {}
    if args.one_thread:
        T1 = Ts[0]
        w, n = STEPS.get(T1, (2, 10))
        v1 = [v for v in ("flash", "sdpa-loom", "torch") if v in variants]
        for r in range(args.repeat):
            for lv in levels:
                log(f"T={T1} level {lv} one thread, run {r + 1}/{args.repeat}: "
                    f"{','.join(v1)} interleaved")
                one.setdefault(lv, []).append(
                    run_child("interleaved:" + ",".join(v1), T1, w, n, 1, lv))
    load_after = loadavg()
    other_s, avail_s = other.result()
    quiet = avail_s > 0 and other_s / avail_s < 0.05

    lines = [f"| level | T | variant | fwd+bwd ms | tokens/s | vs PyTorch best | CPU ms | "
             f"vs PyTorch (CPU) | peak RSS growth | attention buffers |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for T in Ts:
        for lv in levels:
            rl = runs[(lv, T)]
            names = list(rl[0])
            med = {nm: statistics.median(r[nm]["s"] for r in rl) for nm in names}
            cmed = {nm: statistics.median(r[nm]["cpu_s"] for r in rl) for nm in names}
            torch_names = [nm for nm in names if nm.startswith("torch-")]
            best = min(torch_names, key=med.get) if torch_names else None
            ref, cref = (med[best], cmed[best]) if best else (None, None)
            for nm in names:
                var = "torch" if nm.startswith("torch-") else nm
                bufs = (f"{flash_bytes(T, args.threads) / 2**20:.2f} MiB" if nm.startswith("flash")
                        else f"{sdpa_loom_bytes(T) / 2**20:.0f} MiB" if nm == "sdpa-loom" else "n/a")
                label = (f"torch SDPA ({nm[6:]}{', best' if nm == best else ''})" if var == "torch"
                         else f"flash-window (W = {WINDOW[0]})" if nm == "flash-window" else nm)
                ratio = f"{ref / med[nm]:.2f}x" if ref else "n/a"
                cratio = f"{cref / cmed[nm]:.2f}x" if cref else "n/a"
                lines.append(f"| {lv or 'own'} | {T} | {label} | {1e3 * med[nm]:.1f} | "
                             f"{B * T / med[nm]:.0f} | {ratio} | {1e3 * cmed[nm]:.1f} | {cratio} | "
                             f"{rss[(lv, T, var)] / 2**20:.1f} MiB | {bufs} |")
                desc = ", ".join(f"{1e3 * r[nm]['s']:.1f}" for r in rl)
                f = [r[nm]["fwd_s"] for r in rl if r[nm]["fwd_s"] is not None]
                if f:
                    desc += f" (forward alone, median {1e3 * statistics.median(f):.1f})"
                notes.append(f"level {lv or 'own'} T={T} {nm}: per-run medians (ms) {desc}")
    if one:
        lines += ["", f"One thread per side (`--one-thread`), T={Ts[0]}:", "",
                  "| level | T | variant | fwd+bwd ms | tokens/s | vs PyTorch best | CPU ms | "
                  "vs PyTorch (CPU) |", "|---|---|---|---|---|---|---|---|"]
        for lv in levels:
            rl = one[lv]
            names = list(rl[0])
            med = {nm: statistics.median(r[nm]["s"] for r in rl) for nm in names}
            cmed = {nm: statistics.median(r[nm]["cpu_s"] for r in rl) for nm in names}
            tn = [nm for nm in names if nm.startswith("torch-")]
            best = min(tn, key=med.get) if tn else None
            for nm in names:
                label = (f"torch SDPA ({nm[6:]}{', best' if nm == best else ''})"
                         if nm.startswith("torch-") else nm)
                ratio = f"{med[best] / med[nm]:.2f}x" if best else "n/a"
                cratio = f"{cmed[best] / cmed[nm]:.2f}x" if best else "n/a"
                lines.append(f"| {lv or 'own'} | {Ts[0]} | {label} | {1e3 * med[nm]:.1f} | "
                             f"{B * Ts[0] / med[nm]:.0f} | {ratio} | {1e3 * cmed[nm]:.1f} | "
                             f"{cratio} |")
                notes.append(f"level {lv or 'own'} T={Ts[0]} one thread {nm}: per-run medians "
                             "(ms) " + ", ".join(f"{1e3 * r[nm]['s']:.1f}" for r in rl))
    notes.append(f"load average before {load_before}, after {load_after}; other processes used "
                 f"{other_s:.0f} of the {avail_s:.0f} CPU-seconds available while it ran "
                 f"({100 * other_s / max(avail_s, 1e-9):.0f}%): "
                 + ("a quiet machine" if quiet else "NOT a quiet machine (shared with other "
                    "work): every variant is slowed and noisy; compare them only with each other"))
    table = "\n".join(lines)
    print(table)
    for line in notes:
        print(line)
    if args.write:
        import torch
        from results_md import replace_section
        md = [SECTION, "",
              f"Generated by `python3 bench/bench_attention.py --repeat {args.repeat}"
              f"{' --one-thread' if args.one_thread else ''}"
              f"{' --T ' + ' --T '.join(map(str, Ts)) if args.T else ''}"
              f"{' --levels ' + args.levels if args.levels else ''} --write` on "
              f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
              + (" on a quiet machine." if quiet else ", on a machine shared with other work "
                 "(see the load below): not quiet-machine figures."), "",
              f"- machine: {cpu_model()}, {os.cpu_count()} cores, {args.threads} threads per side;"
              f" PyTorch {torch.__version__}; levels "
              + (", ".join(levels) if levels != [None] else "not pinned (each side's own)")
              + " (bench/levels.py: both sides pinned, and what each reported it used checked)",
              f"- shape: byte-tiny attention, B={B}, H=KVH={H}, D={D}, causal, float32, "
              "forward + backward; targets (issues 8 and 27): flash >= 1.25x PyTorch SDPA "
              "tokens/s at T=4096 and >= 1.0x at T=16384, at each level", "", table, ""] + [f"- {line}" for line in notes]
        replace_section("\n".join(md), SECTION, os.path.join(REPO, "bench", "RESULTS.md"))
        log("wrote bench/RESULTS.md")


if __name__ == "__main__":
    main()
