"""Hugging Face interop against `transformers` (no network: the models are created here).

For GPT2LMHeadModel and LlamaForCausalLM (GQA, non-default rope_theta and rms_norm_eps), tiny
random models with every parameter perturbed (so biases and norms are not trivially 0 / 1):
  * `loom import --hf` -> the imported checkpoint's logits (libloom, fp32) equal transformers'
    (max|d| / max|ref| <= 1e-5, transformers run in float64) and `loom generate --temperature 0 --format ids` gives the
    greedy tokens of transformers' generate(do_sample=False);
  * `loom export --hf` of that checkpoint loads with from_pretrained (Llama sharded through
    --max-shard-size, with model.safetensors.index.json) with the same logits and greedy tokens;
  * export -> import round-trips the parameters bit-exactly;
  * the exported tokenizer.json loads in `tokenizers` and encodes like the original (BPE) and
    like loom's byte tokenizer (a byte model), and a byte tokenizer file imports back as "byte";
  * bad directories are refused naming the problem: an unknown architecture, a missing tensor,
    a shape mismatch, an unknown tensor, a pickle, an unsupported option; export into a
    non-empty directory writes nothing.
"""
import copy
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
from safetensors.numpy import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers  # noqa: E402

transformers.logging.set_verbosity_error()
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
LIB = os.environ.get("LOOM_LIB") or os.path.join(os.path.dirname(__file__), "../../build/libloom.so")
TOL = 1e-5
torch.manual_seed(0)
torch.set_num_threads(2)


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


L = ctypes.CDLL(LIB)
L.loom_load_model.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.POINTER(Err)]
L.loom_model_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_int]
L.loom_model_forward.restype = ctypes.c_float
L.loom_model_logits.argtypes = [ctypes.c_void_p]
L.loom_model_logits.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_free.argtypes = [ctypes.c_void_p]


def loom_logits(ckpt, ids, V):
    m = ctypes.c_void_p()
    err = Err()
    B, T = ids.shape
    if L.loom_load_model(ckpt.encode(), B, 0, ctypes.byref(m), None, ctypes.byref(err)) != 0:
        raise RuntimeError(err.msg.decode())
    x = np.ascontiguousarray(ids, dtype=np.int32)
    L.loom_model_forward(m, x.ctypes.data, None, B, T)
    out = np.ctypeslib.as_array(L.loom_model_logits(m), shape=(B * T * V,)).copy().reshape(B, T, V)
    L.loom_model_free(m)
    return out


