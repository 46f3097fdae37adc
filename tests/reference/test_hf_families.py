"""Model families through the Hugging Face interop, against `transformers` 5.24 (no network:
every model is built here from a config, random, every parameter perturbed).

Families (one tiny model each; GQA 6 query heads over 2 kv heads unless said):
  llama          LlamaForCausalLM, tied embeddings, attention_bias (q/k/v/o biases)
  llama3         LlamaForCausalLM, rope_type llama3 (factor 8, low 1, high 4, original 16)
  linear         LlamaForCausalLM, rope_type linear (factor 2)
  yarn           LlamaForCausalLM, rope_type yarn (factor 4, original 16: attention factor too)
  mistral        MistralForCausalLM, sliding_window 5 (every layer; sequences of 17..24
                 positions, greedy decoding past the window), head_dim 12 != hidden / heads
  qwen2          Qwen2ForCausalLM (q/k/v biases, no o bias), tied, use_sliding_window with
                 sliding_window 5 and max_window_layers 1 (layer 0 full, layer 1 sliding)
  qwen3          Qwen3ForCausalLM (per-head q/k RMSNorm, head_dim 12 != hidden / heads), tied
  mixtral        MixtralForCausalLM (4 experts, top-2, renormalized; per-expert w1/w3/w2
                 joined into loom's (E, 2F, C) and (E, C, F) expert tensors)
  qwen3moe       Qwen3MoeForCausalLM (4 experts, top-2, norm_topk_prob, q/k norms, head_dim 12)
  qwen2moe       Qwen2MoeForCausalLM (4 experts, top-2, softmax weights not renormalized,
                 q/k/v biases, one shared expert of its own width 40 behind a sigmoid gate)
  phi3           Phi3ForCausalLM (fused qkv_proj and gate_up_proj, split on import),
                 sliding_window 7
  gemma2         Gemma2ForCausalLM (sandwich norms stored as 1 + w, GeGLU, embeddings x sqrt(C),
                 tied; layers 0 slides (window 5), 1 full; attention and final-logit soft-caps,
                 query_pre_attn_scalar 16 != head_dim 12)
  gemma3         Gemma3ForCausalLM (Gemma 2's block + per-head q/k norms (1 + w), no attention
                 soft-cap; rope_parameters per layer type: the full layer linear x2 at theta 1e6,
                 the sliding one default at 1e4)
  olmo2          Olmo2ForCausalLM (post-norms, no pre-norms; q/k RMSNorm over the whole
                 projections, (H*D) and (KVH*D) weights)

For each: `loom import --hf` -> logits (libloom, fp32) equal transformers' (max|d| / max|ref|
<= 1e-5); greedy tokens of `loom generate` (KV cache) equal a full-prefix greedy loop through
libloom (no cache) and transformers' generate, and so do the batched engine's (three prompts
of different lengths at once: `loom generate --prompts --batch 3`); one training step's gradients (libloom
forward/backward of the mean next-token loss) equal transformers' autograd per tensor
(max|d| / max|ref| <= 1e-4); `loom export --hf` loads with from_pretrained as the same
architecture and gives the same logits (1e-5); `training.init_from` the HF directory (qwen3,
mixtral, llama3, qwen2moe, olmo2, gemma2, gemma3) takes its architecture (model.arch.*, model.moe.*) and trains;
LoRA from it (qwen3: q, v, gate, down; mixtral by PEFT's names q_proj, k_proj, v_proj, o_proj;
olmo2: q, k, o, up; gemma2: all-linear) exports as PEFT files that give loom's logits
on the exported base (1e-5), and with --merge-lora as merged weights (1e-5). Then the
refusals: an option loom cannot compute exactly is an error naming the key.
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
import torch.nn.functional as Fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import check, expect, finish, rel_max  # noqa: E402

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
LIB = os.environ.get("LOOM_LIB") or os.path.join(os.path.dirname(__file__), "../../build/libloom.so")
TOL, GTOL = 1e-5, 1e-4
V = 272
torch.manual_seed(0)
torch.set_num_threads(2)
P = ctypes.c_void_p


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 2048)]


class TensorInfo(ctypes.Structure):  # the head of loom_tensor_info (include/loom/model.h)
    _fields_ = [("name", ctypes.c_char * 48), ("layer", ctypes.c_int), ("kind", ctypes.c_int),
                ("offset", ctypes.c_size_t), ("numel", ctypes.c_size_t), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4)]


L = ctypes.CDLL(LIB)
L.loom_load_model.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P), P,
                              ctypes.POINTER(Err)]
L.loom_model_forward.argtypes = [P, P, P, ctypes.c_int, ctypes.c_int]
L.loom_model_forward.restype = ctypes.c_float
L.loom_model_backward.argtypes = [P, ctypes.c_float]
L.loom_model_zero_grad.argtypes = [P]
L.loom_model_logits.argtypes = [P]
L.loom_model_logits.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_grads.argtypes = [P]
L.loom_model_grads.restype = ctypes.POINTER(ctypes.c_float)
L.loom_model_num_tensors.argtypes = [P]
L.loom_model_tensor.argtypes = [P, ctypes.c_int]
L.loom_model_tensor.restype = ctypes.POINTER(TensorInfo)
L.loom_model_valid_targets.argtypes = [P]
L.loom_model_valid_targets.restype = ctypes.c_int64
L.loom_model_free.argtypes = [P]
L.loom_hf_read_config.argtypes = [ctypes.c_char_p, P, P, ctypes.POINTER(Err)]
L.loom_model_create.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P),
                                ctypes.POINTER(Err)]
L.loom_hf_load_params.argtypes = [ctypes.c_char_p, P, ctypes.POINTER(Err)]

BASE = dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=None)
ROPE = lambda **kw: {"rope_parameters": dict(rope_theta=10000.0, **kw)}  # noqa: E731
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(tie_word_embeddings=True, attention_bias=True, **ROPE(rope_type="default"))),
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(tie_word_embeddings=False, **ROPE(rope_type="llama3", factor=8.0,
                                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_max_position_embeddings=16))),
    "linear": ("LlamaConfig", "LlamaForCausalLM",
               dict(tie_word_embeddings=False, **ROPE(rope_type="linear", factor=2.0))),
    "yarn": ("LlamaConfig", "LlamaForCausalLM",
             dict(tie_word_embeddings=False, **ROPE(rope_type="yarn", factor=4.0,
                                                     original_max_position_embeddings=16))),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(sliding_window=5, head_dim=12, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
                   max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=12, tie_word_embeddings=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                     tie_word_embeddings=False)),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      norm_topk_prob=True, head_dim=12, tie_word_embeddings=False)),
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                 dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      shared_expert_intermediate_size=40, norm_topk_prob=False,
                      tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
                  attention_dropout=0.0, sliding_window=7)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(tie_word_embeddings=False)),
    # soft-caps far below Gemma 2's 50 / 30 so that they bend this tiny model's scores and logits
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=12, sliding_window=5, query_pre_attn_scalar=16,
                    attn_logit_softcapping=1.5, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=12, sliding_window=5, sliding_window_pattern=2,
                    query_pre_attn_scalar=16, final_logit_softcapping=3.0,
                    rope_parameters=dict(full_attention=dict(rope_type="linear", factor=2.0,
                                                             rope_theta=1000000.0),
                                         sliding_attention=dict(rope_type="default",
                                                                rope_theta=10000.0)))),
}


def hf_model(fam):
    cname, mname, extra = FAMILIES[fam]
    kw = dict(BASE)
    kw.update(extra)
    cfg = getattr(transformers, cname)(**kw)
    m = getattr(transformers, mname)(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return m.eval()


def run(*args, ok=True):
    r = subprocess.run([LOOM, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise RuntimeError(f"loom {' '.join(args)} failed: {r.stderr}")
    return r


def loom_infer(ckpt, B):
    m = P()
    err = Err()
    if L.loom_load_model(ckpt.encode(), B, 0, ctypes.byref(m), None, ctypes.byref(err)) != 0:
        raise RuntimeError(err.msg.decode())
    return m


def loom_logits(m, ids):
    B, T = ids.shape
    x = np.ascontiguousarray(ids, dtype=np.int32)
    L.loom_model_forward(m, x.ctypes.data, None, B, T)
    return np.ctypeslib.as_array(L.loom_model_logits(m), shape=(B * T * V,)).copy().reshape(B, T, V)


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def loom_greedy_nocache(m, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        lg = loom_logits(m, np.array([seq]))
        seq.append(int(np.argmax(lg[0, -1])))
    return seq[len(prompt):]


def hf_greedy(model, prompt, n, cache):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=cache)
    return out[0, len(prompt):].tolist()


def loom_name_grads(src_dir, ids):
    """one forward/backward of the mean next-token loss through libloom: {loom name: grad}"""
    err = Err()
    cfg = ctypes.create_string_buffer(4096)  # a loom_model_config (240 bytes today)
    m = P()
    B, T = ids.shape[0], ids.shape[1] - 1
    assert L.loom_hf_read_config(src_dir.encode(), cfg, None, ctypes.byref(err)) == 0, err.msg
    assert L.loom_model_create(cfg, None, B, T, ctypes.byref(m), ctypes.byref(err)) == 0, err.msg
    assert L.loom_hf_load_params(src_dir.encode(), m, ctypes.byref(err)) == 0, err.msg
    x = np.ascontiguousarray(ids[:, :-1], dtype=np.int32)
    y = np.ascontiguousarray(ids[:, 1:], dtype=np.int32)
    L.loom_model_zero_grad(m)
    loss = L.loom_model_forward(m, x.ctypes.data, y.ctypes.data, B, T)
    L.loom_model_backward(m, 1.0 / L.loom_model_valid_targets(m))
    g = L.loom_model_grads(m)
    out = {}
    for i in range(L.loom_model_num_tensors(m)):
        t = L.loom_model_tensor(m, i).contents
        shape = tuple(t.shape[d] for d in range(t.ndim))
        out[t.name.decode()] = np.ctypeslib.as_array(
            ctypes.cast(ctypes.addressof(g.contents) + 4 * t.offset, ctypes.POINTER(ctypes.c_float)),
            shape=(t.numel,)).copy().reshape(shape)
    L.loom_model_free(m)
    return loss, out


def hf_name_grads(model, fam, ids):
    """transformers' autograd of the same loss, in loom's names and layout"""
    model.zero_grad()
    x = torch.tensor(ids[:, :-1], dtype=torch.long)
    y = torch.tensor(ids[:, 1:], dtype=torch.long)
    logits = model(x).logits
    loss = Fn.cross_entropy(logits.reshape(-1, V).double(), y.reshape(-1))
    loss.backward()
    gr = {n: p.grad.detach().double().numpy() for n, p in model.named_parameters()}
    c = model.config
    D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    QH, KV, F = c.num_attention_heads * D, c.num_key_value_heads * D, c.intermediate_size
    out = {"wte": gr["model.embed_tokens.weight"], "lnf_w": gr["model.norm.weight"]}
    if "lm_head.weight" in gr and not c.tie_word_embeddings:
        out["lm_head"] = gr["lm_head.weight"]
    for l in range(c.num_hidden_layers):
        p = f"model.layers.{l}."
        o = f"layers.{l}."
        if p + "input_layernorm.weight" in gr:  # (OLMo 2 has no pre-norms)
            out[o + "ln1_w"] = gr[p + "input_layernorm.weight"]
        if p + "post_feedforward_layernorm.weight" in gr:  # post / sandwich norms
            out[o + "attn_post_w"] = gr[p + "post_attention_layernorm.weight"]
            out[o + "ffn_post_w"] = gr[p + "post_feedforward_layernorm.weight"]
            if p + "pre_feedforward_layernorm.weight" in gr:
                out[o + "ln2_w"] = gr[p + "pre_feedforward_layernorm.weight"]
        else:
            out[o + "ln2_w"] = gr[p + "post_attention_layernorm.weight"]
        out[o + "attn_proj_w"] = gr[p + "self_attn.o_proj.weight"]
        out[o + "fc_proj_w"] = gr.get(p + "mlp.down_proj.weight")
        if fam == "phi3":
            qkv, gu = gr[p + "self_attn.qkv_proj.weight"], gr[p + "mlp.gate_up_proj.weight"]
            out[o + "q_w"], out[o + "k_w"], out[o + "v_w"] = qkv[:QH], qkv[QH:QH + KV], qkv[QH + KV:]
            out[o + "gate_w"], out[o + "up_w"] = gu[:F], gu[F:]
            continue
        for s, n in (("q", "q_w"), ("k", "k_w"), ("v", "v_w")):
            out[o + n] = gr[p + f"self_attn.{s}_proj.weight"]
            if p + f"self_attn.{s}_proj.bias" in gr:
                out[o + s + "_b"] = gr[p + f"self_attn.{s}_proj.bias"]
        if p + "self_attn.o_proj.bias" in gr:
            out[o + "attn_proj_b"] = gr[p + "self_attn.o_proj.bias"]
        for s in ("q", "k"):
            if p + f"self_attn.{s}_norm.weight" in gr:
                out[o + f"{s}_norm_w"] = gr[p + f"self_attn.{s}_norm.weight"]
        if p + "mlp.experts.gate_up_proj" in gr:  # MoE: the router and the fused experts
            out[o + "moe_router_w"] = gr[p + "mlp.gate.weight"]
            out[o + "moe_fc_w"] = gr[p + "mlp.experts.gate_up_proj"]  # (E, 2F, C): gate | up
            out[o + "moe_proj_w"] = gr[p + "mlp.experts.down_proj"]   # (E, C, F)
            if p + "mlp.shared_expert_gate.weight" in gr:  # Qwen2-MoE: one gated shared expert
                sh = p + "mlp.shared_expert."
                out[o + "moe_shared_fc_w"] = np.concatenate(
                    [gr[sh + "gate_proj.weight"], gr[sh + "up_proj.weight"]])[None]
                out[o + "moe_shared_proj_w"] = gr[sh + "down_proj.weight"][None]
                out[o + "moe_shared_gate_w"] = gr[p + "mlp.shared_expert_gate.weight"]
            del out[o + "fc_proj_w"]
            continue
        out[o + "gate_w"] = gr[p + "mlp.gate_proj.weight"]
        out[o + "up_w"] = gr[p + "mlp.up_proj.weight"]
    return float(loss.detach()), out


def test_family(work, fam):
    print(f"{fam}:")
    _, mname, _ = FAMILIES[fam]
    model = hf_model(fam)
    src = os.path.join(work, f"hf_{fam}")
    model.save_pretrained(src)
    ck = os.path.join(work, f"ck_{fam}")
    run("import", "--hf", src, ck, "--tokenizer", "byte")
    g = np.random.default_rng(5)
    ids = g.integers(0, V, size=(2, 24))
    m = loom_infer(ck, 2)
    check(f"{fam} import: logits vs transformers", rel_max(loom_logits(m, ids), hf_logits(model, ids)), TOL)
    L.loom_model_free(m)

    prompt = list(b"the quick")
    n = 12
    m = loom_infer(ck, 1)
    nocache = loom_greedy_nocache(m, prompt, n)
    L.loom_model_free(m)
    r = run("generate", ck, "--prompt", "the quick", "--tokens", str(n), "--temperature", "0",
            "--format", "ids")
    cached = [int(x) for x in r.stdout.split()]
    want = hf_greedy(model, prompt, n, True)
    expect(f"{fam} greedy: loom with KV cache == without", cached == nocache, f"{cached} vs {nocache}")
    expect(f"{fam} greedy: loom == transformers (cache and no cache)",
           nocache == want == hf_greedy(model, prompt, n, False), f"{nocache} vs {want}")

    ids = g.integers(0, V, size=(2, 17))
    lloss, lg = loom_name_grads(src, ids)
    hloss, hg = hf_name_grads(model, fam, ids)
    check(f"{fam} train step: loss vs transformers", abs(lloss - hloss) / abs(hloss), TOL)
    expect(f"{fam} train step: the same tensors", set(lg) == set(hg),
           f"{sorted(set(lg) ^ set(hg))}")
    worst = max((rel_max(lg[k], hg[k]), k) for k in lg if k in hg)
    check(f"{fam} train step: gradients vs transformers' autograd (worst {worst[1]})", worst[0], GTOL)

    out = os.path.join(work, f"out_{fam}")
    run("export", "--hf", ck, out)
    arch = json.load(open(os.path.join(out, "config.json")))["architectures"]
    expect(f"{fam} export: architecture {mname}", arch == [mname], str(arch))
    back = getattr(transformers, mname).from_pretrained(out).eval()
    check(f"{fam} export: from_pretrained logits vs the original", rel_max(hf_logits(back, ids), hf_logits(model, ids)), TOL)


def batched(work, fam):
    """the batched engine (`loom generate --prompts --batch`: ragged prefill and decode steps
    of several sequences at once) gives each prompt transformers' greedy tokens"""
    model = getattr(transformers, FAMILIES[fam][1]).from_pretrained(os.path.join(work, f"hf_{fam}")).eval()
    prompts = ["the quick", "ab", "a longer prompt of bytes"]
    pf = os.path.join(work, f"prompts_{fam}.txt")
    with open(pf, "w") as f:
        f.write("".join(p + "\n" for p in prompts))
    n = 10
    r = run("generate", os.path.join(work, f"ck_{fam}"), "--prompts", pf, "--tokens", str(n),
            "--temperature", "0", "--batch", "3", "--format", "ids")
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    got = [x["ids"] for x in sorted(rows, key=lambda x: x["index"])]
    want = [hf_greedy(model, list(p.encode()), n, True) for p in prompts]
    expect(f"{fam} batched engine (3 prompts, batch 3): greedy tokens == transformers'",
           got == want, f"{got} vs {want}")


