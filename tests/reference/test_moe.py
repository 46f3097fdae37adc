"""Mixture-of-experts reference test: loom's MoE decoder (libloom.so through ctypes, fp32)
against a PyTorch MoE layer (float64) on the same weights and tokens.

The reference below is written from docs/moe.md, independently of src/model/moe.c: softmax
router, top-k (k most probable), tokens grouped per expert (one F.linear per expert and
linear), capacity per routing group of group_tokens tokens, floor(capacity_factor * k * G / E)
assignments per expert, first choices first, then in token order (dropped assignments add
nothing), shared experts, and the objective backward differentiates:
    (sum of token cross-entropies + aux_coef * sum_groups G * E * sum_e f_e P_e
     + z_coef * sum_tokens logsumexp(router logits)^2) / valid targets.

Checked for both flavors, dropless and with a capacity factor (training arena) and on the
inference paths (an inference forward and KV-cache decoding, both dropless): logits, loss,
every parameter gradient (the router's included), and the routing statistics
(loom_model_moe_stats: assignments per expert, dropped). Edge cases: an expert that receives
no token, all tokens routed to one expert, capacity 0 (every routed assignment dropped: the
layer adds only the shared experts) against a small capacity.

Tolerances as tests/reference/test_model.py (errors normalized by the reference's max
magnitude): logits 1e-5, loss 1e-6, gradients 2e-5.
"""
import ctypes
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_model as tm  # noqa: E402
import torch_ref  # noqa: E402
from loomlib import check, expect, finish, rel_max  # noqa: E402

TOL_LOGITS, TOL_LOSS, TOL_GRAD = 1e-5, 1e-6, 2e-5
LIB = tm.LIB


class MoeStats(ctypes.Structure):
    _fields_ = [("n_layers", ctypes.c_int), ("n_expert", ctypes.c_int),
                ("layer", ctypes.POINTER(ctypes.c_int)),
                ("load", ctypes.POINTER(ctypes.c_int64)),
                ("dropped", ctypes.POINTER(ctypes.c_int64)),
                ("assigned", ctypes.POINTER(ctypes.c_int64)),
                ("aux_sum", ctypes.POINTER(ctypes.c_double)),
                ("z_sum", ctypes.POINTER(ctypes.c_double)),
                ("tokens", ctypes.POINTER(ctypes.c_double))]


_P = ctypes.c_void_p
for name, res, args in (("loom_model_moe_stats", ctypes.POINTER(MoeStats), [_P]),
                        ("loom_model_moe_stats_reset", None, [_P]),
                        ("loom_model_layer_is_moe", ctypes.c_int, [_P, ctypes.c_int]),
                        ("loom_kv_cache_create", _P, [_P]),
                        ("loom_kv_cache_free", None, [_P]),
                        ("loom_model_decode", ctypes.POINTER(ctypes.c_float),
                         [_P, _P, ctypes.c_int32])):
    fn = getattr(LIB, name)
    fn.restype, fn.argtypes = res, args


def create(cfg, B, T):
    c = cfg
    mc = tm.ModelConfig(c["flavor"], c["vocab_size"], c["max_seq_len"], c["n_layer"], c["n_head"],
                        c["n_kv_head"], c["d_model"], c["d_ff"], c["norm_eps"], c["rope_theta"],
                        c["init_std"], n_expert=c["experts"], top_k=c["top_k"],
                        moe_every=c["every"], shared_experts=c["shared"],
                        group_tokens=c["group"], capacity_factor=c["cf"],
                        aux_loss_coef=c["aux"], z_loss_coef=c["z"])
    ptr, err = ctypes.c_void_p(), tm.Err()
    if LIB.loom_model_create(ctypes.byref(mc), None, B, T, ctypes.byref(ptr), ctypes.byref(err)):
        raise RuntimeError("loom_model_create: " + err.msg.decode(errors="replace"))
    lm = tm.LoomModel.__new__(tm.LoomModel)
    lm.cfg, lm.ptr, lm.V = c, ptr, c["vocab_size"]
    lm.n = LIB.loom_model_num_params(ptr)
    lm.params = np.ctypeslib.as_array(LIB.loom_model_params(ptr), shape=(lm.n,))
    lm.grads = np.ctypeslib.as_array(LIB.loom_model_grads(ptr), shape=(lm.n,))
    return lm


def stats(lm):
    s = LIB.loom_model_moe_stats(lm.ptr).contents
    E = s.n_expert
    return {s.layer[i]: {"load": [s.load[i * E + e] for e in range(E)], "dropped": s.dropped[i],
                         "assigned": s.assigned[i], "aux": s.aux_sum[i] / max(s.tokens[i], 1)}
            for i in range(s.n_layers)}


