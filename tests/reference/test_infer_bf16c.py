"""--compute bf16 (docs/inference.md "Compute in bf16") against PyTorch doing the same thing:
the linears' and the head's weight matrices rounded to bf16 (as --weights bf16), and each
linear's and the head's input rows rounded to bf16 (torch's .to(bfloat16), round to nearest
even), the products of those bf16 values summed in fp32; everything else (norms, attention,
GELU/SwiGLU, residuals, biases, position embeddings) in fp32.

Tiny random GPT2LMHeadModel and LlamaForCausalLM (tests/reference/hf_tiny.py: widths 48 and 80,
so the kernel's tails along IC run), imported with `loom import --hf`. Through libloom
(ctypes), at the avx512 level (VDPBF16PS where the CPU has avx512_bf16) and again at avx2 (the
portable kernel), after loom_model_set_compute_bf16:

- prefills: 17 random byte sequences of 4 to 36 tokens, each prefilled alone by
  loom_model_decode_batch; the last row's logits against the reference's. The median over the
  sequences of max |d| / max |ref| must be <= 1e-5 (fp32
  summation order is all that differs; observed ~1e-7), the largest <= TOL_FLIP = 1e-2: where
  an activation lies within that fp32 difference of a bf16 rounding boundary, loom and PyTorch
  round it to neighbouring bf16 values (1 ulp of bf16 is 2^-8 relative), which moves the
  logits by ~1e-3 (observed up to 4e-3 on these models, in a few of the sequences). The median
  against the --weights bf16 model (activations not rounded) must be >= 1e-3: the rounding of
  activations is really applied.
- decoding: the prompt prefilled, then 64 greedy steps one row at a time against the KV cache;
  the tokens must equal the reference's greedy generate, the logits the reference's on the same
  prefix to TOL_FLIP (a flipped rounding that enters the KV cache stays in later steps).

Then, through `loom generate --compute bf16 --format ids --temperature 0`: 8 prompts of
mixed lengths at --batch 8 give the same tokens as each prompt at --batch 1 (every output
element of the kernel is computed the same way whatever rows share its call), and
--weights fp32 --compute bf16 is refused with a message. Exits non-zero on any mismatch."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_tiny import tiny_model  # noqa: E402
from loomlib import FAILURES, expect  # noqa: E402
from test_infer_bf16 import LOOM, Err, Seg, api, decode, import_ck, rounded_names  # noqa: E402

torch.set_num_threads(2)
N = 64
TOL = 1e-5
TOL_FLIP = 1e-2
ISA_AVX2, ISA_AVX512 = 3, 4


def round_input(mod, args):
    return (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])


def reference(flavor, model):
    """the model with bf16 weights (as --weights bf16) and, with compute, rounded inputs"""
    ref = tiny_model(flavor)
    ref.load_state_dict(model.state_dict())
    names = rounded_names(flavor, ref)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name in names:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    wonly = tiny_model(flavor)
    wonly.load_state_dict(ref.state_dict())
    lin = (torch.nn.Linear, transformers.pytorch_utils.Conv1D)
    hooked = 0
    for mod in ref.modules():
        if isinstance(mod, lin):
            mod.register_forward_pre_hook(round_input)
            hooked += 1
    return ref.eval(), wonly.eval(), hooked


def prefills(L, m, ref, wonly):
    """17 random sequences of 4..36 tokens, each prefilled alone: the errors of its last
    row's logits against ref and against wonly"""
    fpp = L.loom_model_kv_floats_per_pos(m)
    V = ref.config.vocab_size
    g = np.random.default_rng(3)
    ws = L.loom_decode_ws_create(m, 36, 1)
    e_ref, e_w = [], []
    for n in range(4, 37, 2):
        seq = [int(t) for t in g.integers(0, V, n)]
        k = np.zeros(n * fpp, np.float32)
        v = np.zeros(n * fpp, np.float32)
        seg = Seg(k.ctypes.data, v.ctypes.data, n, 0, n, 1)
        arr = (ctypes.c_int32 * n)(*seq[:n])
        lp = L.loom_model_decode_batch(m, ws, arr, ctypes.byref(seg), 1)
        got = np.ctypeslib.as_array(lp, shape=(V,)).copy()
        with torch.no_grad():
            r = ref(torch.tensor([seq[:n]])).logits[0, -1].numpy()
            rw = wonly(torch.tensor([seq[:n]])).logits[0, -1].numpy()
        e_ref.append(float(np.abs(got - r).max() / np.abs(r).max()))
        e_w.append(float(np.abs(got - rw).max() / np.abs(rw).max()))
    L.loom_decode_ws_free(ws)
    return np.array(e_ref), np.array(e_w)


