"""LoRA adapter dropout (finetune.lora.dropout) against PEFT, with the same dropout mask.

libloom (ctypes): a random HF Llama loaded into a loom training model, adapters on all seven
targets (q, k, v, o, gate, up, down) set to random A and B, dropout p = 0.25 keyed by
(seed 1234, key 37, first global row 5) - loom_lora_set_dropout / loom_lora_dropout_key. The
reference is PEFT's LoRA model (get_peft_model with lora_dropout = 0.25) whose lora_dropout
modules are replaced by the mask that include/loom/lora.h specifies, computed here in numpy
from loom's counter-based RNG written out independently (src/base/base.c's three splitmix64
rounds): keep where u >= p, u = the draw's top 24 bits / 2^24 with stream (key << 16) |
(layer << 3) | target and counter (global row * T + position) * in + feature, kept elements
scaled by 1 / (1 - p). Checked:
  * the mask keeps about 1 - p of the elements (statistics of the written-out RNG);
  * training-mode logits and loss equal PEFT's with that mask (max|d|/max|ref| <= 1e-5);
  * every adapter gradient (dA, dB, 7 targets x 2 layers) equals PEFT's autograd (<= 1e-4);
  * the dropout changes the logits (it is applied), and a different first row (another data-
    parallel rank's rows) draws a different mask;
  * with dropout off (dropout_key off: evaluation, generation) the logits equal PEFT's in
    eval mode (no dropout);
  * a p outside [0, 1) is refused.
"""
import ctypes
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import check, expect, finish, rel_max  # noqa: E402
from test_lora import B_, BITS, L, T_, Err, P, arr, loom_model  # noqa: E402

import peft  # noqa: E402
import transformers  # noqa: E402

L.loom_lora_set_dropout.argtypes = [P, ctypes.c_float, ctypes.c_uint64, ctypes.POINTER(Err)]
L.loom_lora_dropout_key.argtypes = [P, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64]

M64 = (1 << 64) - 1
P_DROP, SEED, KEY, ROW0 = 0.25, 1234, 37, 5
TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]
MODS = {0: "self_attn.q_proj", 1: "self_attn.k_proj", 2: "self_attn.v_proj", 3: "self_attn.o_proj",
        4: "mlp.gate_proj", 5: "mlp.up_proj", 6: "mlp.down_proj"}


def splitmix(z):
    """splitmix64's finalizer on uint64 (numpy arrays wrap on overflow) or Python ints"""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def rng_uniform(seed, stream, counters):
    """loom_rng_uniform(seed, stream, counter) for an array of counters"""
    k = splitmix((seed + 0x9e3779b97f4a7c15) & M64)
    k = splitmix(k ^ ((stream * 0xd1342543de82ef95 + 0x632be59bd9b4e019) & M64))
    z = splitmix(np.uint64(k) ^ (counters * np.uint64(0x9e3779b97f4a7c15) + np.uint64(0x2545f4914f6cdd1d)))
    return (z >> np.uint64(40)).astype(np.float64) / 16777216.0


def keep_mask(layer, target, width, row0, B, T):
    """(B, T, width) 1 where loom keeps the adapter input element"""
    stream = (KEY << 16) | (layer << 3) | target
    row = (row0 + np.arange(B, dtype=np.uint64))[:, None, None]
    pos = np.arange(T, dtype=np.uint64)[None, :, None]
    j = np.arange(width, dtype=np.uint64)[None, None, :]
    counters = (row * np.uint64(T) + pos) * np.uint64(width) + j
    return rng_uniform(SEED, stream, counters) >= P_DROP


class MaskDropout(torch.nn.Module):
    def __init__(self, keep):
        super().__init__()
        self.keep = torch.tensor(keep, dtype=torch.float32)

    def forward(self, x):
        return x * self.keep / (1.0 - P_DROP) if self.training else x


