"""--weights bf16 (src/model/weights_bf16.c) against PyTorch doing the same thing: the weight
matrices of the linears and the head rounded to bf16 (torch's round to nearest even), the
norms, biases and position embeddings kept, everything computed in fp32.

Tiny random GPT2LMHeadModel (tied head: its wte is rounded, so the input embedding too) and
LlamaForCausalLM (GQA, untied: lm_head rounded, embed_tokens kept), perturbed parameters,
imported with `loom import --hf`. Through libloom (ctypes): the checkpoint loaded,
loom_model_set_weights_bf16, a prompt prefilled and 64 tokens decoded greedily by
loom_model_decode_batch; then a 72-token prompt (its prefill runs the bf16 kernel in chunks of
16 rows) and 8 steps. At every step loom's logits must equal the reference's next-token
logits on the same prefix to TOL (max |d| / max |ref|; fp32 summation order is all that
differs, observed ~1e-6), and the 64 tokens must equal the reference's greedy generate. The
same logits against the fp32 (unrounded) model must differ by more than 10 x TOL (the rounding
is really applied), and the resident memory of the process must drop by at least 80% of half
the converted matrices' fp32 bytes when a larger model (21 MB of fp32 parameters) is switched
to bf16. Exits non-zero on any mismatch."""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_tiny import tiny_model  # noqa: E402
from loomlib import FAILURES, expect, lib  # noqa: E402

LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
torch.set_num_threads(2)
N = 64
TOL = 1e-4


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


class Seg(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("cap", ctypes.c_int),
                ("pos0", ctypes.c_int), ("n", ctypes.c_int), ("want_logits", ctypes.c_int)]


def api():
    L = lib()
    P = ctypes.c_void_p
    L.loom_load_model_ex.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(P), P, P, ctypes.POINTER(Err)]
    L.loom_load_model_ex.restype = ctypes.c_int
    L.loom_model_set_weights_bf16.argtypes = [P, ctypes.POINTER(Err)]
    L.loom_model_set_weights_bf16.restype = ctypes.c_int
    L.loom_model_kv_floats_per_pos.argtypes = [P]
    L.loom_model_kv_floats_per_pos.restype = ctypes.c_size_t
    L.loom_decode_ws_create.argtypes = [P, ctypes.c_int, ctypes.c_int]
    L.loom_decode_ws_create.restype = P
    L.loom_decode_ws_free.argtypes = [P]
    L.loom_model_decode_batch.argtypes = [P, P, ctypes.POINTER(ctypes.c_int32),
                                          ctypes.POINTER(Seg), ctypes.c_int]
    L.loom_model_decode_batch.restype = ctypes.POINTER(ctypes.c_float)
    L.loom_model_free.argtypes = [P]
    return L


def load(L, ck, bf16):
    m, err = ctypes.c_void_p(), Err()
    if L.loom_load_model_ex(ck.encode(), 1, 0, ctypes.byref(m), None, None, ctypes.byref(err)):
        raise RuntimeError(err.msg.decode())
    if bf16 and L.loom_model_set_weights_bf16(m, ctypes.byref(err)):
        raise RuntimeError(err.msg.decode())
    return m


def rounded_names(flavor, model):
    """the tensors --weights bf16 rounds: 2-D weights of linears and the head"""
    out = []
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        if flavor == "gpt2" and name.endswith("wpe.weight"):
            continue  # position embeddings stay fp32
        if flavor == "llama" and "embed_tokens" in name:
            continue  # llama's input embedding is a lookup, not a matmul: stays fp32
        out.append(name)
    return out