def run(*args, ok=True):
    r = subprocess.run([LOOM, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise RuntimeError(f"loom {' '.join(args)} failed: {r.stderr}")
    return r


def make_tokenizer(path, corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, tr)
    tok.save(path)
    return tok


def perturb(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def hf_model(flavor, V):
    if flavor == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_embd=48, n_layer=2, n_head=4, n_positions=64,
                                      layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
                                      attn_pdrop=0, embd_pdrop=0, resid_pdrop=0)
        m = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=6,
                                       num_key_value_heads=2, max_position_embeddings=64,
                                       rms_norm_eps=1e-5, rope_theta=50000.0, bos_token_id=0,
                                       eos_token_id=0, tie_word_embeddings=False)
        m = transformers.LlamaForCausalLM(cfg)
    perturb(m)
    return m.eval()


def hf_logits(model, ids):
    """transformers' logits computed in float64 on a copy of the model: the reference then
    carries no fp32 rounding of its own (PyTorch's fp32 kernels round differently with the
    arrays' alignment and the machine's load: a 1.2e-5 wobble of the fp32 reference once failed
    CI while loom and the exported model agreed to 3.7e-7)."""
    with torch.no_grad():
        return copy.deepcopy(model).double()(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def loom_greedy(ckpt, prompt, n):
    r = run("generate", ckpt, "--prompt", prompt, "--tokens", str(n), "--temperature", "0",
            "--format", "ids")
    return [int(x) for x in r.stdout.split()]


def params_of(ckpt_root):
    f = load_file(os.path.join(ckpt_root, "step_0000000", "rank_00000.safetensors"))
    return {k: v for k, v in f.items() if k.startswith("param/")}


CORPUS = ["the quick brown fox jumps over the lazy dog " * 3, "tool call: add(2, 3) = 5\n",
          "héllo wörld, 日本語 text and numbers 12345"] * 20
PROMPT = "the quick brown"


def test_flavor(work, flavor, tok):
    print(f"{flavor}:")
    V = tok.get_vocab_size() + 7  # a vocabulary padded beyond the tokenizer
    model = hf_model(flavor, V)
    src = os.path.join(work, f"hf_{flavor}")
    model.save_pretrained(src, safe_serialization=True)
    shutil.copy(os.path.join(work, "tokenizer.json"), os.path.join(src, "tokenizer.json"))
    ck = os.path.join(work, f"ck_{flavor}")
    run("import", "--hf", src, ck)

    rng = np.random.default_rng(3)
    ids = rng.integers(0, V, size=(2, 19)).astype(np.int64)
    ref = hf_logits(model, ids)
    got = loom_logits(ck, ids, V)
    check(f"{flavor} import: logits vs transformers", rel_max(got, ref), TOL)

    pids = tok.encode(PROMPT).ids
    want = hf_greedy(model, pids, 12)
    have = loom_greedy(ck, PROMPT, 12)
    expect(f"{flavor} import: greedy tokens equal transformers'", have == want, f"{have} vs {want}")

    out = os.path.join(work, f"exp_{flavor}")
    shard = ["--max-shard-size", "20K"] if flavor == "llama" else []
    run("export", "--hf", ck, out, *shard)
    files = sorted(os.listdir(out))
    if flavor == "llama":
        idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        shards = sorted(set(idx["weight_map"].values()))
        expect("llama export: sharded with an index", len(shards) > 1 and all(s in files for s in shards),
               f"{shards}")
    else:
        expect("gpt2 export: one model.safetensors", "model.safetensors" in files, f"{files}")
    cfg = json.load(open(os.path.join(out, "config.json")))
    if flavor == "llama":
        expect("llama config.json: rms_norm_eps and rope_theta explicit",
               cfg.get("rms_norm_eps") == 1e-5 and cfg.get("rope_theta") == 50000.0
               and cfg.get("num_key_value_heads") == 2, f"{cfg}")
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    expect(f"{flavor} export: from_pretrained gives {type(model).__name__}",
           type(back) is type(model), type(back).__name__)
    check(f"{flavor} export: from_pretrained logits vs loom", rel_max(hf_logits(back, ids), got), TOL)
    check(f"{flavor} export: from_pretrained logits vs the original", rel_max(hf_logits(back, ids), ref), TOL)
    want2 = hf_greedy(back, pids, 12)
    expect(f"{flavor} export: greedy tokens equal loom's", want2 == have, f"{want2} vs {have}")
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    expect(f"{flavor} generation_config.json: eos is <|endoftext|>",
           gen.get("eos_token_id") == tok.token_to_id("<|endoftext|>"), f"{gen}")

    ck2 = os.path.join(work, f"ck2_{flavor}")
    run("import", "--hf", out, ck2)
    a, b = params_of(ck), params_of(ck2)
    same = a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)
    expect(f"{flavor} export -> import: parameters bit-exact", same, f"{len(a)} tensors")

    t2 = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    enc_same = all(t2.encode(s).ids == tok.encode(s).ids for s in CORPUS[:3] + ["<|endoftext|>x y"])
    expect(f"{flavor} export: tokenizer.json encodes like the original in `tokenizers`", enc_same)
    fast = transformers.AutoTokenizer.from_pretrained(out)
    expect(f"{flavor} export: AutoTokenizer loads it", fast(PROMPT)["input_ids"] == pids,
           f"{fast(PROMPT)['input_ids']} vs {pids}")
    return src


def test_byte(work):
    print("byte tokenizer:")
    model = hf_model("llama", 256)
    src = os.path.join(work, "hf_byte")
    model.save_pretrained(src)
    ck = os.path.join(work, "ck_byte")
    run("import", "--hf", src, ck, "--tokenizer", "byte")
    out = os.path.join(work, "exp_byte")
    run("export", "--hf", ck, out)
    t = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    samples = ["plain ascii", "héllo 日本語", "\x00\x01 tabs\tand\nnewlines  ", "<|endoftext|>"]
    ok = all(t.encode(s).ids == list(s.encode("utf-8")) for s in samples)
    expect("byte model: exported tokenizer.json encodes every byte as its id", ok)
    ok = all(t.decode(list(s.encode("utf-8"))) == s for s in samples)
    expect("byte model: and decodes back", ok)
    ck2 = os.path.join(work, "ck2_byte")
    run("import", "--hf", out, ck2)
    dj = json.load(open(os.path.join(ck2, "step_0000000", "data.json")))
    expect("byte model: re-import records the byte tokenizer", dj["tokenizer"]["id"] == "byte", f"{dj}")
    ids = np.arange(40).reshape(2, 20) * 5 % 256
    check("byte model: logits after export -> import", rel_max(loom_logits(ck2, ids, 256), hf_logits(model, ids)), TOL)


def expect_refused(what, args, needle, nothing_at=None):
    r = run(*args, ok=False)
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    expect(f"refused: {what}", r.returncode != 0 and needle in r.stderr, msg)
    if nothing_at:
        expect(f"  and nothing written at {os.path.basename(nothing_at)}",
               not os.path.exists(os.path.join(nothing_at, "step_0000000", "COMPLETE")))


def test_errors(work, gpt2_src):
    print("bad input:")

    def variant(name, edit_cfg=None, edit_weights=None, extra=None):
        d = os.path.join(work, "bad_" + name)
        shutil.copytree(gpt2_src, d)
        if edit_cfg:
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            edit_cfg(c)
            json.dump(c, open(p, "w"))
        if edit_weights:
            p = os.path.join(d, "model.safetensors")
            w = load_file(p)
            edit_weights(w)
            save_file(w, p, metadata={"format": "pt"})
        if extra:
            open(os.path.join(d, extra), "wb").write(b"\x80\x04not really a pickle")
            os.remove(os.path.join(d, "model.safetensors"))
        return d

    d = variant("arch", edit_cfg=lambda c: c.update(architectures=["BertForMaskedLM"], model_type="bert"))
    expect_refused("unknown architecture", ["import", "--hf", d, d + "_ck"], "BertForMaskedLM", d + "_ck")
    d = variant("missing", edit_weights=lambda w: w.pop("transformer.h.1.mlp.c_fc.bias"))
    expect_refused("missing tensor", ["import", "--hf", d, d + "_ck"], "transformer.h.1.mlp.c_fc.bias", d + "_ck")
    d = variant("shape", edit_cfg=lambda c: c.update(n_inner=100))
    expect_refused("shape mismatch", ["import", "--hf", d, d + "_ck"], "mlp.c_fc.weight' has shape [48, 192], expected [48, 100]", d + "_ck")
    d = variant("extra", edit_weights=lambda w: w.update({"transformer.h.0.attn.q_norm.weight": np.ones(48, np.float32)}))
    expect_refused("unknown tensor", ["import", "--hf", d, d + "_ck"], "transformer.h.0.attn.q_norm.weight", d + "_ck")
    d = variant("pickle", extra="pytorch_model.bin")
    expect_refused("pickle weights", ["import", "--hf", d, d + "_ck"], "pickle", d + "_ck")
    d = variant("act", edit_cfg=lambda c: c.update(activation_function="relu"))
    expect_refused("unsupported activation", ["import", "--hf", d, d + "_ck"], "activation_function", d + "_ck")
    d = variant("notok")
    os.remove(os.path.join(d, "tokenizer.json"))
    expect_refused("no tokenizer", ["import", "--hf", d, d + "_ck"], "--tokenizer", d + "_ck")
    busy = os.path.join(work, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep.txt"), "w").write("mine")
    expect_refused("export into a non-empty directory", ["export", "--hf", os.path.join(work, "ck_gpt2"), busy], "not empty")
    expect("  and the directory is untouched", sorted(os.listdir(busy)) == ["keep.txt"])


def main():
    with tempfile.TemporaryDirectory() as work:
        tok = make_tokenizer(os.path.join(work, "tokenizer.json"), CORPUS)
        gpt2_src = test_flavor(work, "gpt2", tok)
        test_flavor(work, "llama", tok)
        test_byte(work)
        test_errors(work, gpt2_src)
    sys.exit(finish())


if __name__ == "__main__":
    main()
