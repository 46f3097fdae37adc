"""Whole-model reference test: loom's decoder (libloom.so through ctypes, fp32) against the
PyTorch reference in tests/reference/torch_ref.py (float64), on the same weights and inputs.

For both flavors (gpt2, llama with GQA), small shapes:
  * parameter layout: every loom_tensor_info (name, shape, decay, offsets) matches model.h;
  * init: same seed -> identical bytes, other seed -> different; statistics as documented;
  * forward: logits and loss (targets with -1 entries; T < max and T = max; B < created B);
  * loom_model_next_logits against the reference's last-position logits;
  * backward: EVERY parameter gradient against torch autograd.
And Gemma's block features, before any Gemma family row exists (docs/architectures.md):
sandwich norms, GeGLU, the embedding scale sqrt(d_model) (float32), final-logit soft-capping
and the norm weight offset (the reference computes x * rstd * (1 + w) with w = loom's weight
- 1, and its gradients are taken with respect to that w), with per-head q/k norms, a tied head
and GQA: a model made from model.arch.* keys (libloom's config reader), every parameter
random, against a float64 reference written here (logits, loss, every gradient). Then the same
with Gemma's attention features on top, flash and sdpa: sliding windows on alternating layers
(model.arch.sliding_window 4 over 11 positions, window_period 2: layer 0 slides, layer 1 is
full), the sliding layers' own RoPE base (rope_local_theta), attention logit soft-capping
(attn_softcap) and the scale query_pre_attn_scalar^-0.5.
Training (AdamW, clipping, the lr schedule, every ZeRO stage) is tests/reference/test_engine.py:
it drives the trainer's own engine, the only optimizer in libloom.

Tolerances (loom computes in fp32, the reference in fp64; errors are normalized by the
reference's max magnitude of the same tensor):
  logits   max|d| / max|ref|        <= 1e-5
  loss     |d| / |ref|              <= 1e-6
  grads    max|d| / max|ref|        <= 2e-5   per tensor
(observed at the first commit: logits <= 3.2e-7, loss <= 4.3e-8, grads <= 6.1e-7: the
tolerances leave >= 20x headroom for fp32
reordering in faster kernels, and are far below what a wrong op produces.)
Observed values are printed. Exits non-zero on any mismatch.
"""
import ctypes
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402
from loomlib import check, expect, finish, rel_max  # noqa: E402

TOL_LOGITS = 1e-5
TOL_LOSS = 1e-6
TOL_GRAD = 2e-5



# ---- ctypes mirror of include/loom/{base,model}.h --------------------------------------
class ModelConfig(ctypes.Structure):
    _fields_ = [("flavor", ctypes.c_int), ("vocab_size", ctypes.c_int),
                ("max_seq_len", ctypes.c_int), ("n_layer", ctypes.c_int),
                ("n_head", ctypes.c_int), ("n_kv_head", ctypes.c_int),
                ("d_model", ctypes.c_int), ("d_ff", ctypes.c_int),
                ("norm_eps", ctypes.c_float), ("rope_theta", ctypes.c_float),
                ("init_std", ctypes.c_float), ("head", ctypes.c_int),
                ("num_classes", ctypes.c_int), ("attention", ctypes.c_int),
                ("backend", ctypes.c_void_p),  # const loom_backend *: None = the cpu table
                # mixture of experts (n_expert 0: dense)
                ("n_expert", ctypes.c_int), ("top_k", ctypes.c_int), ("moe_every", ctypes.c_int),
                ("shared_experts", ctypes.c_int), ("group_tokens", ctypes.c_int),
                ("capacity_factor", ctypes.c_float), ("aux_loss_coef", ctypes.c_float),
                ("z_loss_coef", ctypes.c_float),
                ("doc_mask", ctypes.c_int), ("loss_chunk", ctypes.c_int),
                ("recompute", ctypes.c_int)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("layer", ctypes.c_int), ("kind", ctypes.c_int),
                ("offset", ctypes.c_size_t),
                ("numel", ctypes.c_size_t), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4), ("decay", ctypes.c_int), ("unit", ctypes.c_int)]


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


