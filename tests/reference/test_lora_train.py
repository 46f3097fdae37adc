"""LoRA fine-tuning end to end: `loom train` with finetune.lora on chat data, from a random HF
Llama (training.init_from), then `loom export --hf` checked with PEFT and transformers.

  * the run logs the adapters' optimizer state; the loss goes down;
  * the base weights are frozen: the checkpoint's parameters equal the source's bit for bit, and
    it holds no AdamW moments for them (only lora.safetensors carries adapters + moments);
  * resume: 4 + 4 steps equal 8 uninterrupted steps exactly (loss and grad norm);
  * data parallelism: 2 ranks (ZeRO 1) give the one-process losses within 1e-5;
  * export without --merge-lora writes PEFT's adapter_model.safetensors + adapter_config.json:
    PeftModel.from_pretrained on the exported base gives loom's logits (the checkpoint loaded by
    libloom, adapters merged) within 1e-5; --merge-lora gives the same logits with plain
    from_pretrained (merged == unmerged).
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import check, expect, finish, rel_max  # noqa: E402

import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

transformers.logging.set_verbosity_error()
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
LIB = os.environ.get("LOOM_LIB") or os.path.join(os.path.dirname(__file__), "../../build/libloom.so")
torch.set_num_threads(2)


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


L = ctypes.CDLL(LIB)
L.loom_load_model.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_void_p, ctypes.POINTER(Err)]
L.loom_model_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
L.loom_model_logits.argtypes = [ctypes.c_void_p]
L.loom_model_logits.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_free.argtypes = [ctypes.c_void_p]


def loom_logits(ckpt, ids, V):
    m = ctypes.c_void_p()
    err = Err()
    B, T = ids.shape
    assert L.loom_load_model(ckpt.encode(), B, 0, ctypes.byref(m), None, ctypes.byref(err)) == 0, err.msg
    x = np.ascontiguousarray(ids, dtype=np.int32)
    L.loom_model_forward(m, x.ctypes.data, None, B, T)
    out = np.ctypeslib.as_array(L.loom_model_logits(m), shape=(B * T * V,)).copy().reshape(B, T, V)
    L.loom_model_free(m)
    return out


def run(args, env=None, ok=True):
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if ok and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r


def losses(run_dir):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{run_dir}/metrics.jsonl"))]


def main():
    work = tempfile.mkdtemp(prefix="loom-lora-")
    try:
        body(work)
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept", work)
    sys.exit(finish())


def body(work):
    rng = np.random.default_rng(2)
    with open(f"{work}/conv.jsonl", "w") as f:
        for i in range(60):
            a, b = int(rng.integers(0, 20)), int(rng.integers(0, 20))
            msgs = [{"role": "user", "content": f"add {a} {b}"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    open(f"{work}/r.yaml", "w").write(f"""name: lora
sources:
  - name: calc
    kind: chat
    path: {work}/conv.jsonl
tokenizer: byte
seq_len: 64
val_fraction: 0
output: {work}/data
shard_tokens: 100000
""")
    run([LOOM, "data", "build", f"{work}/r.yaml"])
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(cfg)
    base.save_pretrained(f"{work}/base")

    def config(name, steps, every):
        p = f"{work}/{name}.yaml"
        open(p, "w").write(f"""run:
  dir: {work}/{name}
data:
  train: {work}/data/train
training:
  init_from: {work}/base
  steps: {steps}
  schedule_steps: 8
  batch_size: 4
  seq_len: 64
  lr: 1e-2
  warmup: 1
  peak_flops: 1e11
eval:
  every: 0
checkpoint:
  every: {every}
finetune:
  lora:
    rank: 4
    alpha: 8
    targets: [q, k, v, o, gate, up, down]