# ---- the reference ----------------------------------------------------------------------------
def expert(x, w1, b1, w2, b2, llama, Fd):
    h = F.linear(x, w1, b1)
    if llama:
        gate, up = h.split(Fd, dim=-1)
        a = F.silu(gate) * up
    else:
        a = F.gelu(h, approximate="tanh")
    return F.linear(a, w2, b2)


def moe_layer(x, P, pre, c, capped, acc):
    """x (N, C) -> (N, C); adds the router losses' terms and the routing to acc."""
    N, C = x.shape
    E, K, llama, Fd = c["experts"], c["top_k"], c["flavor"] == 1, c["d_ff"]
    if c.get("router_fp32"):  # loom's bf16 router: bf16 rows and weights, fp32 products
        with torch.autocast("cpu", enabled=False):
            logits = x.bfloat16().float() @ P[pre + "moe_router_w"].bfloat16().float().T
    else:
        logits = x @ P[pre + "moe_router_w"].T
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    choice = torch.topk(p.detach(), K, dim=-1).indices  # (N, K), best first
    keep = torch.ones(N, K, dtype=torch.bool)
    G = c["group"] or c["T"]
    aux = x.new_zeros(())
    load = [0] * E
    dropped = 0
    for g0 in range(0, N, G):
        g1 = min(g0 + G, N)
        Gg = g1 - g0
        cap = math.floor(c["cf"] * K * Gg / E) if capped and c["cf"] > 0 else 1 << 60
        fill = [0] * E
        count = [0] * E
        for j in range(K):
            for t in range(g0, g1):
                e = int(choice[t, j])
                count[e] += 1
                if fill[e] < cap:
                    fill[e] += 1
                else:
                    keep[t, j] = False
                    dropped += 1
        f = torch.tensor(count, dtype=x.dtype) / (Gg * K)
        aux = aux + Gg * E * (f * p[g0:g1].mean(dim=0)).sum()
        load = [a + b for a, b in zip(load, count)]
    y = torch.zeros_like(x)
    for e in range(E):
        rows = [(t, j) for t in range(N) for j in range(K) if int(choice[t, j]) == e and keep[t, j]]
        if not rows:
            continue
        idx = torch.tensor([t for t, _ in rows])
        sel = torch.tensor([j for _, j in rows])
        ye = expert(x[idx], P[pre + "moe_fc_w"][e], None if llama else P[pre + "moe_fc_b"][e],
                    P[pre + "moe_proj_w"][e], None if llama else P[pre + "moe_proj_b"][e],
                    llama, Fd)
        w = p[idx, choice[idx, sel]]
        y = y.index_add(0, idx, w[:, None] * ye)
    for s in range(c["shared"]):
        y = y + expert(x, P[pre + "moe_shared_fc_w"][s],
                       None if llama else P[pre + "moe_shared_fc_b"][s],
                       P[pre + "moe_shared_proj_w"][s],
                       None if llama else P[pre + "moe_shared_proj_b"][s], llama, Fd)
    acc["extra"] = acc["extra"] + c["aux"] * aux + c["z"] * (lse ** 2).sum()
    acc["routing"].append({"load": load, "dropped": dropped})
    return y


def ref_forward(P, c, idx, targets, capped):
    """logits, CE mean, the objective backward differentiates, and each MoE layer's routing"""
    B, T = idx.shape
    H, KVH, C = c["n_head"], c["n_kv_head"], c["d_model"]
    D = C // H
    llama = c["flavor"] == 1
    cc = dict(c, T=T)
    acc = {"extra": torch.zeros((), dtype=torch.float64), "routing": []}

    def norm(x, w, b):
        if llama:
            return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + c["norm_eps"]) * w
        return F.layer_norm(x, (C,), w, b, c["norm_eps"])

    x = F.embedding(idx, P["wte"])
    if llama:
        cos, sin = torch_ref.rope_cos_sin(T, D, c["rope_theta"], x.dtype)
    else:
        x = x + P["wpe"][:T]
    for l in range(c["n_layer"]):
        pre = f"layers.{l}."
        g = lambda n: P.get(pre + n)  # noqa: E731
        h = norm(x, g("ln1_w"), g("ln1_b"))
        q = F.linear(h, g("q_w"), g("q_b")).view(B, T, H, D).transpose(1, 2)
        k = F.linear(h, g("k_w"), g("k_b")).view(B, T, KVH, D).transpose(1, 2)
        v = F.linear(h, g("v_w"), g("v_b")).view(B, T, KVH, D).transpose(1, 2)
        if llama:
            q, k = torch_ref.apply_rope(q, cos, sin), torch_ref.apply_rope(k, cos, sin)
        if KVH != H:
            k = k.repeat_interleave(H // KVH, dim=1)
            v = v.repeat_interleave(H // KVH, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D))
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, H * D), g("attn_proj_w"), g("attn_proj_b"))
        h = norm(x, g("ln2_w"), g("ln2_b"))
        if (l + 1) % c["every"] == 0:
            x = x + moe_layer(h.reshape(B * T, C), P, pre, cc, capped, acc).view(B, T, C)
        else:
            if llama:
                a = F.silu(F.linear(h, g("gate_w"))) * F.linear(h, g("up_w"))
            else:
                a = F.gelu(F.linear(h, g("fc_w"), g("fc_b")), approximate="tanh")
            x = x + F.linear(a, g("fc_proj_w"), g("fc_proj_b"))
    x = norm(x, P["lnf_w"], P.get("lnf_b"))
    logits = F.linear(x, P["lm_head"] if llama else P["wte"])
    if targets is None:
        return logits, None, None, acc["routing"]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    valid = int((targets >= 0).sum())
    return logits, loss, loss + acc["extra"] / valid, acc["routing"]


