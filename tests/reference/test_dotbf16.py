"""bf16 compute's kernels (src/kernels/matmul_dotbf16.c) against PyTorch doing the same thing.

bf16_round_rows (into the kernel's activation layout, read back here) must give torch's
.to(bfloat16) bit for bit (random values over a wide exponent range, ties, +-0, infinities,
NaN, subnormals, values near the largest bf16). matmul_dotbf16_forward (bf16 activations x
bf16 weights packed by dotbf16_pack from fp32, fp32 accumulation) must equal torch's fp32
matmul of the same bf16 values widened to fp32 (plus the bias) to
    |loom - torch| <= TOL * (sum_i |x_i w_i| + |bias|),   TOL = 1e-6 (observed ~1e-7)
(fp32 summation order is all that differs: both sum exact products in fp32), on shapes with IC
not a multiple of 2 or 32, odd OC, 1..17 rows and prefill-sized row counts, at every
instruction-set level this CPU has (the portable code at x86-64 and avx2, VDPBF16PS at
avx512 when the CPU has avx512_bf16). As a check that the activations really are rounded, the
result on unrounded fp32 activations must differ by more than 100 x TOL from loom's."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import expect, finish, fptr, lib  # noqa: E402

TOL = 1e-6
ISA_BASE, ISA_AVX2, ISA_AVX512, ISA_NATIVE = 1, 3, 4, 0
L = lib()


def hptr(a):
    assert a.dtype == np.uint16 and a.flags["C_CONTIGUOUS"]
    return a.ctypes.data


def torch_bf16_bits(x):
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def widen(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def act_rows(h, N, IC):
    """the (N, IC) rows back from the activation layout (16-row groups of pairs)"""
    P = (IC + 1) // 2
    G = (N + 15) // 16
    a = h.reshape(G, P, 16, 2).transpose(0, 2, 1, 3).reshape(G * 16, 2 * P)
    return a[:N, :IC]


def round_rows(x):
    N, IC = x.shape
    h = np.empty(L.dotbf16_act_elems(N, IC), np.uint16)
    L.bf16_round_rows(hptr(h), fptr(np.ascontiguousarray(x)), N, IC)
    return h


def test_round(g):
    x = (g.standard_normal(5000) * np.exp2(g.integers(-40, 40, 5000))).astype(np.float32)
    special = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0, -0.0, np.inf, -np.inf,
                        3.0e38, -3.3e38, 2**-130, -(2**-127) * 1.999, 2**-149, 3.3895e38],
                       np.float32)
    x[: len(special)] = special
    x = x.reshape(40, 125)
    got = act_rows(round_rows(x), 40, 125)
    want = torch_bf16_bits(x)
    expect("bf16_round_rows == torch .to(bfloat16), bit for bit", np.array_equal(got, want),
           f"{int((got != want).sum())} differ")
    nan = np.array([[np.nan, -np.nan] * 9], np.float32)
    hn = act_rows(round_rows(nan), 1, nan.size)
    expect("NaN stays NaN", bool(np.isnan(widen(hn)).all()))


def test_matmul(g, level_name):
    worst, shapes = 0.0, 0
    cases = [(n, ic, oc) for n in range(1, 18) for ic, oc in
             [(1, 3), (7, 5), (31, 13), (33, 1), (64, 9), (129, 7)][n % 6: n % 6 + 2]]
    cases += [(16, 768 + 5, 37), (64, 300, 33), (300, 257, 19), (70, 3001, 11)]
    for N, IC, OC in cases:
        x = g.standard_normal((N, IC)).astype(np.float32)
        w = (g.standard_normal((OC, IC)) * 0.3).astype(np.float32)
        bias = g.standard_normal(OC).astype(np.float32) if (N + IC) % 2 else None
        xb = round_rows(x)
        wb = np.empty(L.dotbf16_pack_elems(OC, IC), np.uint16)
        L.dotbf16_pack(hptr(wb), fptr(w), 0, OC, IC)
        out = np.empty((N, OC), np.float32)
        L.matmul_dotbf16_forward(fptr(out), hptr(xb), hptr(wb), fptr(bias), N, IC, OC)
        tx = torch.from_numpy(x).to(torch.bfloat16).float()
        tw = torch.from_numpy(w).to(torch.bfloat16).float()
        ref = tx @ tw.T
        if bias is not None:
            ref = ref + torch.from_numpy(bias)
        ref = ref.numpy()
        mag = (tx.abs().double() @ tw.abs().double().T).numpy()
        bmag = np.abs(bias) if bias is not None else 0.0
        err = np.abs(out.astype(np.float64) - ref) / (mag + bmag + 1e-30)
        worst = max(worst, float(err.max()))
        shapes += 1
        if N == 16 and IC == 773:  # the rounding of the activations is applied
            raw = torch.from_numpy(x) @ tw.T
            if bias is not None:
                raw = raw + torch.from_numpy(bias)
            d = np.abs(out - raw.numpy()) / mag
            expect(f"{level_name}: unrounded activations give a different product",
                   float(d.max()) > 100 * TOL, f"{float(d.max()):.2e}")
    print(f"  {level_name}: {shapes} shapes, worst |loom - torch| / sum|x w| = {worst:.2e}")
    expect(f"{level_name}: matmul_dotbf16_forward == torch fp32 matmul of bf16 values "
           f"to {TOL:.0e} x sum|x w|", worst <= TOL, f"{worst:.3e}")


def main():
    torch.set_num_threads(1)
    g = np.random.default_rng(7)
    best = L.loom_isa_detect()
    levels = [ISA_NATIVE] if best == ISA_NATIVE else \
        [lv for lv in (ISA_BASE, ISA_AVX2, ISA_AVX512) if lv <= best]
    test_round(g)
    for lv in levels:
        if lv != ISA_NATIVE:
            expect(f"set level {lv}", L.loom_isa_set(lv, None) == 0)
        name = f"{L.loom_isa_name(lv).decode()} ({'VDPBF16PS' if L.matmul_dotbf16_vdp() else 'portable'})"
        test_round(g)
        test_matmul(g, name)
    if best != ISA_NATIVE:
        L.loom_isa_set(best, None)
    sys.exit(finish())


if __name__ == "__main__":
    main()
