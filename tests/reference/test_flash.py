"""flash_attention_forward/backward (src/kernels/flash_attention.c) against PyTorch in float64
and against loom's materialized attention (attention_forward/backward, the "sdpa" path).

Every check runs on each inner-loop path: portable C (x86-64 baseline), AVX2 intrinsics,
AVX-512 intrinsics, and AVX-512 with the tile products through OpenBLAS (the AVX-512
ones are reported as not run, and the test fails, on a CPU without AVX-512 unless
LOOM_FLASH_NO_AVX512_OK=1). On a CPU with both, the AVX2 and AVX-512 paths must also give the
same bits (test_avx2_bits).
Errors are max |loom - ref| / max |ref| (rel_err). Tolerances: 1e-5 for outputs, lse and
gradients (fp32 kernels against a float64 reference; measured errors are ~1e-7..1e-6).

Covered: causal and not; GQA (H=4 with KVH=4, 2, 1); T not a multiple of the 64-row tile and
T=1; query/key position offsets (a query chunk against key chunks, merged by their lse, equals
the rows of the full causal attention, forward and backward: the ring-attention contract);
rows with no visible key (out 0, lse -inf, no gradient); document masks (equal to running each
document alone; lse equal to torch.logsumexp of the masked scores); fully masked tiles are
skipped, not computed then zeroed (NaN keys/values there leave the result finite); fused qkv
rows and separate Q, K, V; backward accumulates; bitwise identical results for 1, 2, 3 and 5
threads; invalid dims refused; sliding windows (key visible iff 0 <= qpos - kpos < W, as
transformers' sliding_window_overlay), soft-capped scores (cap * tanh(s / cap)) and a custom
scale, flash and loom's materialized attention, forward and backward, against PyTorch.
Prints each check; exits 1 if any fails.
"""
import ctypes
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import (ATTN_ISA_AUTO, ATTN_ISA_AVX2, ATTN_ISA_AVX512, ATTN_ISA_AVX512_BLAS,  # noqa: E402
                     ATTN_ISA_PORTABLE, AttnDims, AttnMask, f32, fptr, lib, rel_err)

torch.set_num_threads(2)
L = lib()
GOMP = ctypes.CDLL("libgomp.so.1")  # the OpenMP runtime libloom uses (not torch's own)
rng = np.random.default_rng(4321)
results = []
TOL = 1e-5

def check(name, got, ref, tol=TOL, floor=None):
    """rel_err; with `floor`, the error is relative to max(max |ref|, floor) (for references
    that are exactly 0, e.g. dq and dk at T = 1, where fp32 leaves rounding residue)"""
    err = rel_err(got, ref)
    if floor is not None:
        diff = np.max(np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)))
        err = float(diff) / max(float(np.max(np.abs(ref))), floor)
    ok = bool(np.isfinite(err) and err <= tol)
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name:64s} err {err:.3e}  tol {tol:.0e}")


def check_true(name, cond, detail=""):
    results.append(bool(cond))
    print(f"{'ok  ' if cond else 'FAIL'} {name:64s} {detail}")


def randn(*shape):
    return f32(rng.standard_normal(shape))


def dims_sep(B, Tq, Tk, H, KVH, D):
    """dims for separate contiguous q (B,Tq,H*D), k, v (B,Tk,KVH*D), out (B,Tq,H*D)"""
    return AttnDims(B, Tq, Tk, H, KVH, D, Tq * H * D, H * D, Tk * KVH * D, KVH * D,
                    Tk * KVH * D, KVH * D, Tq * H * D, H * D)


def make_mask(causal, q0=0, k0=0, qdoc=None, kdoc=None, window=0, scale=0.0, softcap=0.0):
    m = AttnMask(int(causal), q0, k0, None, None, 0, 0, window, scale, softcap)
    if qdoc is not None:
        m.q_doc, m.k_doc = qdoc.ctypes.data, kdoc.ctypes.data
        m.q_doc_bs, m.k_doc_bs = qdoc.shape[1], kdoc.shape[1]
    return m