def gen_ids(ck, prompts_file, batch, *extra):
    r = subprocess.run([LOOM, "generate", ck, "--prompts", prompts_file, "--tokens", "24",
                        "--temperature", "0", "--batch", str(batch), "--format", "ids",
                        "--compute", "bf16", *extra], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return [json.loads(line)["ids"] for line in r.stdout.splitlines()]


def main():
    L = api()
    L.loom_model_set_compute_bf16.argtypes = [ctypes.c_void_p, ctypes.POINTER(Err)]
    L.loom_model_set_compute_bf16.restype = ctypes.c_int
    L.loom_isa_set.argtypes = [ctypes.c_int, ctypes.c_void_p]
    L.loom_isa_detect.restype = ctypes.c_int
    L.matmul_dotbf16_vdp.restype = ctypes.c_int
    best = L.loom_isa_detect()
    levels = [lv for lv in (ISA_AVX512, ISA_AVX2) if lv <= best] or [best]
    with tempfile.TemporaryDirectory() as work:
        for flavor in ("gpt2", "llama"):
            torch.manual_seed(0)
            model = tiny_model(flavor)
            ck = import_ck(model, work, flavor)
            ref, wonly, hooked = reference(flavor, model)
            expect(f"{flavor}: the reference rounds the inputs of its linears and head",
                   hooked >= 5, f"{hooked} modules")
            prompt = list(b"the quick brown fox")
            with torch.no_grad():
                out = ref.generate(torch.tensor([prompt]), max_new_tokens=N, min_new_tokens=N,
                                   do_sample=False, pad_token_id=0, eos_token_id=None)
            want = out[0, len(prompt):].tolist()
            for lv in levels:
                if lv in (ISA_AVX2, ISA_AVX512):
                    L.loom_isa_set(lv, None)
                kern = "VDPBF16PS" if L.matmul_dotbf16_vdp() else "portable"
                m, err = ctypes.c_void_p(), Err()
                if L.loom_load_model_ex(ck.encode(), 1, 0, ctypes.byref(m), None, None,
                                        ctypes.byref(err)) or \
                        L.loom_model_set_compute_bf16(m, ctypes.byref(err)):
                    raise RuntimeError(err.msg.decode())
                gen, worst, _ = decode(L, m, wonly, ref, prompt, N)
                e_ref, e_w = prefills(L, m, ref, wonly)
                L.loom_model_free(m)
                tag = f"{flavor} ({kern})"
                print(f"{tag}: {len(e_ref)} prefills, max |logit diff| / max |logit| vs the "
                      f"bf16-compute reference: median {np.median(e_ref):.2e}, largest "
                      f"{e_ref.max():.2e} ({int((e_ref > TOL).sum())} over {TOL:.0e}); vs bf16 "
                      f"weights only: median {np.median(e_w):.2e}. Decoding {N} steps: largest "
                      f"{worst:.2e}, {sum(a == b for a, b in zip(gen, want))} of {N} tokens equal")
                expect(f"{tag}: prefill logits equal the reference's to {TOL} (median)",
                       np.median(e_ref) <= TOL, f"{np.median(e_ref):.3e}")
                expect(f"{tag}: prefill and decode logits within {TOL_FLIP} of the reference's",
                       max(e_ref.max(), worst) <= TOL_FLIP, f"{e_ref.max():.3e} / {worst:.3e}")
                expect(f"{tag}: logits differ from bf16 weights alone (activations rounded)",
                       np.median(e_w) >= 1e-3, f"{np.median(e_w):.3e}")
                expect(f"{tag}: {N} greedy tokens equal the reference's", gen == want,
                       f"{gen[:16]}... vs {want[:16]}...")
            L.loom_isa_set(best, None)
            # batched = alone, through the CLI (prefill of 8 prompts in one step, then decode)
            lines = ["a", "the quick brown fox jumps", "0123456789", "zz top", "hello there",
                     "xyzzy plugh", "q", "mixed Lengths, mixed Bytes!"]
            pf = os.path.join(work, f"p_{flavor}.txt")
            with open(pf, "w") as f:
                f.write("\n".join(lines) + "\n")
            batched = gen_ids(ck, pf, 8)
            alone = []
            for i, line in enumerate(lines):
                one = os.path.join(work, f"p1_{flavor}_{i}.txt")
                with open(one, "w") as f:
                    f.write(line + "\n")
                alone += gen_ids(ck, one, 1)
            expect(f"{flavor}: --compute bf16 --batch 8 equals each prompt alone",
                   batched == alone and len(batched) == len(lines),
                   f"{sum(a == b for a, b in zip(batched, alone))} of {len(lines)} equal")
        r = subprocess.run([LOOM, "generate", ck, "--prompt", "x", "--weights", "fp32",
                            "--compute", "bf16"], capture_output=True, text=True)
        expect("--weights fp32 --compute bf16 is refused with a message",
               r.returncode == 2 and "--compute bf16" in r.stderr, r.stderr.strip()[:200])
        r = subprocess.run([LOOM, "generate", ck, "--prompt", "x", "--compute", "fp16"],
                           capture_output=True, text=True)
        expect("--compute fp16 is refused with a message",
               r.returncode == 2 and "--compute 'fp16'" in r.stderr, r.stderr.strip()[:200])
    if FAILURES:
        sys.exit(1)
    print("all ok")


if __name__ == "__main__":
    main()
