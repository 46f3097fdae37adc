"""Every CPU kernel of include/loom/kernels.h against PyTorch in float64, at every
instruction-set level this CPU supports (x86-64, avx2, avx512: the portable build's run-time
variants, docs/build.md), and the levels against each other.

Forward outputs and every gradient are compared by max |loom - ref| / max |ref|, with a
tolerance per op (float32 kernels against a float64 reference: ~1e-6 for short elementwise
work, looser where long reductions accumulate rounding). Gradient outputs are pre-filled with
random values to check that backward ACCUMULATES (+=). Also checks bitwise determinism of two
backward kernels. Prints each check; exits 1 if any fails.
"""
import ctypes
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import f32, fptr, i32, iptr, lib, rel_err  # noqa: E402

torch.set_num_threads(2)
L = lib()
rng = np.random.default_rng(1234)
results = []


def check(name, got, ref, tol):
    err = rel_err(got, ref)
    ok = bool(np.isfinite(err) and err <= tol)
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name:44s} err {err:.3e}  tol {tol:.0e}")


def check_true(name, cond, detail=""):
    results.append(bool(cond))
    print(f"{'ok  ' if cond else 'FAIL'} {name:44s} {detail}")


def randn(*shape, scale=1.0):
    return f32(rng.standard_normal(shape) * scale)


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


# ---- matmul ------------------------------------------------------------------------------
def test_matmul():
    N, IC, OC = 67, 48, 83
    x, w, b, dy = randn(N, IC), randn(OC, IC), randn(OC), randn(N, OC)
    for with_bias in (True, False):
        tag = "bias" if with_bias else "nobias"
        out = np.empty((N, OC), np.float32)
        L.matmul_forward(fptr(out), fptr(x), fptr(w), fptr(b) if with_bias else None, N, IC, OC)
        xt, wt, bt = t64(x, True), t64(w, True), t64(b, True)
        ref = F.linear(xt, wt, bt if with_bias else None)
        ref.backward(t64(dy))
        check(f"matmul_forward ({tag})", out, ref.detach(), 1e-5)
        dx0, dw0, db0 = randn(N, IC), randn(OC, IC), randn(OC)
        dx, dw, db = dx0.copy(), dw0.copy(), db0.copy()
        L.matmul_backward(fptr(dx), fptr(dw), fptr(db) if with_bias else None, fptr(dy),
                          fptr(x), fptr(w), N, IC, OC)
        check(f"matmul_backward dinp ({tag})", dx, dx0 + xt.grad.numpy(), 1e-5)
        check(f"matmul_backward dweight ({tag})", dw, dw0 + wt.grad.numpy(), 1e-5)
        if with_bias:
            check("matmul_backward dbias", db, db0 + bt.grad.numpy(), 1e-5)
    # NULL dinp (the first layer's input needs no gradient); dbias with OC > one column slice
    N, IC, OC = 300, 40, 700
    x, w, dy = randn(N, IC), randn(OC, IC), randn(N, OC)
    dw, db = np.zeros((OC, IC), np.float32), np.zeros(OC, np.float32)
    L.matmul_backward(None, fptr(dw), fptr(db), fptr(dy), fptr(x), fptr(w), N, IC, OC)
    check("matmul_backward dweight (dinp NULL)", dw, t64(dy).T @ t64(x), 1e-5)
    check("matmul_backward dbias (OC=700)", db, t64(dy).sum(0), 1e-5)


# ---- norms -------------------------------------------------------------------------------
def test_layernorm():
    N, C, eps = 70, 96, 1e-5
    x = randn(N, C, scale=2.0) + 0.5
    w, b, dy = randn(C), randn(C), randn(N, C)
    out, mean, rstd = (np.empty((N, C), np.float32), np.empty(N, np.float32),
                       np.empty(N, np.float32))
    L.layernorm_forward(fptr(out), fptr(mean), fptr(rstd), fptr(x), fptr(w), fptr(b), N, C, eps)
    xt, wt, bt = t64(x, True), t64(w, True), t64(b, True)
    ref = F.layer_norm(xt, (C,), wt, bt, eps)
    ref.backward(t64(dy))
    check("layernorm_forward", out, ref.detach(), 1e-5)
    check("layernorm_forward mean", mean, xt.detach().mean(1), 1e-6)
    x64 = xt.detach()
    check("layernorm_forward rstd", rstd,
          1.0 / torch.sqrt(x64.var(1, unbiased=False) + eps), 1e-5)
    dx0, dw0, db0 = randn(N, C), randn(C), randn(C)
    dx, dw, db = dx0.copy(), dw0.copy(), db0.copy()
    L.layernorm_backward(fptr(dx), fptr(dw), fptr(db), fptr(dy), fptr(x), fptr(w), fptr(mean),
                         fptr(rstd), N, C)
    check("layernorm_backward dinp", dx, dx0 + xt.grad.numpy(), 1e-5)
    check("layernorm_backward dweight", dw, dw0 + wt.grad.numpy(), 1e-5)
    check("layernorm_backward dbias", db, db0 + bt.grad.numpy(), 1e-5)