def runs(isa):
    """whether this CPU runs `isa` (a tiny call: -2 means it cannot)"""
    x = np.zeros((1, 1, 1, 16), np.float32)
    d, mk = dims_sep(1, 1, 1, 1, 1, 16), make_mask(False)
    o, lse = np.zeros_like(x), np.zeros((1, 1, 1), np.float32)
    return L.flash_attention_forward(fptr(o), fptr(lse), fptr(x), fptr(x), fptr(x),
                                     ctypes.byref(d), ctypes.byref(mk), isa) == 0


ISAS = [("portable", ATTN_ISA_PORTABLE)]
if runs(ATTN_ISA_AVX2):
    ISAS.append(("avx2", ATTN_ISA_AVX2))  # AVX2 + FMA intrinsics (8 lanes)
if L.flash_attention_have_avx512():
    ISAS.append(("avx512", ATTN_ISA_AVX512))
    ISAS.append(("avx512+blas", ATTN_ISA_AVX512_BLAS))  # tile products through OpenBLAS


def flash(q, k, v, isa, causal, q0=0, k0=0, qdoc=None, kdoc=None, dout=None, grads=None):
    """q (B,Tq,H,D), k/v (B,Tk,KVH,D) float32. Returns out, lse and, when dout is given,
    dq, dk, dv accumulated onto `grads` (or zeros)."""
    B, Tq, H, D = q.shape
    Tk, KVH = k.shape[1], k.shape[2]
    d = dims_sep(B, Tq, Tk, H, KVH, D)
    mk = make_mask(causal, q0, k0, qdoc, kdoc)
    out = np.full((B, Tq, H, D), 7.0, np.float32)  # overwritten
    lse = np.full((B, H, Tq), 7.0, np.float32)
    rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                   ctypes.byref(d), ctypes.byref(mk), isa)
    assert rc == 0, f"flash_attention_forward returned {rc}"
    if dout is None:
        return out, lse
    dq, dk, dv = ((g.copy() for g in grads) if grads is not None else
                  (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)))
    rc = L.flash_attention_backward(fptr(dq), fptr(dk), fptr(dv), fptr(dout), fptr(q), fptr(k),
                                    fptr(v), fptr(out), fptr(lse), ctypes.byref(d),
                                    ctypes.byref(mk), isa)
    assert rc == 0, f"flash_attention_backward returned {rc}"
    return out, lse, dq, dk, dv


def ref_attn(q, k, v, causal, q0=0, k0=0, qdoc=None, kdoc=None, dout=None):
    """float64 reference through explicit masked scores: out (B,Tq,H,D), lse (B,H,Tq) and the
    gradients for dout; rows with no visible key give out 0 and lse -inf."""
    B, Tq, H, D = q.shape
    Tk, KVH = k.shape[1], k.shape[2]
    qt = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    kt = torch.tensor(k, dtype=torch.float64, requires_grad=True)
    vt = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    G = H // KVH
    qh = qt.permute(0, 2, 1, 3)
    kh = kt.permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    vh = vt.permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(D)
    vis = torch.ones(B, Tq, Tk, dtype=torch.bool)
    if causal:
        vis &= (k0 + torch.arange(Tk))[None, None, :] <= (q0 + torch.arange(Tq))[None, :, None]
    if qdoc is not None:
        vis &= torch.tensor(qdoc)[:, :, None] == torch.tensor(kdoc)[:, None, :]
    vis = vis[:, None]
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1)
    empty = ~vis.any(-1, keepdim=True)
    p = torch.where(empty, 0.0, torch.softmax(torch.where(empty, 0.0, s), -1))
    out = (p @ vh).permute(0, 2, 1, 3)
    res = [out.detach().numpy(), lse.detach().numpy()]
    if dout is not None:
        out.backward(torch.tensor(dout, dtype=torch.float64))
        res += [qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()]
    return res