# ---- the checks -------------------------------------------------------------------------------
def params_of(lm):
    tens = lm.tensors()
    return {n: torch.from_numpy(lm.view(lm.params, inf).astype(np.float64)).requires_grad_(True)
            for n, inf in tens.items()}


def compare_routing(label, lm, routing):
    st = stats(lm)
    layers = sorted(st)
    ok = len(layers) == len(routing) and all(
        st[l]["load"] == r["load"] and st[l]["dropped"] == r["dropped"]
        for l, r in zip(layers, routing))
    expect(f"{label}: routing stats (load per expert, dropped) = the reference's", ok,
           f"loom {[(st[l]['load'], st[l]['dropped']) for l in layers]} ref "
           f"{[(r['load'], r['dropped']) for r in routing]}")
    return st


def run_case(label, cfg, B, T, seed, tweak=None, expect_fn=None):
    print(f"== {label}")
    c = dict(cfg)
    lm = create(c, B, c["max_seq_len"])
    try:
        LIB.loom_model_init_weights(lm.ptr, seed)
        if tweak:
            tweak(lm)
        P = params_of(lm)
        rng = np.random.default_rng(seed)
        x = rng.integers(0, c["vocab_size"], size=(B, T))
        y = rng.integers(0, c["vocab_size"], size=(B, T))
        y[0, :2] = -1
        LIB.loom_model_zero_grad(lm.ptr)
        LIB.loom_model_moe_stats_reset(lm.ptr)
        loss, logits = lm.forward(x, y)
        valid = LIB.loom_model_valid_targets(lm.ptr)
        LIB.loom_model_backward(lm.ptr, 1.0 / valid)
        rlogits, rloss, obj, routing = ref_forward(P, c, torch.from_numpy(x), torch.from_numpy(y),
                                                   capped=True)
        obj.backward()
        check(f"{label}: logits", rel_max(logits, rlogits.detach().numpy()), TOL_LOGITS)
        check(f"{label}: loss ({loss:.6f})", abs(loss - rloss.item()) / abs(rloss.item()), TOL_LOSS)
        st = compare_routing(label, lm, routing)
        tens = lm.tensors()
        worst = (0.0, "")
        for name, t in P.items():
            g = lm.view(lm.grads, tens[name])
            rg = t.grad.numpy() if t.grad is not None else np.zeros_like(g)
            if not np.any(rg) and not np.any(g):
                continue
            if name.endswith(".k_b"):
                continue  # analytically 0 (test_model.py explains); noise only
            e = rel_max(g, rg)
            if e > worst[0]:
                worst = (e, name)
            if e > TOL_GRAD:
                check(f"{label}: grad {name}", e, TOL_GRAD)
        check(f"{label}: every gradient (worst {worst[1]})", worst[0], TOL_GRAD)
        if expect_fn:
            expect_fn(st, lm, P)
        # the inference paths route dropless: KV-cache decoding against the dropless reference
        seq = x[0, :min(T, 9)]
        kc = LIB.loom_kv_cache_create(lm.ptr)
        got = None
        for tok in seq:
            got = np.ctypeslib.as_array(LIB.loom_model_decode(lm.ptr, kc, int(tok)),
                                        shape=(c["vocab_size"],)).copy()
        LIB.loom_kv_cache_free(kc)
        with torch.no_grad():
            rl, _, _, _ = ref_forward(P, c, torch.from_numpy(seq[None]), None, capped=False)
        check(f"{label}: decode (dropless) last logits", rel_max(got, rl[0, -1].numpy()), TOL_LOGITS)
    finally:
        lm.free()


