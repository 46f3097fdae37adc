"""loom export --gguf (src/interop/gguf.c, docs/inference.md "GGUF export") read back by the
PyPI `gguf` package (llama.cpp's own reader, gguf-py).

Tiny random Hugging Face models built here with transformers (LlamaForCausalLM with GQA,
untied; Qwen2ForCausalLM with q/k/v biases, tied, and a byte-level BPE tokenizer with merges
trained here by `tokenizers`, plus a ChatML chat template; GPT2LMHeadModel), imported with
`loom import --hf`, exported as GGUF at f32, bf16, q8_0 and q4_k (and a 256-wide Llama, whose
matrices have rows of whole Q4_K blocks, at q4_k). Checked against the transformers
model's own tensors, converted here as llama.cpp's convert_hf_to_gguf.py converts them (this
file's table of llama.cpp names; GPT-2's Conv1D matrices transposed; for the llama
architecture q and k rows permuted, HF's rotate-half layout to ggml's interleaved pairs, with
the converter's formula w.reshape(H, 2, D/2, C).swapaxes(1, 2)):
  - the metadata: architecture, hyper-parameters, tokens (by id), token types, merges,
    eos id, chat template;
  - every tensor's name, shape (innermost first) and type (1-D f32, 2-D the requested type);
  - values: f32 bit for bit; bf16 equal to torch's rounding; q8_0 the bytes gguf-py's own
    Q8_0 quantizer writes for the same f32 tensor, bit for bit, and dequantized by gguf-py;
    q4_k: the matrices with rows of whole 256-blocks (but the embedding and the head) in Q4_K,
    the bytes loom's own quantizer (q4k_quantize_rows in libloom: --weights int4's) writes for
    the same rows, dequantized by gguf-py to within 10% RMS of the weights (4 bits: ~7%), the
    others in Q8_0 as above;
  - the RoPE permutation's meaning: attention scores q.k over 8 positions computed from the
    GGUF weights with ggml's interleaved RoPE equal those from the HF weights with
    transformers' rotate-half RoPE (1e-5);
  - bad requests: an unknown --type (exit 2), an architecture with no GGUF export (qwen3,
    exit 1, named), an unwritable OUT (exit 1): each a clear message, no OUT and no temp
    file left."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import expect, finish  # noqa: E402

import gguf  # noqa: E402
import ctypes  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
LIB = ctypes.CDLL(os.environ.get("LOOM_LIB") or os.path.join(os.path.dirname(LOOM), "libloom.so"))
LIB.q4k_quantize_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
Q4K_ERR = []
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def theta(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return rp.get("rope_theta") or cfg.rope_theta


def run(args, code=0):
    r = subprocess.run([LOOM] + args, capture_output=True, text=True)
    if r.returncode != code:
        print(r.stdout, r.stderr)
    return r


def bpe_tokenizer(d, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab - 2, special_tokens=["<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog " * 3, "hello there, general kenobi"] * 20
    tok.train_from_iterator(text, tr)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>"}, f)
    return json.load(open(os.path.join(d, "tokenizer.json")))


def models(root):
    g = torch.Generator().manual_seed(3)
    out = {}
    cfgs = {
        "llama": transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64,
                                          rms_norm_eps=1e-5, rope_theta=10000.0,
                                          tie_word_embeddings=False),
        "qwen2": transformers.Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64,
                                          rms_norm_eps=1e-6, rope_theta=1e6,
                                          tie_word_embeddings=True),
        # rows of whole 256-blocks (q4_k); untied: its head is an output.weight of its own
        "llama256": transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                             num_hidden_layers=1, num_attention_heads=4,
                                             num_key_value_heads=2, max_position_embeddings=64,
                                             rms_norm_eps=1e-5, rope_theta=10000.0,
                                             tie_word_embeddings=False),
        "gpt2": transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                                        n_positions=64, layer_norm_epsilon=1e-5),
        "qwen3": transformers.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=1, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16,
                                          max_position_embeddings=64),
    }
    for name, cfg in cfgs.items():
        m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        d = os.path.join(root, "hf_" + name)
        m.save_pretrained(d)
        tj = bpe_tokenizer(d, 320) if name == "qwen2" else None
        ck = os.path.join(root, "ck_" + name)
        tokarg = [] if tj else ["--tokenizer", "byte"]
        r = run(["import", "--hf", d, ck] + tokarg)
        expect(f"{name}: import", r.returncode == 0, r.stderr[-300:])
        out[name] = (m, cfg, ck, tj)
    return out


LLAMA_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GPT2_LAYER = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def expected_tensors(name, m, cfg):
    """llama.cpp's name -> the f32 array it holds (numpy, (rows, cols) or (n))"""
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()}
    out = {}
    if name == "gpt2":
        out["token_embd.weight"] = sd["transformer.wte.weight"]
        out["output.weight"] = sd["transformer.wte.weight"]  # the converter's copy
        out["position_embd.weight"] = sd["transformer.wpe.weight"]
        out["output_norm.weight"] = sd["transformer.ln_f.weight"]
        out["output_norm.bias"] = sd["transformer.ln_f.bias"]
        for k, v in sd.items():
            if not k.startswith("transformer.h.") or k.endswith(".attn.bias") or "masked_bias" in k:
                continue
            l, rest = k[len("transformer.h."):].split(".", 1)
            mod, suf = rest.rsplit(".", 1)
            if v.ndim == 2:
                v = v.T  # Conv1D (in, out) -> (out, in)
            out[f"blk.{l}.{GPT2_LAYER[mod]}.{suf}"] = v
        return out
    H, KVH, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads

    def permute(w, h):  # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(h, 2, w.shape[0] // h // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    out["token_embd.weight"] = sd["model.embed_tokens.weight"]
    out["output_norm.weight"] = sd["model.norm.weight"]
    if not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for k, v in sd.items():
        if not k.startswith("model.layers."):
            continue
        l, rest = k[len("model.layers."):].split(".", 1)
        mod, suf = rest.rsplit(".", 1)
        if name.startswith("llama") and mod == "self_attn.q_proj":
            v = permute(v, H)
        if name.startswith("llama") and mod == "self_attn.k_proj":
            v = permute(v, KVH)
        out[f"blk.{l}.{LLAMA_LAYER[mod]}.{suf}"] = v
    return out


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def check_file(name, path, typ, m, cfg, tj):
    r = gguf.GGUFReader(path)
    arch = {"llama": "llama", "llama256": "llama", "qwen2": "qwen2", "gpt2": "gpt2"}[name]
    expect(f"{name} {typ}: architecture", field(r, "general.architecture") == arch)
    if name == "gpt2":
        hp = {"context_length": cfg.n_positions, "embedding_length": cfg.n_embd,
              "block_count": cfg.n_layer, "feed_forward_length": 4 * cfg.n_embd,
              "attention.head_count": cfg.n_head}
        eps = ("attention.layer_norm_epsilon", cfg.layer_norm_epsilon)
    else:
        hp = {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
              "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
              "attention.head_count": cfg.num_attention_heads,
              "attention.head_count_kv": cfg.num_key_value_heads,
              "rope.dimension_count": cfg.hidden_size // cfg.num_attention_heads}
        eps = ("attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
        expect(f"{name} {typ}: rope.freq_base",
               np.float32(field(r, f"{arch}.rope.freq_base")) == np.float32(theta(cfg)))
    for k, v in hp.items():
        expect(f"{name} {typ}: {arch}.{k}", field(r, f"{arch}.{k}") == v,
               f"{field(r, f'{arch}.{k}')} != {v}")
    expect(f"{name} {typ}: {eps[0]}", np.float32(field(r, f"{arch}.{eps[0]}")) == np.float32(eps[1]))
    ftype = {"f32": 0, "bf16": 32, "q8_0": 7, "q4_k": 14}[typ]
    expect(f"{name} {typ}: general.file_type", field(r, "general.file_type") == ftype)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    expect(f"{name} {typ}: tokenizer.ggml.model", field(r, "tokenizer.ggml.model") == "gpt2")
    expect(f"{name} {typ}: vocab_size tokens", len(tokens) == len(types) == cfg.vocab_size)
    if tj:  # the BPE: every id's token, the specials as control tokens, the merges
        vocab = tj["model"]["vocab"]
        expect(f"{name}: tokens by id", all(tokens[i] == t for t, i in vocab.items()))
        for a in tj["added_tokens"]:
            expect(f"{name}: special {a['content']}", tokens[a["id"]] == a["content"] and types[a["id"]] == 3)
        merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        expect(f"{name}: merges", field(r, "tokenizer.ggml.merges") == merges,
               f"{len(field(r, 'tokenizer.ggml.merges') or [])} vs {len(merges)}")
        expect(f"{name}: eos = <|im_end|>", field(r, "tokenizer.ggml.eos_token_id") == vocab.get(
            "<|im_end|>", [a["id"] for a in tj["added_tokens"] if a["content"] == "<|im_end|>"][0]))
        tpl = field(r, "tokenizer.chat_template")
        expect(f"{name}: chat template (ChatML)", tpl is not None and "<|im_start|>" in tpl, str(tpl)[:80])
    else:  # the byte tokenizer: id b is byte b in GPT-2's byte-to-unicode spelling
        expect(f"{name}: byte tokens", tokens[ord("a")] == "a" and tokens[32] == "\u0120")
    want = expected_tensors(name, m, cfg)
    got = {t.name: t for t in r.tensors}
    expect(f"{name} {typ}: tensor names", set(got) == set(want),
           f"extra {sorted(set(got) - set(want))[:4]}, missing {sorted(set(want) - set(got))[:4]}")
    qt = {"f32": QT.F32, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_k": QT.Q4_K}[typ]
    for n, w in want.items():
        if n not in got:
            continue
        t = got[n]
        expect(f"{name} {typ}: {n} shape", list(t.shape) == list(w.shape[::-1]), f"{list(t.shape)}")
        tt = QT.F32 if w.ndim == 1 else qt
        if tt == QT.Q4_K and (w.shape[1] % 256 or n in ("token_embd.weight", "output.weight")):
            tt = QT.Q8_0  # what --weights int4 holds in Q8_0
        if not expect(f"{name} {typ}: {n} type", t.tensor_type == tt, t.tensor_type.name):
            continue
        w32 = np.ascontiguousarray(w, dtype=np.float32)
        if tt == QT.F32:
            ok = np.array_equal(np.asarray(t.data).reshape(w.shape).view(np.uint32), w32.view(np.uint32))
        elif tt == QT.BF16:
            ref = torch.from_numpy(w32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            ok = np.array_equal(np.asarray(t.data).view(np.uint16).reshape(w.shape), ref)
        elif tt == QT.Q4_K:
            # the bytes loom's own Q4_K quantizer (--weights int4's, through libloom) writes for
            # the same rows; dequantized by gguf-py: within 4 bits' error of the weights
            ref = np.zeros((w.shape[0], w.shape[1] // 256 * 144), dtype=np.uint8)
            LIB.q4k_quantize_rows(ref.ctypes.data, w32.ctypes.data, w.shape[0], w.shape[1])
            raw = np.asarray(t.data).view(np.uint8).reshape(ref.shape)
            ok = np.array_equal(raw, ref)
            dq = gguf.quants.dequantize(raw, QT.Q4_K).reshape(w.shape)
            rel = np.sqrt(((dq - w32) ** 2).mean() / (w32 ** 2).mean())
            ok = ok and rel < 0.1
            Q4K_ERR.append(rel)
        else:
            ref = gguf.quants.quantize(w32, QT.Q8_0)
            ok = np.array_equal(np.asarray(t.data).view(np.uint8).reshape(ref.shape), ref)
            dq = gguf.quants.dequantize(np.asarray(t.data), QT.Q8_0).reshape(w.shape)
            ok = ok and np.abs(dq - w32).max() <= np.abs(w32).max() / 127 * 0.6  # half a step + fp16's
        if not ok:
            expect(f"{name} {typ}: {n} values", False)
    return r


def rope_scores(name, m, cfg, r):
    """q.k over 8 positions: HF weights + rotate-half RoPE vs GGUF weights + interleaved RoPE"""
    H, KVH = cfg.num_attention_heads, cfg.num_key_value_heads
    C, D, T = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads, 8
    sd = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    wq, wk = sd["model.layers.0.self_attn.q_proj.weight"], sd["model.layers.0.self_attn.k_proj.weight"]
    got = {t.name: np.asarray(t.data, dtype=np.float64) for t in r.tensors}
    gq = got["blk.0.attn_q.weight"].reshape(H * D, C)
    gk = got["blk.0.attn_k.weight"].reshape(KVH * D, C)
    x = np.random.default_rng(0).standard_normal((T, C))
    inv = theta(cfg) ** (-np.arange(0, D, 2) / D)
    ang = np.arange(T)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = np.cos(ang), np.sin(ang)

    def half(v):  # (T, heads, D), HF: pairs (i, i + D/2)
        a, b = v[..., : D // 2], v[..., D // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    def inter(v):  # ggml mode 0: pairs (2i, 2i + 1)
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        o = np.empty_like(v)
        o[..., 0::2], o[..., 1::2] = a * c - b * s, b * c + a * s
        return o

    def scores(q, k):  # (H, T, T) with GQA
        k = np.repeat(k, H // KVH, axis=1)
        return np.einsum("thd,shd->hts", q, k)

    s_hf = scores(half((x @ wq.T).reshape(T, H, D)), half((x @ wk.T).reshape(T, KVH, D)))
    s_gg = scores(inter((x @ gq.T).reshape(T, H, D)), inter((x @ gk.T).reshape(T, KVH, D)))
    err = np.abs(s_hf - s_gg).max() / np.abs(s_hf).max()
    expect(f"{name}: attention scores, GGUF + ggml RoPE = HF + rotate-half RoPE", err < 1e-5, f"{err:.2e}")
    # and the unpermuted weights would not be: the check can fail
    s_bad = scores(inter((x @ wq.T).reshape(T, H, D)), inter((x @ wk.T).reshape(T, KVH, D)))
    expect(f"{name}: (unpermuted weights differ)", np.abs(s_hf - s_bad).max() / np.abs(s_hf).max() > 1e-2)


def main():
    with tempfile.TemporaryDirectory() as root:
        ms = models(root)
        for name in ("llama", "qwen2", "gpt2", "llama256"):
            m, cfg, ck, tj = ms[name]
            for typ in ("f32", "bf16", "q8_0", "q4_k") if name != "llama256" else ("q4_k",):
                out = os.path.join(root, f"{name}-{typ}.gguf")
                res = run(["export", "--gguf", ck, out, "--type", typ])
                if not expect(f"{name} {typ}: export", res.returncode == 0, res.stderr[-300:]):
                    continue
                r = check_file(name, out, typ, m, cfg, tj)
                if name == "llama" and typ == "f32":
                    rope_scores(name, m, cfg, r)
        expect("q4_k: some matrices in Q4_K", len(Q4K_ERR) >= 6, str(len(Q4K_ERR)))
        print(f"q4_k: RMS error of the dequantized matrices {min(Q4K_ERR):.4f}..{max(Q4K_ERR):.4f} of their RMS")
        ck = ms["llama"][2]
        bad = os.path.join(root, "bad.gguf")
        res = run(["export", "--gguf", ck, bad, "--type", "q4_0"], code=2)
        expect("--type q4_0: exit 2", res.returncode == 2 and "--type 'q4_0'" in res.stderr, res.stderr)
        res = run(["export", "--gguf", ms["qwen3"][2], bad], code=1)
        expect("qwen3: exit 1 naming it", res.returncode == 1 and "'qwen3'" in res.stderr, res.stderr)
        res = run(["export", "--gguf", ck, os.path.join(root, "no/such/dir/x.gguf")], code=1)
        expect("unwritable OUT: exit 1", res.returncode == 1 and "cannot create" in res.stderr, res.stderr)
        expect("no OUT and no temp file left", not os.path.exists(bad) and
               not glob.glob(os.path.join(root, "*.tmp.*")))
    return finish("gguf export: metadata, names, shapes, types and values as llama.cpp's converter")


if __name__ == "__main__":
    sys.exit(main())