def sdpa(q, k, v, causal, dout):
    """torch.nn.functional.scaled_dot_product_attention in float64 (GQA by repeating k, v)."""
    G = q.shape[2] // k.shape[2]
    qt = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    kt = torch.tensor(k, dtype=torch.float64, requires_grad=True)
    vt = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    o = F.scaled_dot_product_attention(
        qt.transpose(1, 2), kt.transpose(1, 2).repeat_interleave(G, 1),
        vt.transpose(1, 2).repeat_interleave(G, 1), is_causal=causal).transpose(1, 2)
    o.backward(torch.tensor(dout, dtype=torch.float64))
    return o.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


def qkv(B, Tq, Tk, H, KVH, D):
    return randn(B, Tq, H, D), randn(B, Tk, KVH, D), randn(B, Tk, KVH, D), randn(B, Tq, H, D)


# ---- against torch SDPA: causal and not, GQA, T not a multiple of the tile, T = 1 -----------
def test_sdpa(iname, isa):
    for (B, T, H, KVH, D) in [(2, 150, 4, 4, 64), (1, 130, 4, 2, 32), (2, 77, 4, 1, 16),
                              (1, 1, 4, 2, 64), (1, 64, 2, 2, 40)]:
        for causal in (True, False):
            q, k, v, do = qkv(B, T, T, H, KVH, D)
            g0 = (randn(*q.shape), randn(*k.shape), randn(*v.shape))
            out, lse, dq, dk, dv = flash(q, k, v, isa, causal, dout=do, grads=g0)
            ro, rdq, rdk, rdv = sdpa(q, k, v, causal, do)
            _, rlse = ref_attn(q, k, v, causal)
            tag = f"{iname} B{B} T{T} H{H} KVH{KVH} D{D} {'causal' if causal else 'full'}"
            check(f"sdpa out     {tag}", out, ro)
            check(f"logsumexp    {tag}", lse, rlse)
            # at T = 1 the exact dq and dk are 0 (one key: softmax is constant): compare
            # against the scale of the inputs (|q|, |k| ~ 1)
            floor = 1.0 if T == 1 else None
            check(f"sdpa dq (+=) {tag}", dq - g0[0], rdq, floor=floor)
            check(f"sdpa dk (+=) {tag}", dk - g0[1], rdk, floor=floor)
            check(f"sdpa dv (+=) {tag}", dv - g0[2], rdv)


# ---- against loom's materialized attention on fused qkv rows --------------------------------
def test_materialized(iname, isa):
    for (B, T, H, KVH, D) in [(2, 100, 4, 2, 32), (1, 129, 4, 4, 64)]:
        R = (H + 2 * KVH) * D
        x = randn(B, T, R)
        do = randn(B, T, H * D)
        out_m = np.empty((B, T, H * D), np.float32)
        att = np.empty((B, H, T, T), np.float32)
        L.attention_forward(fptr(out_m), fptr(att), fptr(x), B, T, H, KVH, D, None)
        g0 = randn(B, T, R)
        dx_m = g0.copy()
        scratch = np.empty((B, H, T, T), np.float32)
        L.attention_backward(fptr(dx_m), fptr(scratch), fptr(do), fptr(x), fptr(att), B, T, H, KVH, D, None)

        d = L.flash_attention_dims_qkv(B, T, H, KVH, D)
        mk = make_mask(True)
        out = np.empty((B, T, H * D), np.float32)
        lse = np.empty((B, H, T), np.float32)
        base = x.ctypes.data
        qp, kp, vp = base, base + 4 * H * D, base + 4 * (H + KVH) * D
        rc = L.flash_attention_forward(fptr(out), fptr(lse), qp, kp, vp, ctypes.byref(d),
                                       ctypes.byref(mk), isa)
        dx = g0.copy()
        db = dx.ctypes.data
        rc |= L.flash_attention_backward(db, db + 4 * H * D, db + 4 * (H + KVH) * D, fptr(do),
                                         qp, kp, vp, fptr(out), fptr(lse), ctypes.byref(d),
                                         ctypes.byref(mk), isa)
        tag = f"{iname} B{B} T{T} H{H} KVH{KVH} D{D}"
        check_true(f"fused qkv calls return 0 {tag}", rc == 0, f"rc {rc}")
        check(f"vs materialized out  {tag}", out, out_m)
        check(f"vs materialized dqkv {tag}", dx - g0, dx_m - g0)