def multimodal_text(work):
    """Gemma3ForConditionalGeneration (Gemma 3 4B and up ship as it): `loom import` takes its
    language model (config.json's text_config, the language_model.model.* tensors; the vision
    tower and projector left out): logits equal the multimodal model's on text, and the export
    is a Gemma3ForCausalLM that transformers loads with the same logits (text_config's
    final_logit_softcapping, which the multimodal model does not apply, is left out)"""
    print("gemma3 multimodal:")
    tc = dict(BASE, head_dim=12, sliding_window=5, sliding_window_pattern=2,
              query_pre_attn_scalar=16, final_logit_softcapping=3.0)
    vc = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=tc, vision_config=vc, mm_tokens_per_image=4,
                                    image_token_index=V - 2, boi_token_index=V - 4,
                                    eoi_token_index=V - 3)
    model = transformers.Gemma3ForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    model.eval()
    src, ck, out = (os.path.join(work, n) for n in ("hf_g3mm", "ck_g3mm", "out_g3mm"))
    model.save_pretrained(src)
    run("import", "--hf", src, ck, "--tokenizer", "byte")
    ids = np.random.default_rng(11).integers(0, V - 4, size=(2, 20))  # no image tokens
    m = loom_infer(ck, 2)
    want = hf_logits(model, ids)
    check("gemma3 multimodal import: text logits vs transformers", rel_max(loom_logits(m, ids), want), TOL)
    L.loom_model_free(m)
    run("export", "--hf", ck, out)
    arch = json.load(open(os.path.join(out, "config.json")))["architectures"]
    expect("gemma3 multimodal export: its language model as Gemma3ForCausalLM",
           arch == ["Gemma3ForCausalLM"], str(arch))
    back = transformers.Gemma3ForCausalLM.from_pretrained(out).eval()
    check("gemma3 multimodal export: from_pretrained logits vs the multimodal model's",
          rel_max(hf_logits(back, ids), want), TOL)


