"""PyTorch reference of loom's decoder, in loom's exact parameter layout.

Parameter names, order and shapes follow include/loom/model.h: the arena is layer-major,
global tensors wte, wpe (gpt2), then per layer `layers.<l>.<name>` (ln1_w, ln1_b, q_w, ...
in LOOM_L_* order), then lnf_w, lnf_b (gpt2), lm_head (llama). Ref.tensor_names() lists them
in that order and Ref.get_parameter(name) finds each, so a loom parameter arena maps onto
this module tensor by tensor. The module is dtype-agnostic: build it in float64 for
reference checks and in float32 for the throughput benchmark.

GPT-2 flavor: LayerNorm (with bias), learned positions (wpe), GELU (tanh), biases on every
linear, tied head (logits = x @ wte^T).
Llama flavor: RMSNorm (x * rsqrt(mean(x^2) + eps) * w), RoPE (rotate-half, pairs i and
i + D/2, inv_freq = theta^(-2i/D)), SwiGLU (silu(gate_w x) * up_w x), grouped-query
attention (query head h reads kv head h // (H / KVH)), no biases, untied lm_head.
Separate q_w (H*D, C), k_w (KVH*D, C), v_w (KVH*D, C) (gpt2 also q_b, k_b, v_b).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

FLAVOR_GPT2 = 0
FLAVOR_LLAMA = 1
G, LL = (FLAVOR_GPT2,), (FLAVOR_LLAMA,)
BOTH = (FLAVOR_GPT2, FLAVOR_LLAMA)

# LOOM_P_* (global) and LOOM_L_* (per layer) enums: (name, flavors it exists in), enum order.
GLOBAL_ENUM = [("wte", BOTH), ("wpe", G), ("lnf_w", BOTH), ("lnf_b", G), ("lm_head", LL)]
LAYER_ENUM = [("ln1_w", BOTH), ("ln1_b", G), ("q_w", BOTH), ("k_w", BOTH), ("v_w", BOTH),
              ("q_b", G), ("k_b", G), ("v_b", G),
              ("attn_proj_w", BOTH), ("attn_proj_b", G), ("ln2_w", BOTH), ("ln2_b", G),
              ("fc_w", G), ("gate_w", LL), ("up_w", LL), ("fc_b", G), ("fc_proj_w", BOTH),
              ("fc_proj_b", G)]

# Tensors AdamW decays (matrices and embeddings); norms and biases are not decayed.
DECAY = {"wte", "wpe", "q_w", "k_w", "v_w", "attn_proj_w", "fc_w", "gate_w", "up_w",
         "fc_proj_w", "lm_head"}
NORM_WEIGHTS = {"ln1_w", "ln2_w", "lnf_w"}

DEFAULTS = {
    "flavor": FLAVOR_GPT2, "vocab_size": 256, "max_seq_len": 256, "n_layer": 4, "n_head": 4,
    "n_kv_head": 0, "d_model": 256, "d_ff": 0, "norm_eps": 1e-5, "rope_theta": 10000.0,
    "init_std": 0.02,
}


def base_name(name):
    """'layers.3.q_w' -> 'q_w'; 'wte' -> 'wte'."""
    return name.rsplit(".", 1)[-1]


def normalize_config(cfg):
    """Fills defaults (n_kv_head = n_head, d_ff = 4C); accepts 'gpt2'/'llama' flavors."""
    c = dict(DEFAULTS)
    c.update({k: v for k, v in cfg.items() if v is not None})
    if isinstance(c["flavor"], str):
        c["flavor"] = {"gpt2": FLAVOR_GPT2, "llama": FLAVOR_LLAMA}[c["flavor"]]
    if not c["n_kv_head"] or c["flavor"] == FLAVOR_GPT2:
        c["n_kv_head"] = c["n_head"]
    if not c["d_ff"]:
        c["d_ff"] = 4 * c["d_model"]
    assert c["d_model"] % c["n_head"] == 0 and c["n_head"] % c["n_kv_head"] == 0
    return c


def _shapes(c):
    V, T, H, KVH, C, Fd = (c["vocab_size"], c["max_seq_len"], c["n_head"], c["n_kv_head"],
                           c["d_model"], c["d_ff"])
    D = C // H
    glob = {"wte": (V, C), "wpe": (T, C), "lnf_w": (C,), "lnf_b": (C,), "lm_head": (V, C)}
    layer = {"ln1_w": (C,), "ln1_b": (C,), "q_w": (H * D, C), "k_w": (KVH * D, C),
             "v_w": (KVH * D, C), "q_b": (H * D,), "k_b": (KVH * D,), "v_b": (KVH * D,),
             "attn_proj_w": (C, H * D), "attn_proj_b": (C,),
             "ln2_w": (C,), "ln2_b": (C,), "fc_w": (Fd, C), "gate_w": (Fd, C), "up_w": (Fd, C),
             "fc_b": (Fd,), "fc_proj_w": (C, Fd), "fc_proj_b": (C,)}
    return glob, layer


def param_shapes(cfg):
    """[(full name, shape)] in arena order for the tensors this flavor has."""
    c = normalize_config(cfg)
    glob, layer = _shapes(c)
    fl = c["flavor"]
    out = [(n, glob[n]) for n in ("wte", "wpe") if fl in dict(GLOBAL_ENUM)[n]]
    for l in range(c["n_layer"]):
        out += [(f"layers.{l}.{n}", layer[n]) for n, f in LAYER_ENUM if fl in f]
    out += [(n, glob[n]) for n in ("lnf_w", "lnf_b", "lm_head") if fl in dict(GLOBAL_ENUM)[n]]
    return out


def rope_cos_sin(T, D, theta, dtype, device=None):
    """(T, D) cos and sin tables for rotate-half RoPE, computed in float64 then cast."""
    inv_freq = theta ** (-torch.arange(0, D // 2, dtype=torch.float64, device=device) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # (T, D): pair i and i + D/2 share an angle
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x (B, h, T, D); out = x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    """One layer's parameters, named as loom names them (layers.<l>.<name>)."""

    def __init__(self, shapes, dtype, device):
        super().__init__()
        for name, shape in shapes:
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=dtype,
                                                                    device=device)))