# ---- position offsets: query chunks against key chunks, merged by lse ------------------------
def test_offsets(iname, isa):
    B, T, H, KVH, D = 1, 200, 4, 2, 32
    q, k, v, do = qkv(B, T, T, H, KVH, D)
    ro, rlse, rdq, rdk, rdv = ref_attn(q, k, v, True, dout=None) + [None] * 3
    a, b = 80, 150  # query chunk [80, 150)
    do_c = np.zeros_like(do)
    do_c[:, a:b] = do[:, a:b]
    _, _, rdq, rdk, rdv = ref_attn(q, k, v, True, dout=do_c)
    qc, doc_ = f32(q[:, a:b]), f32(do[:, a:b])
    tag = f"{iname} q[{a},{b}) H{H} KVH{KVH}"
    # one call with every visible key: exactly the full attention's rows
    o, l = flash(qc, f32(k[:, :b]), f32(v[:, :b]), isa, True, q0=a, k0=0)
    check(f"chunk q vs keys [0,{b}) = full rows out {tag}", o, ro[:, a:b])
    check(f"chunk q vs keys [0,{b}) = full rows lse {tag}", l, rlse[..., a:b])
    # two key chunks [0,100) and [100,200), merged by their log-sum-exp (ring attention)
    parts = []
    for (k0, k1) in [(0, 100), (100, 200)]:
        parts.append(flash(qc, f32(k[:, k0:k1]), f32(v[:, k0:k1]), isa, True, q0=a, k0=k0))
    (o1, l1), (o2, l2) = parts
    lm = np.logaddexp(l1, l2)
    w1 = np.exp(l1 - lm).transpose(0, 2, 1)[..., None]
    w2 = np.exp(l2 - lm).transpose(0, 2, 1)[..., None]
    om = f32(w1 * o1 + w2 * o2)
    check(f"two key chunks merged by lse = full rows out {tag}", om, ro[:, a:b])
    check(f"two key chunks merged lse = full rows lse {tag}", lm, rlse[..., a:b])
    # backward per key chunk with the merged out/lse: dq sums, dk/dv per chunk
    lmf = f32(lm)
    dq = np.zeros_like(qc)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for (k0, k1) in [(0, 100), (100, 200)]:
        kc, vc = f32(k[:, k0:k1]), f32(v[:, k0:k1])
        d = dims_sep(B, b - a, k1 - k0, H, KVH, D)
        mk = make_mask(True, a, k0)
        dkc, dvc = np.zeros_like(kc), np.zeros_like(vc)
        rc = L.flash_attention_backward(fptr(dq), fptr(dkc), fptr(dvc), fptr(doc_), fptr(qc),
                                        fptr(kc), fptr(vc), fptr(om), fptr(lmf), ctypes.byref(d),
                                        ctypes.byref(mk), isa)
        assert rc == 0
        dk[:, k0:k1], dv[:, k0:k1] = dkc, dvc
    check(f"chunked backward dq {tag}", dq, rdq[:, a:b])
    check(f"chunked backward dk {tag}", dk, rdk)
    check(f"chunked backward dv {tag}", dv, rdv)
    # a query chunk before every key of its key chunk: nothing visible
    o, l, gq, gk, gv = flash(f32(q[:, :64]), f32(k[:, 100:]), f32(v[:, 100:]), isa, True,
                             q0=0, k0=100, dout=f32(do[:, :64]))
    check_true(f"no visible key: out 0, lse -inf, no gradient {iname}",
               np.all(o == 0) and np.all(l == -np.inf) and not gq.any() and not gk.any()
               and not gv.any())