def test_rmsnorm():
    N, C, eps = 70, 96, 1e-6
    x, w, dy = randn(N, C, scale=2.0), randn(C), randn(N, C)
    out, rstd = np.empty((N, C), np.float32), np.empty(N, np.float32)
    L.rmsnorm_forward(fptr(out), fptr(rstd), fptr(x), fptr(w), N, C, eps)
    xt, wt = t64(x, True), t64(w, True)
    ref = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + eps) * wt
    ref.backward(t64(dy))
    check("rmsnorm_forward", out, ref.detach(), 1e-5)
    dx0, dw0 = randn(N, C), randn(C)
    dx, dw = dx0.copy(), dw0.copy()
    L.rmsnorm_backward(fptr(dx), fptr(dw), fptr(dy), fptr(x), fptr(w), fptr(rstd), N, C)
    check("rmsnorm_backward dinp", dx, dx0 + xt.grad.numpy(), 1e-5)
    check("rmsnorm_backward dweight", dw, dw0 + wt.grad.numpy(), 1e-5)


# ---- activations -------------------------------------------------------------------------
def test_gelu():
    n = 40000  # above the parallel threshold
    x = randn(n, scale=3.0)
    x[:8] = [0.0, -0.0, 1e-6, -1e-6, 12.0, -12.0, 40.0, -40.0]
    dy = randn(n)
    out = np.empty(n, np.float32)
    L.gelu_forward(fptr(out), fptr(x), n)
    xt = t64(x, True)
    ref = F.gelu(xt, approximate="tanh")
    ref.backward(t64(dy))
    check("gelu_forward", out, ref.detach(), 1e-6)
    dx0 = randn(n)
    dx = dx0.copy()
    L.gelu_backward(fptr(dx), fptr(x), fptr(dy), n)
    check("gelu_backward", dx, dx0 + xt.grad.numpy(), 1e-6)


def test_swiglu():
    N, Fw = 33, 50
    x, dy = randn(N, 2 * Fw, scale=3.0), randn(N, Fw)
    x[0, :4] = [-100.0, 100.0, 0.0, -30.0]
    out = np.empty((N, Fw), np.float32)
    L.swiglu_forward(fptr(out), fptr(x), N, Fw)
    xt = t64(x, True)
    g, u = xt[:, :Fw], xt[:, Fw:]
    ref = F.silu(g) * u
    ref.backward(t64(dy))
    check("swiglu_forward", out, ref.detach(), 1e-6)
    dx0 = randn(N, 2 * Fw)
    dx = dx0.copy()
    L.swiglu_backward(fptr(dx), fptr(x), fptr(dy), N, Fw)
    check("swiglu_backward", dx, dx0 + xt.grad.numpy(), 1e-6)


def test_geglu():
    N, Fw = 33, 50
    x, dy = randn(N, 2 * Fw, scale=3.0), randn(N, Fw)
    x[0, :4] = [-100.0, 100.0, 0.0, -30.0]
    out = np.empty((N, Fw), np.float32)
    L.geglu_forward(fptr(out), fptr(x), N, Fw)
    xt = t64(x, True)
    g, u = xt[:, :Fw], xt[:, Fw:]
    ref = F.gelu(g, approximate="tanh") * u  # Gemma's gelu_pytorch_tanh
    ref.backward(t64(dy))
    check("geglu_forward", out, ref.detach(), 1e-6)
    dx0 = randn(N, 2 * Fw)
    dx = dx0.copy()
    L.geglu_backward(fptr(dx), fptr(x), fptr(dy), N, Fw)
    check("geglu_backward", dx, dx0 + xt.grad.numpy(), 1e-6)


