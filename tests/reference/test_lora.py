"""LoRA adapters against a PyTorch reference (forward hooks adding scale * x A^T B^T to the
transformers model's linears), on the same weights; PEFT itself is checked by test_lora_train.py.

libloom (ctypes): a tiny random HF model is loaded into a loom training model
(loom_hf_load_params), adapters attached (loom_lora_attach) and set to the reference's random
A and B (B non-zero, so the adapters matter). Checked:
  * logits and loss equal PEFT's / the reference's (max|d|/max|ref| <= 1e-5);
  * every adapter gradient (dA, dB per layer and target) equals torch autograd's (<= 1e-4);
  * the base weights get no gradient (frozen): loom's gradient arena stays zero for the linears;
  * merging (W += alpha/r B A) gives the adapted model's logits without adapters (<= 1e-5).
Targets: Llama q, k, v, o, gate, up, down (all); GPT-2 q, v, fc_proj.
"""
import ctypes
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import check, expect, finish, rel_max  # noqa: E402

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
LIB = os.environ.get("LOOM_LIB") or os.path.join(os.path.dirname(__file__), "../../build/libloom.so")
torch.set_num_threads(2)
torch.manual_seed(0)


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


class LoraTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 64), ("layer", ctypes.c_int), ("target", ctypes.c_int),
                ("is_b", ctypes.c_int), ("offset", ctypes.c_size_t), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64)]


P = ctypes.c_void_p
L = ctypes.CDLL(LIB)
L.loom_hf_read_config.argtypes = [ctypes.c_char_p, P, P, ctypes.POINTER(Err)]
L.loom_model_create.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P), ctypes.POINTER(Err)]
L.loom_hf_load_params.argtypes = [ctypes.c_char_p, P, ctypes.POINTER(Err)]
L.loom_lora_attach.argtypes = [P, ctypes.c_int, ctypes.c_float, ctypes.c_uint, ctypes.c_uint64,
                               ctypes.POINTER(P), ctypes.POINTER(Err)]
L.loom_lora_num_tensors.argtypes = [P]
L.loom_lora_tensor_at.argtypes = [P, ctypes.c_int]
L.loom_lora_tensor_at.restype = ctypes.POINTER(LoraTensor)
L.loom_lora_params.argtypes = [P]
L.loom_lora_params.restype = ctypes.POINTER(ctypes.c_float)
L.loom_lora_grads.argtypes = [P]
L.loom_lora_grads.restype = ctypes.POINTER(ctypes.c_float)
L.loom_lora_num_params.argtypes = [P]
L.loom_lora_num_params.restype = ctypes.c_size_t
L.loom_lora_merge.argtypes = [P, P, P]
L.loom_lora_free.argtypes = [P]
L.loom_model_forward.argtypes = [P, P, P, ctypes.c_int, ctypes.c_int]
L.loom_model_forward.restype = ctypes.c_float
L.loom_model_backward.argtypes = [P, ctypes.c_float]
L.loom_model_logits.argtypes = [P]
L.loom_model_logits.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_zero_grad.argtypes = [P]
L.loom_model_params.argtypes = [P]
L.loom_model_params.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_grads.argtypes = [P]
L.loom_model_grads.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_num_params.argtypes = [P]
L.loom_model_num_params.restype = ctypes.c_size_t
L.loom_model_valid_targets.argtypes = [P]
L.loom_model_valid_targets.restype = ctypes.c_int64
L.loom_model_free.argtypes = [P]

BITS = {"q": 1, "k": 2, "v": 4, "o": 8, "gate": 16, "up": 32, "down": 64, "fc": 16, "fc_proj": 64}
B_, T_ = 2, 12


def loom_model(hf_dir):
    err = Err()
    cfg = ctypes.create_string_buffer(4096)  # a loom_model_config (240 bytes today)
    m = P()
    assert L.loom_hf_read_config(hf_dir.encode(), cfg, None, ctypes.byref(err)) == 0, err.msg
    assert L.loom_model_create(cfg, None, B_, T_, ctypes.byref(m), ctypes.byref(err)) == 0, err.msg
    assert L.loom_hf_load_params(hf_dir.encode(), m, ctypes.byref(err)) == 0, err.msg
    return m


def arr(ptr, n):
    return np.ctypeslib.as_array(ptr, shape=(n,))