def lora(work, fam, targets):
    """LoRA fine-tuning from the family's directory (2 steps), then export: PEFT's adapter files
    on the exported base give loom's logits (1e-5), and so does --merge-lora"""
    import peft
    cfg = os.path.join(work, f"init_{fam}.yaml")
    lcfg = os.path.join(work, f"lora_{fam}.yaml")
    with open(lcfg, "w") as f:
        f.write(open(cfg).read().replace(f"init_run_{fam}", f"lora_run_{fam}") +
                f"finetune:\n  lora:\n    rank: 4\n    alpha: 8\n    targets: [{targets}]\n")
    r = run("train", lcfg, "--set", "training.lr=1e-2", "--set", "training.warmup=0",
            "--set", "checkpoint.every=2", ok=False)
    if not expect(f"{fam} LoRA ({targets}) fine-tunes", r.returncode == 0, r.stderr.strip()[-300:]):
        return
    ids = np.random.default_rng(9).integers(0, V, size=(2, 12))
    m = loom_infer(f"{work}/lora_run_{fam}", 2)
    want = loom_logits(m, ids)
    L.loom_model_free(m)
    out = f"{work}/lora_out_{fam}"
    run("export", "--hf", f"{work}/lora_run_{fam}", out)
    mname = FAMILIES[fam][1]
    pm = peft.PeftModel.from_pretrained(getattr(transformers, mname).from_pretrained(out), out).eval()
    check(f"{fam} LoRA export: PEFT base + adapters logits vs loom", rel_max(hf_logits(pm, ids), want), TOL)
    base = getattr(transformers, mname).from_pretrained(f"{work}/hf_{fam}").eval()
    moved = rel_max(want, hf_logits(base, ids))
    expect(f"{fam} LoRA: the adapters changed the logits", moved > 1e-4, f"{moved:.2e}")
    out2 = f"{work}/lora_merged_{fam}"
    run("export", "--hf", f"{work}/lora_run_{fam}", out2, "--merge-lora")
    mm = getattr(transformers, mname).from_pretrained(out2).eval()
    check(f"{fam} LoRA export --merge-lora: logits vs loom", rel_max(hf_logits(mm, ids), want), TOL)