def at(a, k):
    """float* k floats into the C-contiguous float32 array a (a column offset of its rows)"""
    assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    return ctypes.c_void_p(a.ctypes.data + 4 * k)


def test_rownorm():
    """whole-projection RMSNorm (OLMo 2's q/k norms) of rows of n floats inside wider rows, in
    two column parts whose row statistics are added between the pieces (what tp = 2 does at
    QKNORM_SUM), against torch's RMSNorm over the whole row in float64"""
    N, n, stride, eps = 9, 40, 56, 1e-6
    x, w, dy = randn(N, stride, scale=2.0), randn(n), randn(N, stride)
    xt, wt = t64(x[:, :n], True), t64(w, True)
    ref = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + eps) * wt
    ref.backward(t64(dy[:, :n]))
    parts = ((0, 24), (24, 16))  # column offset, width
    st = np.zeros((N, 2), np.float32)
    for j, (o, k) in enumerate(parts):  # column 0: the first part's sums, 1: the second's
        L.rownorm_sums(at(st, j), 2, at(x, o), None, None, None, N, k, stride)
    # the whole rows' statistics, (N, 2) with column 0 used: the block's layout (q, k)
    ss = np.zeros((N, 2), np.float32)
    ss[:, 0] = st.sum(1, dtype=np.float32)
    out, rstd = np.full((N, stride), 7.0, np.float32), np.zeros((N, 2), np.float32)
    for o, k in parts:
        L.rownorm_forward(at(out, o), fptr(rstd), at(x, o), at(w, o), fptr(ss), N,
                          k, stride, 2, n, eps)
    check("rownorm_forward (2 parts)", out[:, :n], ref.detach(), 2e-6)
    check_true("rownorm_forward leaves the rest of the rows", (out[:, n:] == 7.0).all())
    dots = np.zeros((N, 2), np.float32)
    for j, (o, k) in enumerate(parts):
        np_part = np.zeros((N, 2), np.float32)
        L.rownorm_sums(fptr(np_part), 2, at(x, o), at(dy, o), at(w, o), fptr(rstd), N, k, stride)
        dots[:, 0] += np_part[:, 0]
    dx, dw0 = np.full((N, stride), 5.0, np.float32), randn(n)
    dw = dw0.copy()
    for o, k in parts:
        L.rownorm_backward(at(dx, o), at(dw, o), at(dy, o), at(x, o),
                           at(w, o), fptr(rstd), fptr(dots), N, k, stride, 2, n)
    check("rownorm_backward din (set)", dx[:, :n], xt.grad, 2e-6)
    check("rownorm_backward dw (+=)", dw, dw0 + wt.grad.numpy(), 2e-6)