# ---- document masks ---------------------------------------------------------------------------
def test_documents(iname, isa):
    B, T, H, KVH, D = 2, 150, 4, 2, 32
    docs = np.array([[0] * 50 + [1] * 30 + [2] * 70, [3] * 100 + [4] * 50], np.int32)
    q, k, v, do = qkv(B, T, T, H, KVH, D)
    for causal in (True, False):
        tag = f"{iname} {'causal' if causal else 'full'}"
        out, lse, dq, dk, dv = flash(q, k, v, isa, causal, qdoc=docs, kdoc=docs, dout=do)
        ro, rlse, rdq, rdk, rdv = ref_attn(q, k, v, causal, qdoc=docs, kdoc=docs, dout=do)
        check(f"documents out vs masked reference {tag}", out, ro)
        check(f"documents lse = logsumexp(masked scores) {tag}", lse, rlse)
        check(f"documents dq vs masked reference {tag}", dq, rdq)
        check(f"documents dk vs masked reference {tag}", dk, rdk)
        check(f"documents dv vs masked reference {tag}", dv, rdv)
        # each document alone
        so, sl = np.zeros_like(out), np.zeros_like(lse)
        sdq, sdk, sdv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        for bi in range(B):
            for doc in np.unique(docs[bi]):
                idx = np.nonzero(docs[bi] == doc)[0]
                s0, s1 = idx[0], idx[-1] + 1
                r = flash(f32(q[bi:bi + 1, s0:s1]), f32(k[bi:bi + 1, s0:s1]),
                          f32(v[bi:bi + 1, s0:s1]), isa, causal, dout=f32(do[bi:bi + 1, s0:s1]))
                so[bi, s0:s1], sl[bi, :, s0:s1] = r[0][0], r[1][0]
                sdq[bi, s0:s1], sdk[bi, s0:s1], sdv[bi, s0:s1] = r[2][0], r[3][0], r[4][0]
        check(f"documents = each document alone: out {tag}", out, so)
        check(f"documents = each document alone: lse {tag}", lse, sl)
        check(f"documents = each document alone: dq {tag}", dq, sdq)
        check(f"documents = each document alone: dk {tag}", dk, sdk)
        check(f"documents = each document alone: dv {tag}", dv, sdv)


# ---- fully masked tiles are skipped (NaN there would otherwise reach the result) ----------------
def test_skip(iname, isa):
    B, H, KVH, D = 1, 4, 2, 32
    q, k, v, do = qkv(B, 64, 256, H, KVH, D)
    k[:, 64:], v[:, 64:] = np.nan, np.nan  # key tiles 1..3: after every query position
    out, lse, dq, dk, dv = flash(q, k, v, isa, True, dout=do)
    ro, rlse, rdq, rdk, rdv = ref_attn(q, f32(k[:, :64]), f32(v[:, :64]), True, dout=do)
    check(f"causal: NaN keys in skipped tiles, out {iname}", out, ro)
    check(f"causal: NaN keys in skipped tiles, dq {iname}", dq, rdq)
    check_true(f"causal: skipped key tiles get no dk/dv, finite elsewhere {iname}",
               not dk[:, 64:].any() and not dv[:, 64:].any()
               and np.allclose(dk[:, :64], rdk, atol=1e-4) and np.allclose(dv[:, :64], rdv, atol=1e-4))
    docs_q = np.zeros((B, 64), np.int32)
    docs_k = np.array([[0] * 64 + [1] * 192], np.int32)
    out, lse = flash(q, k, v, isa, False, qdoc=docs_q, kdoc=docs_k)
    ro, _ = ref_attn(q, f32(k[:, :64]), f32(v[:, :64]), False)
    check(f"documents: NaN keys in skipped tiles, out {iname}", out, ro)