""")
        return p

    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = run([LOOM, "train", config("a", 8, 8)], env=env)
    expect("the run logs the adapters' optimizer state", "lora: rank 4" in r.stderr and "optimizer state" in r.stderr,
           next((l for l in r.stderr.splitlines() if "lora:" in l), "no lora line"))
    la = losses(f"{work}/a")
    expect("the loss goes down", la[-1][1] < la[0][1] - 0.1, f"{la[0][1]:.3f} -> {la[-1][1]:.3f}")
    ck = load_file(f"{work}/a/ckpt/step_0000008/rank_00000.safetensors")
    expect("no AdamW moments for the frozen base", not any(k.startswith("adam_") for k in ck), "")
    ref = {k: v.detach().numpy() for k, v in base.state_dict().items()}
    same = np.array_equal(ck["param/layers.1.q_w/0,0"], ref["model.layers.1.self_attn.q_proj.weight"]) and \
        np.array_equal(ck["param/wte/0,0"], ref["model.embed_tokens.weight"]) and \
        np.array_equal(ck["param/layers.0.ln2_w/0"], ref["model.layers.0.post_attention_layernorm.weight"])
    expect("base weights unchanged after 8 steps (frozen)", same)
    lf = load_file(f"{work}/a/ckpt/step_0000008/lora.safetensors")
    expect("lora.safetensors holds the adapters and their moments",
           any(k.startswith("param/") for k in lf) and any(k.startswith("adam_v/") for k in lf), f"{len(lf)} entries")

    run([LOOM, "train", config("b", 4, 4)], env=env)
    run([LOOM, "train", config("b", 8, 4)], env=env)
    expect("resume: 4 + 4 steps == 8 steps exactly", losses(f"{work}/b") == la,
           f"{losses(f'{work}/b')[-1]} vs {la[-1]}")

    if shutil.which("mpirun"):
        env1 = dict(os.environ, OMP_NUM_THREADS="1")
        run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", LOOM, "train", config("dp", 4, 0),
             "--set", "parallel.zero=1"], env=env1)
        ld = losses(f"{work}/dp")
        worst = max(abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(ld, la[:4]))
        check("dp 2 (ZeRO 1) losses vs one process", worst, 1e-5)
        # the frozen base's gradients are not reduced: a step moves the adapters' gradients
        # (and a few scalars), far less than the base's fp32 parameters
        rows = [json.loads(l) for l in open(f"{work}/dp/metrics.jsonl")]
        sent = max(max(r["comm_bytes"]) for r in rows)
        base_bytes = 4 * sum(v.numel() for v in base.state_dict().values())
        expect("dp 2: a step's communication is the adapters', not the frozen base's",
               0 < sent < base_bytes / 4, f"{sent:.0f} bytes a step per rank; base {base_bytes} bytes")
    else:
        expect("mpirun available for the data-parallel check", False)

    out = f"{work}/hf_adapters"
    run([LOOM, "export", "--hf", f"{work}/a", out])
    files = sorted(os.listdir(out))
    expect("PEFT files written", "adapter_model.safetensors" in files and "adapter_config.json" in files, f"{files}")
    ids = rng.integers(0, 256, size=(2, 20))
    want = loom_logits(f"{work}/a", ids, 256)
    try:
        import peft
        hfb = transformers.AutoModelForCausalLM.from_pretrained(out)
        pm = peft.PeftModel.from_pretrained(hfb, out).eval()
        with torch.no_grad():
            got = pm(torch.tensor(ids)).logits.numpy()
        check("PEFT (exported base + adapters) logits vs loom", rel_max(got, want), 1e-5)
    except ImportError:
        expect("peft importable (tests/requirements.txt pins it)", False)
    out2 = f"{work}/hf_merged"
    run([LOOM, "export", "--hf", f"{work}/a", out2, "--merge-lora"])
    expect("--merge-lora writes no adapter files", "adapter_config.json" not in os.listdir(out2))
    mm = transformers.AutoModelForCausalLM.from_pretrained(out2).eval()
    with torch.no_grad():
        got2 = mm(torch.tensor(ids)).logits.numpy()
    check("merged export (from_pretrained) vs the unmerged adapters", rel_max(got2, want), 1e-5)

    # GPT-2: q and v are column blocks of HF's fused c_attn; PEFT gets one exact adapter for it
    cfg2 = transformers.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    transformers.GPT2LMHeadModel(cfg2).save_pretrained(f"{work}/base2")
    c2 = config("g", 3, 3).replace("a", "a")
    txt = open(c2).read().replace(f"{work}/base\n", f"{work}/base2\n").replace(
        "[q, k, v, o, gate, up, down]", "[q, v, o, fc_proj]")
    open(c2, "w").write(txt)
    run([LOOM, "train", c2], env=env)
    out3 = f"{work}/hf_gpt2"
    run([LOOM, "export", "--hf", f"{work}/g", out3])
    want3 = loom_logits(f"{work}/g", ids, 256)
    import peft
    pm3 = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(out3), out3).eval()
    with torch.no_grad():
        got3 = pm3(torch.tensor(ids)).logits.numpy()
    check("gpt2: PEFT (fused c_attn adapter) logits vs loom", rel_max(got3, want3), 1e-5)


if __name__ == "__main__":
    main()