def init_from(work, fam):
    """training.init_from the family's Hugging Face directory: the source's architecture
    (model.flavor, model.arch.*, model.moe.*) is taken, and the first step's loss is
    transformers' loss on the same batch"""
    src = os.path.join(work, f"hf_{fam}")
    ds = os.path.join(work, "ds")
    if not os.path.exists(os.path.join(ds, "data")):
        os.makedirs(os.path.join(ds, "corpus"))
        with open(os.path.join(ds, "corpus", "a.txt"), "w") as f:
            for i in range(60):
                f.write(f"document {i}: the quick brown fox jumps over {i % 7} lazy dogs\n%\n")
        with open(os.path.join(ds, "recipe.yaml"), "w") as f:
            f.write(f"name: fam\nsources:\n  - name: c\n    kind: text\n    path: {ds}/corpus\n"
                    f"    split: \"\\n%\\n\"\ntokenizer: byte\nseq_len: 16\nval_fraction: 0.1\n"
                    f"output: {ds}/data\nshard_tokens: 20000\n")
        run("data", "build", os.path.join(ds, "recipe.yaml"))
    cfg = os.path.join(work, f"init_{fam}.yaml")
    with open(cfg, "w") as f:
        f.write(f"run:\n  dir: {work}/init_run_{fam}\ndata:\n  train: {ds}/data/train\n"
                f"  val: {ds}/data/val\ntraining:\n  init_from: {src}\n  steps: 2\n"
                f"  batch_size: 2\n  seq_len: 16\neval:\n  every: 0\ncheckpoint:\n  every: 0\n")
    r = run("train", cfg, ok=False)
    ok = r.returncode == 0
    rows = [json.loads(l) for l in open(f"{work}/init_run_{fam}/metrics.jsonl")] if ok else []
    losses = [x["loss"] for x in rows if "loss" in x]
    expect(f"{fam} training.init_from the HF directory trains", ok and len(losses) == 2,
           f"{losses} {r.stderr.strip()[-300:] if not ok else ''}")