class Ref(nn.Module):
    def __init__(self, cfg, dtype=torch.float64, device=None):
        super().__init__()
        self.cfg = c = normalize_config(cfg)
        shapes = param_shapes(c)
        self.names = [n for n, _ in shapes]  # arena order
        for name, shape in shapes:
            if not name.startswith("layers."):
                self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=dtype,
                                                                        device=device)))
        self.layers = nn.ModuleList([
            Block([(base_name(n), s) for n, s in shapes if n.startswith(f"layers.{l}.")],
                  dtype, device) for l in range(c["n_layer"])])
        self.init_weights()
        # LoRA (tests/reference/test_engine.py): {"layers.<l>.<target>.lora_A" / "_B": tensor},
        # loom's names (include/loom/lora.h), each adapted linear's output gaining
        # lora_scale * (x A^T) B^T in its target's columns; None: no adapters
        self.lora, self.lora_scale = None, 1.0

    def _lora(self, l, targets, widths, x, y):
        """y (the fused linear's output over x, its columns the targets' of `widths` in order)
        plus the adapters of layer l's targets (as PEFT adds them: lora_B(lora_A(x)) * scale)"""
        if not self.lora or not any(f"layers.{l}.{t}.lora_A" in self.lora for t in targets):
            return y
        parts = list(y.split(list(widths), dim=-1))
        for i, t in enumerate(targets):
            a = self.lora.get(f"layers.{l}.{t}.lora_A")
            if a is not None:
                b = self.lora[f"layers.{l}.{t}.lora_B"]
                parts[i] = parts[i] + F.linear(F.linear(x, a), b) * self.lora_scale
        return torch.cat(parts, dim=-1)

    @property
    def llama(self):
        return self.cfg["flavor"] == FLAVOR_LLAMA

    def tensor_names(self):
        """Full names in loom's arena order."""
        return list(self.names)

    def init_weights(self, seed=0):
        """loom's scheme with torch's RNG: N(0, init_std), GPT-2 residual projections scaled
        by 1/sqrt(2L), norm weights 1, biases 0. (Values differ from loom's counter RNG;
        tests copy loom's weights in instead.)"""
        g = torch.Generator().manual_seed(seed)
        std = self.cfg["init_std"]
        with torch.no_grad():
            for name in self.names:
                p, b = self.get_parameter(name), base_name(name)
                if b.endswith("_b"):
                    p.zero_()
                elif b in NORM_WEIGHTS:
                    p.fill_(1.0)
                else:
                    s = std
                    if not self.llama and b in ("attn_proj_w", "fc_proj_w"):
                        s = std / math.sqrt(2 * self.cfg["n_layer"])
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * s)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def param_groups(self, weight_decay):
        """AdamW groups: decay on matrices and embeddings only (loom's info->decay)."""
        dec = [self.get_parameter(n) for n in self.names if base_name(n) in DECAY]
        nodec = [self.get_parameter(n) for n in self.names if base_name(n) not in DECAY]
        return [{"params": dec, "weight_decay": weight_decay},
                {"params": nodec, "weight_decay": 0.0}]

    def _norm(self, x, w, b):
        eps = self.cfg["norm_eps"]
        if self.llama:
            return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    def forward(self, idx, targets=None):
        """idx (B, T) int64 -> logits (B, T, V), loss (mean CE over targets >= 0, or None)."""
        c = self.cfg
        B, T = idx.shape
        H, KVH, C = c["n_head"], c["n_kv_head"], c["d_model"]
        D = C // H
        assert T <= c["max_seq_len"]
        llama = self.llama
        x = F.embedding(idx, self.wte)
        if llama:
            cos, sin = rope_cos_sin(T, D, c["rope_theta"], x.dtype, x.device)
        else:
            x = x + self.wpe[:T]
        for li, blk in enumerate(self.layers):
            # attention
            h = self._norm(x, blk.ln1_w, None if llama else blk.ln1_b)
            # one GEMM over the concatenated weights (what a fused implementation runs; the
            # weights' copy is small next to the GEMM), split into q, k, v
            w = torch.cat((blk.q_w, blk.k_w, blk.v_w))
            b = None if llama else torch.cat((blk.q_b, blk.k_b, blk.v_b))
            qkv = self._lora(li, ("q", "k", "v"), (H * D, KVH * D, KVH * D), h, F.linear(h, w, b))
            q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
            q = q.view(B, T, H, D).transpose(1, 2)
            k = k.view(B, T, KVH, D).transpose(1, 2)
            v = v.view(B, T, KVH, D).transpose(1, 2)
            if llama:
                q = apply_rope(q, cos, sin)
                k = apply_rope(k, cos, sin)
            if KVH != H:  # query head h reads kv head h // (H / KVH)
                k = k.repeat_interleave(H // KVH, dim=1)
                v = v.repeat_interleave(H // KVH, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D))
            y = y.transpose(1, 2).reshape(B, T, H * D)
            x = x + self._lora(li, ("o",), (C,), y,
                               F.linear(y, blk.attn_proj_w, None if llama else blk.attn_proj_b))
            # feed-forward
            h = self._norm(x, blk.ln2_w, None if llama else blk.ln2_b)
            if llama:
                gu = self._lora(li, ("gate", "up"), (c["d_ff"], c["d_ff"]), h,
                                F.linear(h, torch.cat((blk.gate_w, blk.up_w))))
                gate, up = gu.split(c["d_ff"], dim=-1)
                h = F.silu(gate) * up
            else:
                h = F.gelu(self._lora(li, ("fc",), (c["d_ff"],), h, F.linear(h, blk.fc_w, blk.fc_b)),
                           approximate="tanh")
            x = x + self._lora(li, ("down" if llama else "fc_proj",), (C,), h,
                               F.linear(h, blk.fc_proj_w, None if llama else blk.fc_proj_b))
        x = self._norm(x, self.lnf_w, None if llama else self.lnf_b)
        logits = F.linear(x, self.lm_head if llama else self.wte)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=-1)
        return logits, loss


def train_flops_per_token(cfg, T):
    """Training FLOPs per token (fwd + bwd), as loom_model_flops_per_token counts them:
    6 * N + 12 * L * C * pairs(T) / T, where N counts every parameter that takes part in a
    matmul, the head included (for GPT-2 the tied wte counted once, as the head; embedding
    lookups are free), and pairs(T) is the (query, key) products per head that causal attention
    computes in blocks of 64 query rows: T(T+64)/2 when 64 divides T (about half of T^2)."""
    c = normalize_config(cfg)
    n = 0
    for name, shape in param_shapes(c):
        b = base_name(name)
        if b == "wpe" or (b == "wte" and c["flavor"] == FLAVOR_LLAMA):
            continue
        if b.endswith("_b") or b in NORM_WEIGHTS:
            continue
        n += math.prod(shape)
    pairs = sum((min(i0 + 64, T) - i0) * min(i0 + 64, T) for i0 in range(0, T, 64))
    return 6 * n + 12 * c["n_layer"] * c["d_model"] * pairs / T