def test_softcap_ce():
    """final-logit soft-capping: y = cap * tanh(z / cap), then the cross-entropy's backward
    with respect to z through the cap, dense and vocab-parallel (two column shards)"""
    N, V, cap = 7, 301, 5.0
    z = randn(N, V, scale=8.0)  # well past the cap: tanh bends
    targets = i32(rng.integers(0, V, N))
    targets[2] = -1
    y = z.copy()
    L.softcap_forward(fptr(y), y.size, cap)
    zt = t64(z, True)
    yt = cap * torch.tanh(zt / cap)
    check("softcap_forward", y, yt.detach(), 1e-6)
    ref = F.cross_entropy(yt, torch.tensor(targets, dtype=torch.long), ignore_index=-1,
                          reduction="sum") / 6
    ref.backward()
    d = y.copy()
    L.crossentropy_softcap_backward(fptr(d), iptr(targets), N, V, 1.0 / 6, cap, None)
    check("crossentropy_softcap_backward (dz)", d, zt.grad, 1e-6)
    w = rng.uniform(-1.0, 2.0, N).astype(np.float32)  # per-row weights, dense and sharded
    zw = t64(z, True)
    (F.cross_entropy(cap * torch.tanh(zw / cap), torch.tensor(targets, dtype=torch.long),
                     ignore_index=-1, reduction="none") * torch.tensor(w, dtype=torch.float64)).sum().backward()
    dw = y.copy()
    L.crossentropy_softcap_backward(fptr(dw), iptr(targets), N, V, 7.0, cap, fptr(w))
    check("crossentropy_softcap_backward, per-row weights (dz)", dw, zw.grad, 1e-6)
    v0s = (0, 150)
    mx = np.full(N, -np.inf, np.float32)
    shards = [np.ascontiguousarray(y[:, v0:v0 + vl]) for v0, vl in zip(v0s, (150, V - 150))]
    for sh in shards:  # the global max, then the global sums (VOCAB_MAX, VOCAB_SUM)
        m = np.empty(N, np.float32)
        L.crossentropy_shard_max(fptr(m), fptr(sh), N, sh.shape[1])
        mx = np.maximum(mx, m)
    sums = np.zeros((N, 2), np.float32)
    for v0, sh in zip(v0s, shards):
        s = np.empty((N, 2), np.float32)
        L.crossentropy_shard_sums(fptr(s), fptr(sh), fptr(mx), iptr(targets), v0, N, sh.shape[1])
        sums += s
    for v0, sh in zip(v0s, shards):
        L.crossentropy_shard_softcap_backward(fptr(sh), iptr(targets), fptr(mx), fptr(sums), v0,
                                              N, sh.shape[1], 1.0 / 6, cap, None)
    check("crossentropy_shard_softcap_backward (dz)", np.concatenate(shards, 1), zt.grad, 1e-6)
    wshards = [np.ascontiguousarray(y[:, v0:v1]) for v0, v1 in zip(v0s, (150, V))]
    for v0, sh in zip(v0s, wshards):
        L.crossentropy_shard_softcap_backward(fptr(sh), iptr(targets), fptr(mx), fptr(sums), v0,
                                              N, sh.shape[1], 7.0, cap, fptr(w))
    check("crossentropy_shard_softcap_backward, per-row weights (dz)", np.concatenate(wshards, 1),
          zw.grad, 1e-6)


def test_residual():
    n = 1000
    a, b = randn(n), randn(n)
    out = np.empty(n, np.float32)
    L.residual_forward(fptr(out), fptr(a), fptr(b), n)
    check("residual_forward", out, t64(a) + t64(b), 1e-7)
    L.residual_forward(fptr(a), fptr(a), fptr(b), n)  # out aliasing a
    check("residual_forward (out aliases a)", a, out, 0.0)