# ---- determinism over thread counts -----------------------------------------------------------
def test_threads(iname, isa):
    # B*KVH = 4 tasks per kv head: 1 and 2 threads take the fused backward, 3 and 5 the two
    # passes; every result must be the same bits
    B, T, H, KVH, D = 2, 300, 4, 2, 64
    q, k, v, do = qkv(B, T, T, H, KVH, D)
    docs = np.array([[0] * 120 + [1] * 180, [0] * 300], np.int32)
    runs = []
    for n in (1, 2, 3, 5):
        GOMP.omp_set_num_threads(n)
        runs.append(flash(q, k, v, isa, True, qdoc=docs, kdoc=docs, dout=do))
    GOMP.omp_set_num_threads(2)
    same = all(np.array_equal(a, b, equal_nan=True) for r in runs[1:] for a, b in zip(runs[0], r))
    check_true(f"bitwise identical out/lse/dq/dk/dv for 1,2,3,5 threads {iname}", same)


def test_auto_follows_level():
    """ATTN_ISA_AUTO runs the tile operations of the kernels' agreed instruction-set level
    (loom_isa_active, docs/build.md): AVX-512 intrinsics at level avx512, the C compiled for
    AVX2 at avx2, the baseline C at x86-64."""
    best = L.loom_isa_detect()
    if best == 0:  # NATIVE=1 build: one level, AUTO follows the CPU
        return
    B, T, H, KVH, D = 1, 80, 2, 1, 32
    q, k, v = randn(B, T, H, D), randn(B, T, KVH, D), randn(B, T, KVH, D)
    dout = randn(B, T, H, D)
    cases = [(1, "x86-64", ATTN_ISA_PORTABLE, "portable")]
    if best >= 3:
        cases.append((3, "avx2", ATTN_ISA_AVX2, "avx2"))
    if best >= 4:
        cases.append((4, "avx512", ATTN_ISA_AVX512, "avx512"))
    for level, lname, want, wname in cases:
        assert L.loom_isa_set(level, None) == 0
        auto = flash(q, k, v, ATTN_ISA_AUTO, True, dout=dout)
        exp = flash(q, k, v, want, True, dout=dout)
        same = all(np.array_equal(a, b) for a, b in zip(auto, exp))
        check_true(f"AUTO at level {lname} runs the {wname} tile operations", same)
    if best >= 4:  # and the paths are other code (so the equalities above mean something)
        p = flash(q, k, v, ATTN_ISA_PORTABLE, True)
        a2 = flash(q, k, v, ATTN_ISA_AVX2, True)
        a = flash(q, k, v, ATTN_ISA_AVX512, True)
        # (the AVX2 and AVX-512 intrinsics agree bitwise: test_avx2_bits)
        check_true("baseline C tiles differ in bits from the AVX2 and AVX-512 ones",
                   not np.array_equal(p[0], a[0]) and not np.array_equal(p[0], a2[0]))
    L.loom_isa_set(best, None)