def import_ck(model, work, name):
    src = os.path.join(work, f"hf_{name}")
    model.save_pretrained(src, safe_serialization=True)
    ck = os.path.join(work, f"ck_{name}")
    r = subprocess.run([LOOM, "import", "--hf", src, ck, "--tokenizer", "byte"],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return ck


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def decode(L, m, model, ref, prompt, steps):
    """prefill then greedy steps through loom_model_decode_batch; the generated tokens, the
    worst max|d|/max|ref| against ref and the smallest against model (here the fp32 model;
    test_infer_bf16c.py: the --weights bf16 one)"""
    fpp = L.loom_model_kv_floats_per_pos(m)
    cap = len(prompt) + steps
    k = np.zeros(cap * fpp, np.float32)
    v = np.zeros(cap * fpp, np.float32)
    ws = L.loom_decode_ws_create(m, len(prompt), 1)
    V = model.config.vocab_size
    toks, pos, worst, worst32 = list(prompt), 0, 0.0, float("inf")
    feed, gots = list(prompt), []
    for _ in range(steps):
        seg = Seg(k.ctypes.data, v.ctypes.data, cap, pos, len(feed), 1)
        arr = (ctypes.c_int32 * len(feed))(*feed)
        lp = L.loom_model_decode_batch(m, ws, arr, ctypes.byref(seg), 1)
        got = np.ctypeslib.as_array(lp, shape=(V,)).copy()
        gots.append(got)
        pos += len(feed)
        t = int(np.argmax(got))
        toks.append(t)
        feed = [t]
    L.loom_decode_ws_free(ws)
    # the references' next-token logits of every prefix at once: one causal forward over the
    # whole sequence (position i sees toks[:i + 1] only), not one forward per step
    with torch.no_grad():
        seq = torch.tensor([toks[:-1]])
        rs, r32s = ref(seq).logits[0].numpy(), model(seq).logits[0].numpy()
    for s_, got in enumerate(gots):
        r, r32 = rs[len(prompt) - 1 + s_], r32s[len(prompt) - 1 + s_]
        worst = max(worst, float(np.abs(got - r).max() / np.abs(r).max()))
        worst32 = min(worst32, float(np.abs(got - r32).max() / np.abs(r32).max()))
    return toks[len(prompt):], worst, worst32


def main():
    L = api()
    with tempfile.TemporaryDirectory() as work:
        for flavor in ("gpt2", "llama"):
            torch.manual_seed(0)
            model = tiny_model(flavor)
            ck = import_ck(model, work, flavor)
            ref = tiny_model(flavor)
            ref.load_state_dict(model.state_dict())
            names = rounded_names(flavor, ref)
            with torch.no_grad():
                for name, p in ref.named_parameters():
                    if name in names:
                        p.copy_(p.to(torch.bfloat16).to(torch.float32))
            ref.eval()
            prompt = list(b"the quick brown fox")
            with torch.no_grad():
                out = ref.generate(torch.tensor([prompt]), max_new_tokens=N, min_new_tokens=N,
                                   do_sample=False, pad_token_id=0, eos_token_id=None)
            want = out[0, len(prompt):].tolist()
            m = load(L, ck, bf16=True)
            gen, worst, worst32 = decode(L, m, model, ref, prompt, N)
            # a prompt of 72 tokens: its prefill runs the kernel in chunks of 16 rows
            long_prompt = list((b"0123456789abcdef" * 5)[:72])
            _, worst_long, _ = decode(L, m, model, ref, long_prompt, 8)
            L.loom_model_free(m)
            print(f"{flavor}: 72-token prompt (chunked prefill) + 8 steps: max |logit diff| / "
                  f"max |logit| {worst_long:.2e}")
            expect(f"{flavor}: long-prompt logits equal the bf16-rounded reference to {TOL}",
                   worst_long <= TOL, f"{worst_long:.3e}")
            print(f"{flavor}: max |logit diff| / max |logit| vs the bf16-rounded reference "
                  f"{worst:.2e} (tol {TOL:.0e}); vs fp32 weights at least {worst32:.2e}; "
                  f"{sum(a == b for a, b in zip(gen, want))} of {N} tokens equal")
            expect(f"{flavor}: logits equal the bf16-rounded reference to {TOL}", worst <= TOL,
                   f"{worst:.3e}")
            expect(f"{flavor}: logits differ from the fp32 model's (rounding applied)",
                   worst32 > 10 * TOL, f"{worst32:.3e}")
            expect(f"{flavor}: {N} greedy tokens equal the reference's", gen == want,
                   f"{gen[:16]}... vs {want[:16]}...")
        # memory: a larger gpt2, fp32 then bf16, resident bytes in this process
        torch.manual_seed(1)
        big = tiny_model("gpt2", big=True)
        conv = sum(p.numel() for n, p in big.named_parameters() if n in rounded_names("gpt2", big))
        ck = import_ck(big, work, "big")
        del big
        m = load(L, ck, bf16=False)
        before = rss()
        err = Err()
        if L.loom_model_set_weights_bf16(m, ctypes.byref(err)):
            raise RuntimeError(err.msg.decode())
        after = rss()
        L.loom_model_free(m)
        saved, expect_saved = before - after, conv * 2
        print(f"resident memory: {before / 2**20:.1f} MiB with fp32 weights, "
              f"{after / 2**20:.1f} MiB with bf16 ({saved / 2**20:.1f} MiB less; the converted "
              f"matrices' fp32 bytes / 2 = {expect_saved / 2**20:.1f} MiB)")
        expect("bf16 weights: resident memory drops by >= 80% of half the matrices' fp32 bytes",
               saved >= 0.8 * expect_saved, f"{saved} < 0.8 * {expect_saved}")
    if FAILURES:
        sys.exit(1)
    print("all ok")


if __name__ == "__main__":
    main()