def loom_forward(m, x, y):
    loss = L.loom_model_forward(m, x.ctypes.data, y.ctypes.data if y is not None else None, B_, T_)
    return loss, arr(L.loom_model_logits(m), B_ * T_ * 101).reshape(B_, T_, 101).copy()


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                       rms_norm_eps=1e-5, tie_word_embeddings=False)
        base = transformers.LlamaForCausalLM(cfg)
        with torch.no_grad():
            for p in base.parameters():
                p.add_(0.02 * torch.randn(p.shape))
        base.save_pretrained(work)
        m = loom_model(work)
        lora, err = P(), Err()
        assert L.loom_lora_attach(m, 4, 8.0, sum(BITS[t] for t in TARGETS), 7, ctypes.byref(lora),
                                  ctypes.byref(err)) == 0, err.msg
        expect("dropout 1.0 refused", L.loom_lora_set_dropout(lora, 1.0, SEED, ctypes.byref(err)) != 0,
               err.msg.decode())
        expect("dropout -0.1 refused", L.loom_lora_set_dropout(lora, -0.1, SEED, ctypes.byref(err)) != 0,
               err.msg.decode())
        assert L.loom_lora_set_dropout(lora, P_DROP, SEED, ctypes.byref(err)) == 0, err.msg

        pm = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=P_DROP,
                                                       target_modules=[MODS[t].split(".")[1] for t in range(7)]))
        n_lora = L.loom_lora_num_params(lora)
        lp = arr(L.loom_lora_params(lora), n_lora)
        tensors = [L.loom_lora_tensor_at(lora, i).contents for i in range(L.loom_lora_num_tensors(lora))]
        layers = pm.base_model.model.model.layers
        ref = {}
        drop_frac = []
        for t in tensors:
            mod = layers[t.layer].get_submodule(MODS[t.target])
            w = (mod.lora_B if t.is_b else mod.lora_A)["default"].weight
            with torch.no_grad():
                w.copy_(0.2 * torch.randn(t.rows, t.cols))
            lp[t.offset:t.offset + t.rows * t.cols] = w.detach().numpy().reshape(-1)
            ref[(t.layer, t.target, t.is_b)] = w
            if not t.is_b:
                keep = keep_mask(t.layer, t.target, t.cols, ROW0, B_, T_)
                drop_frac.append(1.0 - keep.mean())
                mod.lora_dropout["default"] = MaskDropout(keep)
        frac = float(np.mean(drop_frac))
        expect(f"the written-out mask drops about p = {P_DROP} of the inputs", abs(frac - P_DROP) < 0.02,
               f"{frac:.4f} over {len(drop_frac)} masks")

        rng = np.random.default_rng(1)
        x = rng.integers(0, 101, size=(B_, T_)).astype(np.int32)
        y = rng.integers(0, 101, size=(B_, T_)).astype(np.int32)
        y[0, :3] = -1
        pm.train()
        logits = pm(torch.tensor(x, dtype=torch.long)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 101), torch.tensor(y, dtype=torch.long).reshape(-1),
                                                 ignore_index=-1)
        loss.backward()

        L.loom_lora_dropout_key(lora, 1, KEY, ROW0)
        lloss, got = loom_forward(m, x, y)
        check("training logits with adapter dropout vs PEFT (same mask)", rel_max(got, logits.detach().numpy()), 1e-5)
        check("loss", abs(lloss - loss.item()) / loss.item(), 1e-5)
        L.loom_model_zero_grad(m)
        L.loom_model_backward(m, 1.0 / L.loom_model_valid_targets(m))
        lg = arr(L.loom_lora_grads(lora), n_lora)
        worst = 0.0
        for t in tensors:
            g = lg[t.offset:t.offset + t.rows * t.cols].reshape(t.rows, t.cols)
            worst = max(worst, rel_max(g, ref[(t.layer, t.target, t.is_b)].grad.numpy()))
        check(f"every adapter gradient (dA, dB) vs PEFT autograd ({len(tensors)} tensors)", worst, 1e-4)

        L.loom_lora_dropout_key(lora, 1, KEY, ROW0 + 1)
        _, other = loom_forward(m, x, None)
        expect("another first row (another rank's rows) draws another mask", rel_max(other, got) > 1e-3,
               f"max|d|/max = {rel_max(other, got):.3g}")

        L.loom_lora_dropout_key(lora, 0, 0, 0)
        _, off = loom_forward(m, x, None)
        pm.eval()
        with torch.no_grad():
            want = pm(torch.tensor(x, dtype=torch.long)).logits.numpy()
        check("dropout off (evaluation) vs PEFT in eval mode", rel_max(off, want), 1e-5)
        expect("the dropout changes the training logits", rel_max(got, off) > 1e-3,
               f"max|d|/max = {rel_max(got, off):.3g}")
        L.loom_lora_free(lora)
        L.loom_model_free(m)
    sys.exit(finish())


if __name__ == "__main__":
    main()