def test_avx2_bits():
    """The AVX2 level's tile operations are the AVX-512 ones at 8 lanes: the same FMA chains,
    exp and reductions, so the same bits (docs/kernels.md), forward and backward, both
    backward schedules (1 thread: fused, 3: two passes), every mask kind, head dims that
    are not a multiple of 8 or 16 (masked tails) and tiles cut short by T."""
    if not (runs(ATTN_ISA_AVX2) and L.flash_attention_have_avx512()):
        return
    cases = [  # B, T, H, KVH, D, causal, docs, window, scale, softcap
        (2, 150, 4, 2, 64, True, False, 0, 0.0, 0.0),
        (1, 133, 4, 1, 20, True, True, 0, 0.0, 0.0),
        (1, 140, 2, 2, 24, True, False, 45, 0.25, 3.0),
        (2, 77, 4, 4, 40, False, False, 0, 0.0, 0.0),
    ]
    for (B, T, H, KVH, D, causal, withdocs, W, sc, cap) in cases:
        q, k, v, do = qkv(B, T, T, H, KVH, D)
        docs = (np.repeat(np.arange(3, dtype=np.int32), (T + 2) // 3)[:T][None].repeat(B, 0)
                if withdocs else None)
        d = dims_sep(B, T, T, H, KVH, D)
        mk = make_mask(causal, qdoc=docs, kdoc=docs, window=W, scale=sc, softcap=cap)
        res = []
        for isa in (ATTN_ISA_AVX2, ATTN_ISA_AVX512):
            for nt in (1, 3):
                GOMP.omp_set_num_threads(nt)
                out, lse = np.empty_like(q), np.empty((B, H, T), np.float32)
                dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
                rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                               ctypes.byref(d), ctypes.byref(mk), isa)
                rc |= L.flash_attention_backward(fptr(dq), fptr(dk), fptr(dv), fptr(do),
                                                 fptr(q), fptr(k), fptr(v), fptr(out),
                                                 fptr(lse), ctypes.byref(d), ctypes.byref(mk),
                                                 isa)
                assert rc == 0, f"rc {rc}"
                res.append((out, lse, dq, dk, dv))
        GOMP.omp_set_num_threads(2)
        same = all(np.array_equal(a, b) for r in res[1:] for a, b in zip(res[0], r))
        check_true(f"avx2 = avx512 bitwise (1, 3 threads) B{B} T{T} H{H} KVH{KVH} D{D} "
                   f"causal {int(causal)} docs {int(withdocs)} W{W} cap {cap}", same)


# ---- sliding windows, soft-capping and a custom scale: flash and sdpa against PyTorch --------
def ref_window(q, k, v, dout, window, scale, cap):
    """float64: causal, keys with qpos - kpos < window (0: all), scores scale * q.k (0:
    1/sqrt(D)), soft-capped by cap (0: none); out, lse and the gradients"""
    B, T, H, D = q.shape
    G = H // k.shape[2]
    qt, kt, vt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    s = (qt.permute(0, 2, 1, 3) @ kt.permute(0, 2, 3, 1).repeat_interleave(G, dim=1))
    s = s * (scale if scale > 0 else 1.0 / math.sqrt(D))
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    back = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    vis = (back >= 0) & ((back < window) if window > 0 else True)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = (torch.softmax(s, dim=-1) @ vt.permute(0, 2, 1, 3).repeat_interleave(G, dim=1))
    o = o.permute(0, 2, 1, 3)
    o.backward(torch.tensor(dout, dtype=torch.float64))
    return (o.detach().numpy(), lse.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(),
            vt.grad.numpy())