def run_case(flavor, work, targets, r, alpha):
    print(f"{flavor}: targets {targets}, r {r}, alpha {alpha}")
    if flavor == "llama":
        cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                       rms_norm_eps=1e-5, tie_word_embeddings=False)
        base = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=101, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                      attn_pdrop=0, embd_pdrop=0, resid_pdrop=0)
        base = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.02 * torch.randn(p.shape))
    d = os.path.join(work, flavor)
    base.save_pretrained(d)
    m = loom_model(d)
    lora = P()
    err = Err()
    bits = sum(BITS[t] for t in targets)
    assert L.loom_lora_attach(m, r, alpha, bits, 7, ctypes.byref(lora), ctypes.byref(err)) == 0, err.msg
    n_lora = L.loom_lora_num_params(lora)
    lp = arr(L.loom_lora_params(lora), n_lora)
    tensors = [L.loom_lora_tensor_at(lora, i).contents for i in range(L.loom_lora_num_tensors(lora))]
    scale = alpha / r
    # the reference: adapters as torch parameters with random A and B
    ref = {}
    for t in tensors:
        key = (t.layer, t.target, t.is_b)
        ref[key] = torch.nn.Parameter(0.2 * torch.randn(t.rows, t.cols))
        lp[t.offset:t.offset + t.rows * t.cols] = ref[key].detach().numpy().reshape(-1)
    model = base.float()
    for p in model.parameters():
        p.requires_grad_(False)
    hooks = []
    C = cfg.hidden_size if flavor == "llama" else cfg.n_embd
    if flavor == "llama":
        HD, KD = C, cfg.num_key_value_heads * (C // cfg.num_attention_heads)
        mods = {0: "self_attn.q_proj", 1: "self_attn.k_proj", 2: "self_attn.v_proj", 3: "self_attn.o_proj",
                4: "mlp.gate_proj", 5: "mlp.up_proj", 6: "mlp.down_proj"}
        cols = {t: (0, None) for t in range(7)}
        layers = model.model.layers
    else:  # GPT-2: q, k, v are column blocks of c_attn's output
        mods = {0: "attn.c_attn", 1: "attn.c_attn", 2: "attn.c_attn", 3: "attn.c_proj", 4: "mlp.c_fc",
                6: "mlp.c_proj"}
        cols = {0: (0, C), 1: (C, 2 * C), 2: (2 * C, 3 * C), 3: (0, None), 4: (0, None), 6: (0, None)}
        layers = model.transformer.h
    for li, layer in enumerate(layers):
        for t in sorted({x.target for x in tensors}):
            mod = layer.get_submodule(mods[t])
            A, Bm = ref[(li, t, 0)], ref[(li, t, 1)]
            lo, hi = cols[t]

            def hook(module, inp, out, A=A, Bm=Bm, lo=lo, hi=hi):
                delta = scale * (inp[0] @ A.t()) @ Bm.t()
                pad = [delta.new_zeros(delta.shape[:-1] + (lo,)), delta,
                       delta.new_zeros(delta.shape[:-1] + (out.shape[-1] - lo - delta.shape[-1],))]
                return out + torch.cat(pad, dim=-1)
            hooks.append(mod.register_forward_hook(hook))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 101, size=(B_, T_)).astype(np.int32)
    y = rng.integers(0, 101, size=(B_, T_)).astype(np.int32)
    y[0, :3] = -1
    logits = model(torch.tensor(x, dtype=torch.long)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 101), torch.tensor(y, dtype=torch.long).reshape(-1),
                                             ignore_index=-1)
    loss.backward()
    lloss = L.loom_model_forward(m, x.ctypes.data, y.ctypes.data, B_, T_)
    got = arr(L.loom_model_logits(m), B_ * T_ * 101).reshape(B_, T_, 101).copy()
    check(f"{flavor} logits with adapters", rel_max(got, logits.detach().numpy()), 1e-5)
    check(f"{flavor} loss", abs(lloss - loss.item()) / loss.item(), 1e-5)
    L.loom_model_zero_grad(m)
    L.loom_model_backward(m, 1.0 / L.loom_model_valid_targets(m))
    lg = arr(L.loom_lora_grads(lora), n_lora)
    worst = 0.0
    for t in tensors:
        g = lg[t.offset:t.offset + t.rows * t.cols].reshape(t.rows, t.cols)
        worst = max(worst, rel_max(g, ref[(t.layer, t.target, t.is_b)].grad.numpy()))
    check(f"{flavor} every adapter gradient (dA, dB) vs autograd ({len(tensors)} tensors)", worst, 1e-4)
    n = L.loom_model_num_params(m)
    base_grads = arr(L.loom_model_grads(m), n)
    # the linears' weights are frozen: no gradient at all; norms/embeddings are not trained by the
    # trainer either (it only steps the adapters), but their gradient may be computed
    expect(f"{flavor} no gradient reaches the base linears", True if base_grads is None else
           frozen_linears_zero(m, base_grads, flavor))
    # merged weights without adapters == the adapted model
    params = L.loom_model_params(m)
    L.loom_lora_merge(lora, m, params)
    L.loom_lora_free(lora)
    L.loom_model_forward(m, x.ctypes.data, None, B_, T_)
    merged = arr(L.loom_model_logits(m), B_ * T_ * 101).reshape(B_, T_, 101).copy()
    check(f"{flavor} merged weights == adapted model", rel_max(merged, got), 1e-5)
    for h in hooks:
        h.remove()
    L.loom_model_free(m)


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("layer", ctypes.c_int), ("kind", ctypes.c_int),
                ("offset", ctypes.c_size_t), ("numel", ctypes.c_size_t)]


L.loom_model_num_tensors.argtypes = [P]
L.loom_model_tensor.argtypes = [P, ctypes.c_int]
L.loom_model_tensor.restype = ctypes.POINTER(TensorInfo)


def frozen_linears_zero(m, grads, flavor):
    names = ("q_w", "k_w", "v_w", "attn_proj_w", "fc_w", "gate_w", "up_w", "fc_proj_w")
    for i in range(L.loom_model_num_tensors(m)):
        t = L.loom_model_tensor(m, i).contents
        if t.name.decode().split(".")[-1] in names and np.any(grads[t.offset:t.offset + t.numel] != 0):
            print("   gradient in", t.name.decode())
            return False
    return True


def main():
    with tempfile.TemporaryDirectory() as work:
        run_case("llama", work, ["q", "k", "v", "o", "gate", "up", "down"], 4, 8.0)
        run_case("gpt2", work, ["q", "v", "fc_proj"], 3, 6.0)
    sys.exit(finish())


if __name__ == "__main__":
    main()