BASE = {
    "llama": dict(flavor=1, vocab_size=64, max_seq_len=16, n_layer=2, n_head=4, n_kv_head=2,
                  d_model=32, d_ff=24, norm_eps=1e-5, rope_theta=10000.0, init_std=0.1),
    "gpt2": dict(flavor=0, vocab_size=64, max_seq_len=16, n_layer=2, n_head=4, n_kv_head=4,
                 d_model=32, d_ff=24, norm_eps=1e-5, rope_theta=10000.0, init_std=0.1),
}
MOE = dict(experts=8, top_k=2, every=1, shared=0, group=0, cf=0.0, aux=0.05, z=0.01)


def main():
    torch.set_num_threads(2)
    for fl, base in BASE.items():
        run_case(f"{fl} dropless", dict(base, **MOE), 3, 12, 11)
        run_case(f"{fl} capacity 1.0, groups of 8", dict(base, **dict(MOE, cf=1.0, group=8)),
                 3, 12, 12,
                 expect_fn=lambda st, lm, P: expect("some assignments dropped",
                                                    sum(v["dropped"] for v in st.values()) > 0))
        run_case(f"{fl} shared expert, every 2nd layer, top-1, capacity 1.25",
                 dict(base, **dict(MOE, shared=1, every=2, top_k=1, cf=1.25)), 2, 16, 13)
    llama = dict(BASE["llama"], **MOE)
    # an expert with no token: 6 tokens, top-1 of 8 experts
    run_case("expert without tokens (6 tokens, top-1 of 8)", dict(llama, top_k=1), 1, 6, 21,
             expect_fn=lambda st, lm, P: expect(
                 "an expert received no token", all(0 in v["load"] for v in st.values()),
                 str([v["load"] for v in st.values()])))

    # every token to expert 3: gpt2's ln2 output is ~ln2_b when ln2_w is tiny; router row 3
    # along ln2_b
    def one_expert(lm):
        tens = lm.tensors()
        for l in range(2):
            lm.view(lm.params, tens[f"layers.{l}.ln2_w"])[:] = 1e-3
            lm.view(lm.params, tens[f"layers.{l}.ln2_b"])[:] = 1.0
            r = lm.view(lm.params, tens[f"layers.{l}.moe_router_w"])
            r[:] *= 0.1
            r[3, :] = 0.5
    gpt2 = dict(BASE["gpt2"], **MOE)
    run_case("all tokens to expert 3 (dropless)", gpt2, 2, 12, 31, tweak=one_expert,
             expect_fn=lambda st, lm, P: expect(
                 "expert 3 got every token's first choice",
                 all(v["load"][3] == 24 for v in st.values()), str([v["load"] for v in st.values()])))
    run_case("all tokens to expert 3, capacity 1.0 (most dropped)", dict(gpt2, cf=1.0), 2, 12, 31,
             tweak=one_expert,
             expect_fn=lambda st, lm, P: expect(
                 "expert 3 kept its capacity (floor(1.0*2*12/8) = 3 per sequence), the rest dropped",
                 all(v["dropped"] >= 2 * (12 - 3) for v in st.values()),
                 str([v["dropped"] for v in st.values()])))
    # capacity 0 (floor(0.1 * 2 * 12 / 8) = 0): every routed assignment dropped; with a shared
    # expert the layer is the shared expert alone
    run_case("capacity 0 (every assignment dropped), shared expert", dict(llama, cf=0.1, shared=1),
             2, 12, 41, expect_fn=lambda st, lm, P: expect(
                 "every assignment dropped", all(v["dropped"] == v["assigned"] for v in st.values())))
    run_case("small capacity 0.5", dict(llama, cf=0.5), 2, 12, 41,
             expect_fn=lambda st, lm, P: expect(
                 "some but not all dropped",
                 all(0 < v["dropped"] < v["assigned"] for v in st.values())))

    # bad configs are refused with a message
    print("== config validation")
    for what, ch in (("top_k > experts", dict(top_k=9)), ("negative capacity", dict(cf=-1.0)),
                     ("top_k 0", dict(top_k=0))):
        try:
            lm = create(dict(llama, **ch), 1, 16)
            lm.free()
            expect(f"refuses {what}", False)
        except RuntimeError as e:
            expect(f"refuses {what}: {e}", "moe" in str(e))
    return finish("all MoE reference checks passed")


if __name__ == "__main__":
    sys.exit(main())