def test_window_softcap(iname, isa):
    for (B, T, H, KVH, D, W, sc, cap) in [(2, 150, 4, 2, 32, 37, 0.0, 0.0),
                                          (1, 130, 4, 1, 16, 0, 0.3, 2.5),
                                          (1, 140, 4, 2, 24, 45, 0.25, 3.0)]:
        q, k, v, do = qkv(B, T, T, H, KVH, D)
        ro, rlse, rdq, rdk, rdv = ref_window(q, k, v, do, W, sc, cap)
        d = dims_sep(B, T, T, H, KVH, D)
        mk = make_mask(True, window=W, scale=sc, softcap=cap)
        out, lse = np.empty_like(q), np.empty((B, H, T), np.float32)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                       ctypes.byref(d), ctypes.byref(mk), isa)
        rc |= L.flash_attention_backward(fptr(dq), fptr(dk), fptr(dv), fptr(do), fptr(q),
                                         fptr(k), fptr(v), fptr(out), fptr(lse),
                                         ctypes.byref(d), ctypes.byref(mk), isa)
        tag = f"{iname} B{B} T{T} H{H} KVH{KVH} D{D} W{W} scale {sc} cap {cap}"
        check_true(f"window/softcap calls return 0 {tag}", rc == 0, f"rc {rc}")
        check(f"window flash out {tag}", out, ro)
        check(f"window flash lse {tag}", lse, rlse)
        check(f"window flash dq  {tag}", dq, rdq)
        check(f"window flash dk  {tag}", dk, rdk)
        check(f"window flash dv  {tag}", dv, rdv)
        # loom's materialized attention (model.attention: sdpa) on fused rows, the same mask
        x = np.concatenate([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], 2)
        x = np.ascontiguousarray(x)
        om = np.empty((B, T, H * D), np.float32)
        att = np.empty((B, H, T, T), np.float32)
        L.attention_forward(fptr(om), fptr(att), fptr(x), B, T, H, KVH, D, ctypes.byref(mk))
        dx = np.zeros_like(x)
        scratch = np.empty((B, H, T, T), np.float32)
        dof = np.ascontiguousarray(do.reshape(B, T, -1))  # (kept alive across the call)
        L.attention_backward(fptr(dx), fptr(scratch), fptr(dof), fptr(x), fptr(att), B, T, H,
                             KVH, D, ctypes.byref(mk))
        check(f"window sdpa out  {tag}", om.reshape(q.shape), ro)
        check(f"window sdpa dq   {tag}", dx[:, :, :H * D].reshape(q.shape), rdq)
        check(f"window sdpa dk   {tag}", dx[:, :, H * D:(H + KVH) * D].reshape(k.shape), rdk)
        check(f"window sdpa dv   {tag}", dx[:, :, (H + KVH) * D:].reshape(v.shape), rdv)


def test_errors():
    q, k, v, do = qkv(1, 8, 8, 4, 2, 16)
    out, lse = np.empty_like(q), np.empty((1, 4, 8), np.float32)
    bad = dims_sep(1, 8, 8, 3, 2, 16)  # H % KVH != 0
    mk = make_mask(True)
    rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                   ctypes.byref(bad), ctypes.byref(mk), ATTN_ISA_PORTABLE)
    check_true("H % KVH != 0 refused (-1)", rc == -1, f"rc {rc}")
    docs = np.zeros((1, 8), np.int32)
    half = make_mask(True)
    half.q_doc = docs.ctypes.data  # k_doc missing
    good = dims_sep(1, 8, 8, 4, 2, 16)
    rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                   ctypes.byref(good), ctypes.byref(half), ATTN_ISA_PORTABLE)
    check_true("q_doc without k_doc refused (-1)", rc == -1, f"rc {rc}")
    if not L.flash_attention_have_avx512():
        rc = L.flash_attention_forward(fptr(out), fptr(lse), fptr(q), fptr(k), fptr(v),
                                       ctypes.byref(good), ctypes.byref(mk), ATTN_ISA_AVX512)
        check_true("AVX-512 asked for on a CPU without it refused (-2)", rc == -2, f"rc {rc}")


if __name__ == "__main__":
    for iname, isa in ISAS:
        test_sdpa(iname, isa)
        test_materialized(iname, isa)
        test_offsets(iname, isa)
        test_documents(iname, isa)
        test_skip(iname, isa)
        test_threads(iname, isa)
        test_window_softcap(iname, isa)
    test_auto_follows_level()
    test_avx2_bits()
    test_errors()
    if len(ISAS) < 2:
        ok = os.environ.get("LOOM_FLASH_NO_AVX512_OK") == "1"
        print(f"{'note' if ok else 'FAIL'} the AVX-512 path was not tested: this CPU lacks it")
        results.append(ok)
    n_bad = results.count(False)
    print(f"{len(results) - n_bad}/{len(results)} checks passed")
    sys.exit(1 if n_bad else 0)