def refusals(work):
    print("refusals:")
    cases = [
        ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, sliding_window=16),
         "'sliding_window'"),
        ("LlamaConfig", "LlamaForCausalLM", ROPE(rope_type="dynamic", factor=2.0), "rope_type"),
        ("Qwen2Config", "Qwen2ForCausalLM",
         dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=16,
              layer_types=["sliding_attention", "full_attention", "full_attention"]),
         "'layer_types'"),
        ("LlamaConfig", "LlamaForCausalLM", dict(mlp_bias=True), "'mlp_bias'"),
        ("LlamaConfig", "LlamaForCausalLM", dict(hidden_act="gelu"), "'hidden_act'"),
        ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         dict(num_experts=4, moe_intermediate_size=24, shared_expert_intermediate_size=40,
              decoder_sparse_step=2), "'decoder_sparse_step'"),
        ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8, hidden_activation="gelu"),
         "'hidden_activation'"),
        ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=8, use_bidirectional_attention=True),
         "'use_bidirectional_attention'"),
    ]
    for i, (cname, mname, extra, key) in enumerate(cases):
        kw = dict(BASE)
        kw.update(extra)
        d = os.path.join(work, f"bad_{i}")
        getattr(transformers, mname)(getattr(transformers, cname)(**kw)).save_pretrained(d)
        r = run("import", "--hf", d, os.path.join(work, f"bad_ck_{i}"), "--tokenizer", "byte", ok=False)
        expect(f"{mname} {extra}: refused naming {key}", r.returncode != 0 and key in r.stderr,
               r.stderr.strip()[:200])


def main():
    work = tempfile.mkdtemp(prefix="loom_hf_fam_")
    try:
        only = sys.argv[1:] or list(FAMILIES)
        for fam in only:
            test_family(work, fam)
            batched(work, fam)
        if "gemma3" in only:
            multimodal_text(work)
        for fam in (f for f in ("qwen3", "mixtral", "llama3", "qwen2moe", "olmo2", "gemma2", "gemma3")
                    if f in only):
            init_from(work, fam)
        for fam, targets in (("qwen3", "q, v, gate, down"), ("mixtral", "q_proj, k_proj, v_proj, o_proj"),
                             ("olmo2", "q, k, o, up"), ("gemma2", "all-linear")):
            if fam in only:
                lora(work, fam, targets)
        if not sys.argv[1:]:
            refusals(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