# ---- rope --------------------------------------------------------------------------------
def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def test_rope():
    B, T, H, KVH, D, theta, pos0, max_T = 2, 37, 4, 2, 16, 10000.0, 5, 64
    cos_t, sin_t = np.empty((max_T, D // 2), np.float32), np.empty((max_T, D // 2), np.float32)
    L.rope_tables(fptr(cos_t), fptr(sin_t), max_T, D, theta)
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(max_T, dtype=torch.float64)[:, None] * inv[None, :]
    # float32 angles (as HF forms them) differ from exact ones by < ulp(max_T)
    check("rope_tables cos", cos_t, torch.cos(ang), 1e-5)
    check("rope_tables sin", sin_t, torch.sin(ang), 1e-5)

    R = (H + 2 * KVH) * D
    qkv = randn(B, T, R)
    x = qkv.copy()
    L.rope_forward(fptr(x), B, T, H, D, R, fptr(cos_t), fptr(sin_t), pos0)  # query heads
    L.rope_forward(x[:, :, H * D:].ctypes.data, B, T, KVH, D, R, fptr(cos_t), fptr(sin_t),
                   pos0)  # key heads: a view into the same rows
    # reference: HF Llama's apply_rotary_pos_emb with loom's tables
    c = t64(cos_t[pos0:pos0 + T]).repeat(1, 2)[None, :, None, :]  # (1,T,1,D)
    s = t64(sin_t[pos0:pos0 + T]).repeat(1, 2)[None, :, None, :]
    q = t64(qkv[:, :, :H * D]).view(B, T, H, D)
    k = t64(qkv[:, :, H * D:(H + KVH) * D]).view(B, T, KVH, D)
    qr = q * c + rotate_half(q) * s
    kr = k * c + rotate_half(k) * s
    check("rope_forward q heads", x[:, :, :H * D], qr.reshape(B, T, H * D), 1e-6)
    check("rope_forward k heads", x[:, :, H * D:(H + KVH) * D], kr.reshape(B, T, KVH * D), 1e-6)
    check("rope_forward leaves v heads", x[:, :, (H + KVH) * D:], qkv[:, :, (H + KVH) * D:], 0.0)
    # backward is the adjoint: <rope(x), y> == <x, rope_backward(y)>, and undoes forward
    xs, ys = randn(B, T, H * D), randn(B, T, H * D)
    rx, ry = xs.copy(), ys.copy()
    L.rope_forward(fptr(rx), B, T, H, D, H * D, fptr(cos_t), fptr(sin_t), pos0)
    L.rope_backward(fptr(ry), B, T, H, D, H * D, fptr(cos_t), fptr(sin_t), pos0)
    lhs = float(np.dot(rx.astype(np.float64).ravel(), ys.astype(np.float64).ravel()))
    rhs = float(np.dot(xs.astype(np.float64).ravel(), ry.astype(np.float64).ravel()))
    # relative to |Rx||y| (the dot products' scale: they may cancel to near 0 for random data)
    scale = float(np.linalg.norm(rx.astype(np.float64)) * np.linalg.norm(ys.astype(np.float64)))
    check("rope_backward adjoint <Rx,y> vs <x,R^T y>", np.array([lhs, scale]),
          np.array([rhs, scale]), 1e-6)
    L.rope_backward(fptr(rx), B, T, H, D, H * D, fptr(cos_t), fptr(sin_t), pos0)
    check("rope_backward(rope_forward(x)) == x", rx, xs, 1e-6)
    # and the torch autograd gradient of the rotation
    qt = t64(xs, True)
    qv = qt.view(B, T, H, D)
    (qv * c + rotate_half(qv) * s).backward(t64(ys).view(B, T, H, D))
    g = ys.copy()
    L.rope_backward(fptr(g), B, T, H, D, H * D, fptr(cos_t), fptr(sin_t), pos0)
    check("rope_backward vs autograd", g, qt.grad, 1e-6)


# ---- attention ---------------------------------------------------------------------------
def attention_case(B, T, H, KVH, D):
    tag = f"B={B} T={T} H={H} KVH={KVH} D={D}"
    R = (H + 2 * KVH) * D
    qkv, dy = randn(B, T, R), randn(B, T, H * D)
    out = np.empty((B, T, H * D), np.float32)
    att = np.full((B, H, T, T), np.nan, np.float32)  # the kernel must write every entry
    L.attention_forward(fptr(out), fptr(att), fptr(qkv), B, T, H, KVH, D, None)
    xt = t64(qkv, True)
    q = xt[:, :, :H * D].view(B, T, H, D).transpose(1, 2)
    k = xt[:, :, H * D:(H + KVH) * D].view(B, T, KVH, D).transpose(1, 2)
    v = xt[:, :, (H + KVH) * D:].view(B, T, KVH, D).transpose(1, 2)
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = y.transpose(1, 2).reshape(B, T, H * D)
    ref.backward(t64(dy))
    with torch.no_grad():
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        p = torch.softmax(s, -1)
    check(f"attention_forward out ({tag})", out, ref.detach(), 2e-5)
    check(f"attention_forward att ({tag})", att, p, 2e-5)
    dq0 = randn(B, T, R)
    dq = dq0.copy()
    scratch = np.full((B, H, T, T), np.nan, np.float32)
    L.attention_backward(fptr(dq), fptr(scratch), fptr(dy), fptr(qkv), fptr(att),
                         B, T, H, KVH, D, None)
    g = dq0 + xt.grad.numpy()
    check(f"attention_backward dq ({tag})", dq[:, :, :H * D], g[:, :, :H * D], 2e-5)
    check(f"attention_backward dk ({tag})", dq[:, :, H * D:(H + KVH) * D],
          g[:, :, H * D:(H + KVH) * D], 2e-5)
    check(f"attention_backward dv ({tag})", dq[:, :, (H + KVH) * D:], g[:, :, (H + KVH) * D:],
          2e-5)


def test_attention():
    attention_case(2, 37, 4, 4, 16)    # MHA, T below one 64-row block
    attention_case(2, 37, 4, 2, 16)    # GQA
    attention_case(1, 150, 4, 2, 32)   # three row blocks, the last one partial
    attention_case(1, 64, 6, 1, 8)     # multi-query, T exactly one block


# ---- embedding ---------------------------------------------------------------------------
def test_embedding():
    B, T, C, V, maxT = 2, 5, 80, 7, 16
    tokens = i32([[1, 3, 3, 0, 6], [3, 1, 2, 2, 3]])  # repeated tokens
    wte, wpe, dy = randn(V, C), randn(maxT, C), randn(B, T, C)
    for pos0, use_wpe in ((0, True), (4, True), (0, False)):
        tag = f"pos0={pos0} wpe={'yes' if use_wpe else 'NULL'}"
        out = np.empty((B, T, C), np.float32)
        L.embedding_forward(fptr(out), iptr(tokens), fptr(wte), fptr(wpe) if use_wpe else None,
                            B, T, C, pos0)
        et, pt = t64(wte, True), t64(wpe, True)
        tok = torch.tensor(tokens, dtype=torch.long)
        ref = F.embedding(tok, et)
        if use_wpe:
            ref = ref + F.embedding(torch.arange(pos0, pos0 + T)[None, :], pt)
        ref.backward(t64(dy))
        check(f"embedding_forward ({tag})", out, ref.detach(), 0.0 if not use_wpe else 1e-7)
        dwte0, dwpe0 = randn(V, C), randn(maxT, C)
        dwte, dwpe = dwte0.copy(), dwpe0.copy()
        L.embedding_backward(fptr(dwte), fptr(dwpe) if use_wpe else None, fptr(dy),
                             iptr(tokens), B, T, C, pos0)
        check(f"embedding_backward dwte ({tag})", dwte, dwte0 + et.grad.numpy(), 1e-6)
        if use_wpe:
            check(f"embedding_backward dwpe ({tag})", dwpe, dwpe0 + pt.grad.numpy(), 1e-6)
        else:
            check("embedding_backward dwpe NULL untouched", dwpe, dwpe0, 0.0)


# ---- cross-entropy -----------------------------------------------------------------------
def ce_case(N, V, scale, tag):
    logits = randn(N, V, scale=scale)
    targets = i32(rng.integers(0, V, N))
    targets[1] = -1
    targets[N - 1] = -1
    losses = np.full(N, np.nan, np.float32)
    L.crossentropy_forward(fptr(losses), fptr(logits), iptr(targets), N, V)
    lt = t64(logits, True)
    tt = torch.tensor(targets, dtype=torch.long)
    ref = F.cross_entropy(lt, tt, ignore_index=-1, reduction="none")
    valid = int((targets >= 0).sum())
    (ref.sum() / valid).backward()
    check(f"crossentropy_forward ({tag})", losses, ref.detach(), 1e-6)
    check_true(f"crossentropy_forward ignored rows = 0 ({tag})",
               losses[1] == 0.0 and losses[N - 1] == 0.0)
    before = logits.copy()
    L.crossentropy_softmax_backward(fptr(logits), iptr(targets), N, V, 1.0 / valid, None)
    check(f"crossentropy_softmax_backward ({tag})", logits, lt.grad, 1e-6)
    check_true(f"crossentropy_softmax_backward ignored rows 0 ({tag})",
               not logits[1].any() and not logits[N - 1].any())
    # per-row weights (GRPO's / DPO's per-token weights): the gradient of sum_i w_i * loss_i,
    # and bit for bit row i's call with dscale = w_i
    w = (rng.uniform(0.1, 2.0, N) * np.where(rng.random(N) < 0.3, -1, 1)).astype(np.float32)
    lw = t64(before, True)
    (F.cross_entropy(lw, tt, ignore_index=-1, reduction="none") * torch.tensor(w, dtype=torch.float64)).sum().backward()
    got = before.copy()
    L.crossentropy_softmax_backward(fptr(got), iptr(targets), N, V, 123.0, fptr(w))
    check(f"crossentropy_softmax_backward, per-row weights ({tag})", got, lw.grad, 1e-6)
    rows = before.copy()
    for n in range(N):
        L.crossentropy_softmax_backward(fptr(rows[n:n + 1]), iptr(targets[n:n + 1]), 1, V, float(w[n]), None)
    check_true(f"crossentropy_softmax_backward, per-row weights = one call a row, bitwise ({tag})",
               np.array_equal(got.view(np.uint32), rows.view(np.uint32)))


def test_crossentropy():
    ce_case(16, 1000, 3.0, "V=1000")
    ce_case(4, 50257, 5.0, "V=50257")
    ce_case(6, 300, 40.0, "large logits")


# ---- adamw, sum_squares, scale -----------------------------------------------------------
def test_adamw():
    n = 20000
    p0 = randn(n)
    grads = [randn(n, scale=0.1) for _ in range(3)]
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.95, 1e-8, 0.1
    p, m, v = p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for step in range(1, 4):
        L.adamw_update(fptr(p), fptr(grads[step - 1]), fptr(m), fptr(v), n, lr, b1, b2, eps,
                       wd, step, 1.0)
    for dtype, tol, tag in ((torch.float64, 2e-6, "float64"), (torch.float32, 1e-6, "float32")):
        pt = torch.nn.Parameter(torch.tensor(p0, dtype=dtype))
        opt = torch.optim.AdamW([pt], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        for step in range(3):
            pt.grad = torch.tensor(grads[step], dtype=dtype)
            opt.step()
        check(f"adamw_update 3 steps vs torch AdamW {tag}", p, pt.detach(), tol)
        st = opt.state[pt]
        check(f"adamw_update exp_avg ({tag})", m, st["exp_avg"], tol)
        check(f"adamw_update exp_avg_sq ({tag})", v, st["exp_avg_sq"], tol)


def test_sum_squares_scale():
    for n in (1, 1000, 300001):
        x = randn(n)
        got = L.sum_squares(fptr(x), n)
        ref = float(np.sum(x.astype(np.float64) ** 2))
        check(f"sum_squares n={n}", np.array([got]), np.array([ref]), 1e-12)
    x = randn(5000)
    y = x.copy()
    L.scale_inplace(fptr(y), 5000, 0.37)
    check("scale_inplace", y, t64(x) * np.float32(0.37), 1e-7)


# ---- determinism -------------------------------------------------------------------------
def test_determinism():
    B, T, H, KVH, D = 2, 100, 4, 2, 32
    R = (H + 2 * KVH) * D
    qkv, dy = randn(B, T, R), randn(B, T, H * D)
    out, att = np.empty((B, T, H * D), np.float32), np.empty((B, H, T, T), np.float32)
    L.attention_forward(fptr(out), fptr(att), fptr(qkv), B, T, H, KVH, D, None)
    runs = []
    for _ in range(2):
        d = np.zeros((B, T, R), np.float32)
        scratch = np.empty((B, H, T, T), np.float32)
        L.attention_backward(fptr(d), fptr(scratch), fptr(dy), fptr(qkv), fptr(att),
                             B, T, H, KVH, D, None)
        runs.append(d)
    check_true("attention_backward bitwise reproducible", np.array_equal(runs[0], runs[1]))
    N, C = 512, 192
    x, w, b, dyn = randn(N, C), randn(C), randn(C), randn(N, C)
    o, mean, rstd = np.empty((N, C), np.float32), np.empty(N, np.float32), np.empty(N, np.float32)
    L.layernorm_forward(fptr(o), fptr(mean), fptr(rstd), fptr(x), fptr(w), fptr(b), N, C, 1e-5)
    runs = []
    for _ in range(2):
        dx, dw, db = np.zeros((N, C), np.float32), np.zeros(C, np.float32), np.zeros(C, np.float32)
        L.layernorm_backward(fptr(dx), fptr(dw), fptr(db), fptr(dyn), fptr(x), fptr(w),
                             fptr(mean), fptr(rstd), N, C)
        runs.append((dx, dw, db))
    same = all(np.array_equal(a, c) for a, c in zip(runs[0], runs[1]))
    check_true("layernorm_backward bitwise reproducible", same)


# ---- instruction-set levels ---------------------------------------------------------------
ISA_NATIVE, ISA_BASE, ISA_AVX2, ISA_AVX512 = 0, 1, 3, 4


def isa_name(level):
    return L.loom_isa_name(level).decode()


def set_level(level):
    rc = L.loom_isa_set(level, None)
    check_true(f"loom_isa_set({isa_name(level)})", rc == 0 and L.loom_isa_active() == level,
               f"active {isa_name(L.loom_isa_active())}")


def level_outputs():
    """A fixed set of kernel results on fixed inputs (every multi-versioned file)."""
    g = np.random.default_rng(99)
    r = lambda *s: f32(g.standard_normal(s))  # noqa: E731
    out = {}
    x = r(5000) * 4
    y = np.empty_like(x)
    L.gelu_forward(fptr(y), fptr(x), x.size)
    out["gelu_forward"] = y
    N, C = 64, 200
    a, w, b = r(N, C), r(C), r(C)
    o, mean, rstd = np.empty((N, C), np.float32), np.empty(N, np.float32), np.empty(N, np.float32)
    L.layernorm_forward(fptr(o), fptr(mean), fptr(rstd), fptr(a), fptr(w), fptr(b), N, C, 1e-5)
    out["layernorm_forward"] = o
    sw = np.empty((N, C // 2), np.float32)
    L.swiglu_forward(fptr(sw), fptr(a), N, C // 2)
    out["swiglu_forward"] = sw
    gg = np.empty((N, C // 2), np.float32)
    L.geglu_forward(fptr(gg), fptr(a), N, C // 2)
    out["geglu_forward"] = gg
    V = 3000
    logits, tg = r(8, V) * 3, i32(g.integers(0, V, 8))
    losses = np.empty(8, np.float32)
    L.crossentropy_forward(fptr(losses), fptr(logits), iptr(tg), 8, V)
    out["crossentropy_forward"] = losses
    L.crossentropy_softmax_backward(fptr(logits), iptr(tg), 8, V, 0.125, None)
    out["crossentropy_softmax_backward"] = logits
    B, T, H, KVH, D = 1, 70, 2, 1, 16
    qkv = r(B, T, (H + 2 * KVH) * D)
    ao, att = np.empty((B, T, H * D), np.float32), np.empty((B, H, T, T), np.float32)
    L.attention_forward(fptr(ao), fptr(att), fptr(qkv), B, T, H, KVH, D, None)
    out["attention_forward"] = ao
    p, gr = r(3000), r(3000) * 0.1
    m, v = np.zeros_like(p), np.zeros_like(p)
    for step in (1, 2):
        L.adamw_update(fptr(p), fptr(gr), fptr(m), fptr(v), p.size, 1e-2, 0.9, 0.95, 1e-8, 0.1, step,
                       1.0)
    out["adamw_update"] = p
    out["sum_squares"] = np.array([L.sum_squares(fptr(x), x.size)])
    return out


def test_levels(levels):
    """Every level agrees with x86-64 within tolerance; the top level is other code (its bits
    differ somewhere: FMA contraction, reduction widths), so the dispatch is no no-op."""
    best = L.loom_isa_detect()
    if best == ISA_NATIVE:
        check_true("NATIVE=1 build: one level", L.loom_isa_set(ISA_BASE, None) != 0)
        return
    res = {}
    for lv in levels:
        set_level(lv)
        res[lv] = level_outputs()
    for lv in levels[1:]:
        for k, ref in res[ISA_BASE].items():
            check(f"{k} at {isa_name(lv)} vs x86-64", res[lv][k], ref, 1e-5)
    if len(levels) > 1:
        top = levels[-1]
        differs = [k for k in res[ISA_BASE] if not np.array_equal(res[top][k], res[ISA_BASE][k])]
        check_true(f"{isa_name(top)} kernels are other code than x86-64's", differs,
                   f"differ in bits: {', '.join(differs)}")
    for lv in (ISA_AVX2, ISA_AVX512):
        if lv > best:
            check_true(f"loom_isa_set({isa_name(lv)}) refused on this CPU",
                       L.loom_isa_set(lv, None) != 0 and L.loom_isa_active() in levels)


def main():
    print(f"libloom: {os.environ.get('LOOM_LIB', '(default path)')}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    best = L.loom_isa_detect()
    levels = [ISA_NATIVE] if best == ISA_NATIVE else \
        [lv for lv in (ISA_BASE, ISA_AVX2, ISA_AVX512) if lv <= best]
    print(f"levels: {', '.join(isa_name(lv) for lv in levels)} (this CPU: {isa_name(best)})")
    for lv in levels:
        print(f"---- kernels at level {isa_name(lv)} ----")
        if lv != ISA_NATIVE:
            set_level(lv)
        for t in (test_matmul, test_layernorm, test_rmsnorm, test_gelu, test_swiglu, test_geglu,
                  test_rownorm, test_softcap_ce,
                  test_residual, test_rope, test_attention, test_embedding, test_crossentropy,
                  test_adamw, test_sum_squares_scale, test_determinism):
            t()
    print("---- the levels against each other ----")
    test_levels(levels)
    failed = results.count(False)
    print(f"{len(results) - failed}/{len(results)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