def load_lib():
    path = os.environ.get("LOOM_LIB")
    if not path:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                            "libloom.so")
    lib = ctypes.CDLL(path)
    P, I, F, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
    fp = ctypes.POINTER(ctypes.c_float)
    ip = ctypes.POINTER(ctypes.c_int32)
    sigs = {
        "loom_model_create": (I, [ctypes.POINTER(ModelConfig), P, I, I, ctypes.POINTER(P),
                                  ctypes.POINTER(Err)]),
        "loom_model_free": (None, [P]),
        "loom_model_num_params": (Z, [P]),
        "loom_model_params": (fp, [P]),
        "loom_model_grads": (fp, [P]),
        "loom_model_num_tensors": (I, [P]),
        "loom_model_tensor": (ctypes.POINTER(TensorInfo), [P, I]),
        "loom_model_global": (ctypes.POINTER(TensorInfo), [P, I]),
        "loom_model_layer_tensor": (ctypes.POINTER(TensorInfo), [P, I, I]),
        "loom_model_layer_range": (None, [P, I, ctypes.POINTER(Z), ctypes.POINTER(Z)]),
        "loom_model_init_weights": (None, [P, ctypes.c_uint64]),
        "loom_model_forward": (F, [P, ip, ip, I, I]),
        "loom_model_backward": (None, [P, F]),
        "loom_model_valid_targets": (ctypes.c_int64, [P]),
        "loom_model_zero_grad": (None, [P]),
        "loom_model_logits": (fp, [P]),
        "loom_model_next_logits": (fp, [P, ip, I]),
        "loom_model_flops_per_token": (ctypes.c_double, [P, I]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


LIB = load_lib()
class LoomModel:
    def __init__(self, cfg, B, T):
        c = torch_ref.normalize_config(cfg)
        self.cfg = c
        mc = ModelConfig(c["flavor"], c["vocab_size"], c["max_seq_len"], c["n_layer"],
                         c["n_head"], c["n_kv_head"], c["d_model"], c["d_ff"], c["norm_eps"],
                         c["rope_theta"], c["init_std"], attention=c.get("attention", 0))
        self.ptr = ctypes.c_void_p()
        err = Err()
        if LIB.loom_model_create(ctypes.byref(mc), None, B, T, ctypes.byref(self.ptr),
                                 ctypes.byref(err)) != 0:
            raise RuntimeError("loom_model_create: " + err.msg.decode(errors="replace"))
        self.n = LIB.loom_model_num_params(self.ptr)
        self.params = np.ctypeslib.as_array(LIB.loom_model_params(self.ptr), shape=(self.n,))
        self.grads = np.ctypeslib.as_array(LIB.loom_model_grads(self.ptr), shape=(self.n,))
        self.V = c["vocab_size"]

    def free(self):
        if self.ptr:
            LIB.loom_model_free(self.ptr)
            self.ptr = None

    @staticmethod
    def as_dict(p):
        if not p:
            return None
        t = p.contents
        return {"name": t.name.decode(), "layer": t.layer, "kind": t.kind, "offset": t.offset,
                "numel": t.numel, "shape": tuple(t.shape[k] for k in range(t.ndim)),
                "decay": t.decay}

    def info(self, i):
        return self.as_dict(LIB.loom_model_tensor(self.ptr, i))

    def infos(self):
        """The tensor table, in arena order."""
        return [self.info(i) for i in range(LIB.loom_model_num_tensors(self.ptr))]

    def tensors(self):
        """{name: info} of the present tensors."""
        return {inf["name"]: inf for inf in self.infos()}

    def view(self, arena, inf):
        return arena[inf["offset"]:inf["offset"] + inf["numel"]].reshape(inf["shape"])

    def forward(self, x, y):
        x = np.ascontiguousarray(x, dtype=np.int32)
        B, T = x.shape
        yp = None
        if y is not None:
            y = np.ascontiguousarray(y, dtype=np.int32)
            yp = y.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        loss = LIB.loom_model_forward(self.ptr, x.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                      yp, B, T)
        logits = np.ctypeslib.as_array(LIB.loom_model_logits(self.ptr),
                                       shape=(B, T, self.V)).copy()
        return loss, logits


def to_torch(lm, ref):
    """Copies every loom parameter into the float64 reference."""
    tens = lm.tensors()
    with torch.no_grad():
        for name in ref.names:
            ref.get_parameter(name).copy_(
                torch.from_numpy(lm.view(lm.params, tens[name]).copy()))


def make_tokens(rng, B, T, V):
    return rng.integers(0, V, size=(B, T), dtype=np.int64)


# ---- the checks ---------------------------------------------------------------------------------
def check_layout(lm, cfg):
    print(" layout")
    want = torch_ref.param_shapes(cfg)
    infos = lm.infos()
    got = [(inf["name"], inf["shape"]) for inf in infos]
    expect(f"{len(want)} tensors, names and shapes in arena order match model.h",
           got == [(n, tuple(s)) for n, s in want],
           "" if got == want else f"got {got}\n       want {want}")
    fl = cfg["flavor"]
    genum = [n for n, _ in torch_ref.GLOBAL_ENUM]
    lenum = [n for n, _ in torch_ref.LAYER_ENUM]
    bad = []
    for inf in infos:
        b = torch_ref.base_name(inf["name"])
        layered = inf["name"].startswith("layers.")
        want_layer = int(inf["name"].split(".")[1]) if layered else -1
        want_kind = lenum.index(b) if layered else genum.index(b) if b in genum else -99
        if (inf["layer"], inf["kind"]) != (want_layer, want_kind) or \
                inf["numel"] != math.prod(inf["shape"]) or \
                inf["decay"] != (1 if b in torch_ref.DECAY else 0):
            bad.append(inf)
    expect("layer, kind, numel and decay fields", not bad, str(bad[:3]))
    spans = sorted((inf["offset"], inf["offset"] + inf["numel"]) for inf in infos)
    ordered = [inf["offset"] for inf in infos] == [s0 for s0, _ in spans]
    overlap = any(spans[k][1] > spans[k + 1][0] for k in range(len(spans) - 1))
    expect("offsets increase in table order, tensors disjoint, inside the arena",
           ordered and not overlap and spans[-1][1] <= lm.n,
           f"num_params {lm.n}, last end {spans[-1][1]}")
    total = sum(e - s0 for s0, e in spans)
    expect("num_params = sum of tensor sizes", total == lm.n, f"{total} vs {lm.n}")
    # lookups by enum
    ok = True
    for k, (n, fls) in enumerate(torch_ref.GLOBAL_ENUM):
        g = lm.as_dict(LIB.loom_model_global(lm.ptr, k))
        ok &= (g is None) if fl not in fls else (g is not None and g["name"] == n)
    for l in range(cfg["n_layer"]):
        off, cnt = ctypes.c_size_t(), ctypes.c_size_t()
        LIB.loom_model_layer_range(lm.ptr, l, ctypes.byref(off), ctypes.byref(cnt))
        mine = [inf for inf in infos if inf["layer"] == l]
        ok &= off.value == mine[0]["offset"] and \
            off.value + cnt.value == mine[-1]["offset"] + mine[-1]["numel"] and \
            cnt.value == sum(inf["numel"] for inf in mine)
        for k, (n, fls) in enumerate(torch_ref.LAYER_ENUM):
            t = lm.as_dict(LIB.loom_model_layer_tensor(lm.ptr, l, k))
            ok &= (t is None) if fl not in fls else (
                t is not None and t["name"] == f"layers.{l}.{n}")
    expect("loom_model_global / layer_tensor / layer_range agree with the table", ok)


def check_init(cfg):
    print(" init")
    a = LoomModel(cfg, 1, 8)
    b = LoomModel(cfg, 1, 8)
    try:
        LIB.loom_model_init_weights(a.ptr, 7)
        LIB.loom_model_init_weights(b.ptr, 7)
        expect("same seed -> identical bytes", a.params.tobytes() == b.params.tobytes())
        LIB.loom_model_init_weights(b.ptr, 8)
        tens = a.tensors()
        qa = a.view(a.params, tens["layers.0.q_w"])
        qb = b.view(b.params, tens["layers.0.q_w"])
        expect("other seed -> different weights", float(np.abs(qa - qb).mean()) > 1e-3)
        std = cfg["init_std"]
        L = cfg["n_layer"]
        llama = cfg["flavor"] == torch_ref.FLAVOR_LLAMA
        by_base = {}  # statistics over all layers of a kind
        for name, inf in tens.items():
            by_base.setdefault(torch_ref.base_name(name), []).append(
                a.view(a.params, inf).astype(np.float64).ravel())
        for b_name, parts in by_base.items():
            w = np.concatenate(parts)
            if b_name.endswith("_b"):
                expect(f"{b_name} = 0", bool(np.all(w == 0)))
            elif b_name in torch_ref.NORM_WEIGHTS:
                expect(f"{b_name} = 1", bool(np.all(w == 1)))
            else:
                want = [std]
                if b_name in ("attn_proj_w", "fc_proj_w"):
                    # gpt2: scaled by 1/sqrt(2L) (model.h); llama: either scheme is accepted
                    want = [std / math.sqrt(2 * L)] + ([std] if llama else [])
                sd, mu = float(w.std()), float(w.mean())
                ok = any(abs(sd / t - 1) < 0.05 for t in want) and \
                    abs(mu) < 4 * sd / math.sqrt(w.size)
                expect(f"{b_name} ~ N(0, {' or '.join(f'{t:.4f}' for t in want)})", ok,
                       f"std {sd:.5f} mean {mu:+.2e} over {w.size}")
        # tensors are keyed by name: different tensors must not repeat the same stream
        wte = a.view(a.params, tens["wte"]).ravel()
        fc = a.view(a.params, tens["layers.0.fc_w" if not llama else "layers.0.up_w"]).ravel()
        k = min(wte.size, fc.size)
        corr = float(np.corrcoef(wte[:k], fc[:k])[0, 1])
        kw = a.view(a.params, tens["layers.0.k_w"]).ravel()
        k2 = min(kw.size, qa.size)
        c2 = float(np.corrcoef(kw[:k2], qa.ravel()[:k2])[0, 1])
        expect("q_w and k_w drawn from different streams", abs(c2) < 0.1, f"corr {c2:+.3f}")
        expect("wte and layers.0.fc_w/up_w drawn from different streams", abs(corr) < 0.1,
               f"corr {corr:+.3f}")
        q1 = a.view(a.params, tens["layers.1.q_w"]).ravel()
        corr = float(np.corrcoef(qa.ravel(), q1)[0, 1])
        expect("layers drawn independently", abs(corr) < 0.1, f"corr {corr:+.3f}")
    finally:
        a.free()
        b.free()


def check_forward_backward(cfg, seed):
    B, T = 3, 17
    Tmax = cfg["max_seq_len"]
    lm = LoomModel(cfg, B, Tmax)
    try:
        check_layout(lm, cfg)
        LIB.loom_model_init_weights(lm.ptr, seed)
        ref = torch_ref.Ref(cfg, dtype=torch.float64)
        to_torch(lm, ref)
        rng = np.random.default_rng(seed)
        V = cfg["vocab_size"]

        print(" forward")
        # (B, T) < (B, Tmax) created, then the full length with a smaller batch
        for b, t in ((B, T), (2, Tmax)):
            x, y = make_tokens(rng, b, t, V), make_tokens(rng, b, t, V)
            y[0, :3] = -1
            y[b - 1, t - 1] = -1
            loss, logits = lm.forward(x, y)
            with torch.no_grad():
                rlogits, rloss = ref(torch.from_numpy(x), torch.from_numpy(y))
            check(f"logits B={b} T={t}", rel_max(logits, rlogits.numpy()), TOL_LOGITS)
            check(f"loss   B={b} T={t} ({loss:.6f} vs {rloss.item():.6f})",
                  abs(loss - rloss.item()) / abs(rloss.item()), TOL_LOSS)
            valid = int((y >= 0).sum())
            expect(f"valid_targets = {valid}", LIB.loom_model_valid_targets(lm.ptr) == valid,
                   str(LIB.loom_model_valid_targets(lm.ptr)))

        # without targets: returns 0, same logits
        loss0, logits0 = lm.forward(x, None)
        expect("forward without targets returns 0 and the same logits",
               loss0 == 0.0 and rel_max(logits0, logits) <= 1e-6, f"loss {loss0}")

        # next_logits: last position of a single sequence of n tokens
        n = 11
        toks = np.ascontiguousarray(make_tokens(rng, 1, n, V)[0], dtype=np.int32)
        p = LIB.loom_model_next_logits(lm.ptr, toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                       n)
        nl = np.ctypeslib.as_array(p, shape=(V,)).copy()
        with torch.no_grad():
            rl, _ = ref(torch.from_numpy(toks.astype(np.int64))[None])
        check(f"next_logits n={n}", rel_max(nl, rl[0, -1].numpy()), TOL_LOGITS)

        print(" backward")
        x, y = make_tokens(rng, B, T, V), make_tokens(rng, B, T, V)
        y[1, 5:9] = -1
        lm.grads[:] = 1.0  # garbage that zero_grad must clear
        LIB.loom_model_zero_grad(lm.ptr)
        expect("zero_grad zeroes the gradient arena", not np.any(lm.grads))
        loss, _ = lm.forward(x, y)
        valid = LIB.loom_model_valid_targets(lm.ptr)
        LIB.loom_model_backward(lm.ptr, 1.0 / valid)
        ref.zero_grad(set_to_none=True)
        _, rloss = ref(torch.from_numpy(x), torch.from_numpy(y))
        rloss.backward()
        check(f"loss before backward ({loss:.6f})", abs(loss - rloss.item()) / rloss.item(),
              TOL_LOSS)
        tens = lm.tensors()
        for name in ref.names:
            g = lm.view(lm.grads, tens[name])
            rg = ref.get_parameter(name).grad.numpy()
            if name.endswith(".k_b"):
                # the key bias's gradient is 0 analytically (q.(k + b) shifts every score of a
                # query row by the same amount, and softmax ignores that): loom's rounding
                # noise is measured against the scale of the layer's q_b and v_b gradients
                # (what the fused qkv_b of the earlier layout was normalized by)
                pre = name[:-len("k_b")]
                s = max(np.abs(ref.get_parameter(pre + b).grad.numpy()).max() for b in ("q_b", "v_b"))
                check(f"grad {name:20s} max|d| / max|q_b, v_b grad| {s:.2e}",
                      float(np.abs(g - rg).max() / s), TOL_GRAD)
                continue
            check(f"grad {name:20s} max|ref| {np.abs(rg).max():.2e}", rel_max(g, rg), TOL_GRAD)
        # backward accumulates: a second forward/backward doubles the gradients
        g1 = lm.grads.copy()
        lm.forward(x, y)
        LIB.loom_model_backward(lm.ptr, 1.0 / valid)
        check("backward accumulates (grads after 2 passes = 2x)", rel_max(lm.grads, 2 * g1),
              1e-6)

        flops = LIB.loom_model_flops_per_token(lm.ptr, T)
        expect("flops_per_token >= 6 * N_nonembedding", flops >= 6 * (
            lm.n - tens["wte"]["numel"] - tens.get("wpe", {"numel": 0})["numel"]),
            f"{flops:.4g}")
        want = torch_ref.train_flops_per_token(cfg, T)
        expect("flops_per_token == torch_ref.train_flops_per_token (the bench's count)",
               abs(flops - want) <= 1e-9 * want, f"{flops:.6g} vs {want:.6g}")
    finally:
        lm.free()


def check_bad_configs():
    print("config validation")
    base = dict(flavor="llama", vocab_size=97, max_seq_len=32, n_layer=2, n_head=4, n_kv_head=2,
                d_model=64, d_ff=96)
    bad = [("d_model % n_head != 0", dict(d_model=66)),
           ("n_head % n_kv_head != 0", dict(n_kv_head=3)),
           ("vocab_size = 0", dict(vocab_size=0)),
           ("n_layer = 0", dict(n_layer=0)),
           ("T > max_seq_len", None)]
    for what, change in bad:
        c = torch_ref.normalize_config(base)
        T = 16
        if change is None:
            T = 33
        else:
            c.update(change)
        mc = ModelConfig(c["flavor"], c["vocab_size"], c["max_seq_len"], c["n_layer"],
                         c["n_head"], c["n_kv_head"], c["d_model"], c["d_ff"], c["norm_eps"],
                         c["rope_theta"], c["init_std"])
        ptr, err = ctypes.c_void_p(), Err()
        rc = LIB.loom_model_create(ctypes.byref(mc), None, 2, T, ctypes.byref(ptr), ctypes.byref(err))
        expect(f"rejects {what}", rc == -1 and len(err.msg) > 0, err.msg.decode(errors="replace"))
        if rc == 0:
            LIB.loom_model_free(ptr)


CONFIGS = {
    "gpt2": dict(flavor="gpt2", vocab_size=97, max_seq_len=32, n_layer=2, n_head=4, d_model=64,
                 d_ff=256, norm_eps=1e-5, init_std=0.02),
    "llama": dict(flavor="llama", vocab_size=256, max_seq_len=32, n_layer=2, n_head=4,
                  n_kv_head=2, d_model=64, d_ff=96, norm_eps=1e-5, rope_theta=10000.0,
                  init_std=0.02),
}
# model.attention: the configs above run flash (the default, 0); the materialized sdpa (1) too
CONFIGS.update({f"{k} sdpa": dict(v, attention=1) for k, v in list(CONFIGS.items())})


GEMMA_YAML = """model:
  flavor: llama
  vocab_size: 67
  d_model: 48
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  d_ff: 40
  max_seq_len: 16
  norm_eps: 1e-6
  rope_theta: 10000
  arch:
    norm_place: sandwich
    mlp: geglu
    qk_norm: head
    head_dim: 16
    tied: true
    embed_scale: true
    norm_offset: true
    final_softcap: 3.0
"""


GEMMA_ATTN_YAML = GEMMA_YAML + """    sliding_window: 4
    window_period: 2
    rope_local_theta: 100
    attn_softcap: 2.0
    query_pre_attn_scalar: 24
"""


def gemma_ref(P, ids, C, H, KVH, D, eps, cap, theta, window=0, period=0, local_theta=0.0,
              attn_cap=0.0, qpas=0.0):
    """Gemma-style decoder in float64 from loom's parameters P (name -> tensor); norm weights
    enter as 1 + w with w = P[name] - 1 (the leaf the gradient is taken of). With a window,
    layer l slides when period <= 1 or l % period != period - 1 (keys q - window < k <= q, and
    RoPE at local_theta when it is set); scores scaled by qpas^-0.5 (else D^-0.5) and
    soft-capped by attn_cap before the mask"""
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)
    B, T = ids.shape
    scale = torch.tensor(C ** 0.5, dtype=torch.float32).double()  # Gemma's float32 normalizer
    x = P["wte"][ids] * scale
    def tables(base):
        inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(t, cs):  # (B, heads, T, D), rotate half
        a, b = t[..., :D // 2], t[..., D // 2:]
        return t * cs[0] + torch.cat([-b, a], -1) * cs[1]
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    back = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    for l in range(2):
        p = lambda n: P[f"layers.{l}.{n}"]  # noqa: E731
        slides = window > 0 and (period <= 1 or l % period != period - 1)
        mask = causal.masked_fill(back >= window, float("-inf")) if slides else causal
        cs = tables(local_theta if slides and local_theta > 0 else theta)
        h = rms(x, p("ln1_w"))
        q = (h @ p("q_w").T).view(B, T, H, D)
        k = (h @ p("k_w").T).view(B, T, KVH, D)
        v = (h @ p("v_w").T).view(B, T, KVH, D).transpose(1, 2)
        q = rope(rms(q, p("q_norm_w")).transpose(1, 2), cs)
        k = rope(rms(k, p("k_norm_w")).transpose(1, 2), cs)
        k, v = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
        sc = q @ k.transpose(-1, -2) * (qpas ** -0.5 if qpas > 0 else 1.0 / math.sqrt(D))
        if attn_cap > 0:
            sc = attn_cap * torch.tanh(sc / attn_cap)
        a = torch.softmax(sc + mask, -1) @ v
        o = a.transpose(1, 2).reshape(B, T, H * D) @ p("attn_proj_w").T
        x = x + rms(o, p("attn_post_w"))
        h = rms(x, p("ln2_w"))
        f = torch.nn.functional.gelu(h @ p("gate_w").T, approximate="tanh") * (h @ p("up_w").T)
        x = x + rms(f @ p("fc_proj_w").T, p("ffn_post_w"))
    logits = rms(x, P["lnf_w"]) @ P["wte"].T
    return cap * torch.tanh(logits / cap)


def check_gemma_features(yaml=GEMMA_YAML, tag="gemma features", attn={}):
    print(f"== {tag} (sandwich norms, geglu, embed_scale, final_softcap, norm_offset"
          f"{', ' + ', '.join(f'{k} {v}' for k, v in attn.items()) if attn else ''})")
    P_ = ctypes.c_void_p
    err = Err()
    LIB.loom_config_new.restype = P_
    LIB.loom_config_load_string.argtypes = [P_, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Err)]
    LIB.loom_config_apply_schema.argtypes = [P_, P_, ctypes.c_int, ctypes.POINTER(Err)]
    LIB.loom_model_config_from.argtypes = [P_, ctypes.c_int, P_, ctypes.POINTER(Err)]
    LIB.loom_config_free.argtypes = [P_]
    cfg = LIB.loom_config_new()
    keys = ctypes.cast(LIB.loom_model_config_keys, P_)
    nkeys = ctypes.c_int.in_dll(LIB, "loom_model_config_nkeys").value
    mc = ctypes.create_string_buffer(4096)  # a loom_model_config, read only by libloom
    assert LIB.loom_config_load_string(cfg, yaml.encode(), b"gemma", ctypes.byref(err)) == 0, err.msg
    assert LIB.loom_config_apply_schema(cfg, keys, nkeys, ctypes.byref(err)) == 0, err.msg
    assert LIB.loom_model_config_from(cfg, 16, mc, ctypes.byref(err)) == 0, err.msg
    LIB.loom_config_free(cfg)
    B, T, V, C, H, KVH, D = 2, 11, 67, 48, 4, 2, 16
    m = ctypes.c_void_p()
    LIB.loom_model_create.argtypes = [P_, P_, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P_),
                                      ctypes.POINTER(Err)]
    assert LIB.loom_model_create(mc, None, B, T, ctypes.byref(m), ctypes.byref(err)) == 0, err.msg
    n = LIB.loom_model_num_params(m)
    rng = np.random.default_rng(21)
    params = np.ctypeslib.as_array(LIB.loom_model_params(m), shape=(n,))
    names = {}
    for i in range(LIB.loom_model_num_tensors(m)):
        t = LIB.loom_model_tensor(m, i).contents
        shape = tuple(t.shape[d] for d in range(t.ndim))
        names[t.name.decode()] = (t.offset, t.numel, shape)
    expect("the tensors of sandwich norms, GeGLU, q/k head norms, tied",
           {"layers.0.attn_post_w", "layers.0.ffn_post_w", "layers.0.ln2_w", "layers.0.gate_w",
            "layers.0.q_norm_w"} <= set(names) and "lm_head" not in names, str(sorted(names)))
    for name, (off, cnt, shape) in names.items():  # norms around 1 (w around 0), the rest 0.3
        base = 1.0 if name.endswith(("ln1_w", "ln2_w", "_post_w", "norm_w", "lnf_w")) else 0.0
        params[off:off + cnt] = base + 0.3 * rng.standard_normal(cnt)
    ids = rng.integers(0, V, size=(B, T + 1))
    x = np.ascontiguousarray(ids[:, :-1], dtype=np.int32)
    y = np.ascontiguousarray(ids[:, 1:], dtype=np.int32)
    ip = ctypes.POINTER(ctypes.c_int32)
    LIB.loom_model_zero_grad(m)
    loss = LIB.loom_model_forward(m, x.ctypes.data_as(ip), y.ctypes.data_as(ip), B, T)
    logits = np.ctypeslib.as_array(LIB.loom_model_logits(m), shape=(B * T * V,)).copy()
    LIB.loom_model_backward(m, 1.0 / (B * T))
    grads = np.ctypeslib.as_array(LIB.loom_model_grads(m), shape=(n,))
    P = {}
    for name, (off, cnt, shape) in names.items():
        w = torch.tensor(params[off:off + cnt].astype(np.float64).reshape(shape))
        norm = name.endswith(("ln1_w", "ln2_w", "_post_w", "norm_w", "lnf_w"))
        # under norm_offset the Hugging Face weight of a norm is w = loom's - 1 (rms adds 1)
        P[name] = (w - 1.0 if norm else w).requires_grad_(True)
    ref = gemma_ref(P, torch.tensor(ids[:, :-1]), C, H, KVH, D, 1e-6, 3.0, 10000.0,
                    **{k: v for k, v in attn.items() if k != "attention"})
    rl = torch.nn.functional.cross_entropy(ref.reshape(-1, V), torch.tensor(ids[:, 1:]).reshape(-1))
    rl.backward()
    check(f"{tag}: logits (soft-capped) vs reference", rel_max(logits, ref.detach().reshape(-1)), TOL_LOGITS)
    expect(f"{tag}: the cap bends the logits (max |logit| near 3)",
           2.0 < float(np.abs(logits).max()) < 3.0, f"{np.abs(logits).max():.3f}")
    check(f"{tag}: loss vs reference", abs(loss - rl.item()) / rl.item(), TOL_LOSS)
    worst = max((rel_max(grads[off:off + cnt].reshape(shape), P[nm].grad), nm)
                for nm, (off, cnt, shape) in names.items())
    check(f"{tag}: every gradient vs autograd (worst {worst[1]})", worst[0], TOL_GRAD)
    if attn:  # the attention features move the logits (the checks above see them)
        plain = gemma_ref(P, torch.tensor(ids[:, :-1]), C, H, KVH, D, 1e-6, 3.0, 10000.0)
        moved = rel_max(logits, plain.detach().reshape(-1))
        expect(f"{tag}: without them the reference's logits differ", moved > 1e-2, f"{moved:.2e}")
    LIB.loom_model_free(m)


def main():
    torch.set_num_threads(2)
    for name, cfg in CONFIGS.items():
        cfg = torch_ref.normalize_config(cfg)
        print(f"== {name}: {cfg}")
        check_init(cfg)
        check_forward_backward(cfg, seed=1234)
    check_bad_configs()
    check_gemma_features()
    attn = dict(window=4, period=2, local_theta=100.0, attn_cap=2.0, qpas=24.0)
    check_gemma_features(GEMMA_ATTN_YAML, "gemma attention features (flash)", attn)
    check_gemma_features(GEMMA_ATTN_YAML.replace("model:\n", "model:\n  attention: sdpa\n"),
                         "gemma attention features (sdpa)", dict(attn, attention="sdpa"))
    return finish("all model reference checks passed")


if __name__ == "__main__":
    sys.exit(main())
