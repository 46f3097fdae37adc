"""Chat / tool-use data with a loss mask, against Hugging Face (`transformers`, `tokenizers`).

  * `loom data build` of a `kind: chat` source (OpenAI messages: system, user, assistant with
    tool_calls (arguments as JSON text and as objects), tool results, text-part lists) with the
    chatml template and a BPE tokenizer.json (<|im_start|>, <|im_end|> as special tokens) writes
    exactly the token ids and assistant mask that transformers' apply_chat_template(...,
    return_assistant_tokens_mask=True) gives with the equivalent Jinja template;
  * the byte tokenizer and the llama3 template: every masked byte lies in an assistant turn and
    every assistant turn's content is masked;
  * the trainer applies the mask: step 1's loss and gradient norm of `loom train` (init_from a
    random HF Llama) equal PyTorch's masked cross-entropy (mean over assistant targets) and its
    gradient norm on the same batch; the unmasked loss differs (the check can fail);
  * pack: false pads every conversation to a multiple of seq_len (mask 0), so each starts a
    window; too_long: drop drops (and counts) a conversation longer than seq_len.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomlib import check, expect, finish  # noqa: E402

import transformers  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers  # noqa: E402

transformers.logging.set_verbosity_error()
LOOM = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(__file__), "../../build/loom")
torch.set_num_threads(2)

CHATML_JINJA = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{%- if m.content -%}{{ m.content }}{%- endif -%}"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    "{%- if loop.index0 > 0 or m.content -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<tool_call>\\n' + ({'name': tc.function.name, 'arguments': tc.function.arguments} | tojson) + '\\n</tool_call>' }}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}")


def conversations(n, rng):
    ops = [("add", "plus", lambda a, b: a + b), ("mul", "times", lambda a, b: a * b)]
    out = []
    for i in range(n):
        name, word, f = ops[i % 2]
        a, b = int(rng.integers(0, 50)), int(rng.integers(0, 50))
        args = {"a": a, "b": b}
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": "You are a careful calculator. Use tools."})
        msgs.append({"role": "user", "content": f"What is {a} {word} {b}?"})
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args) if i % 2 else args}}
        msgs.append({"role": "assistant", "content": "Let me compute." if i % 4 == 1 else None,
                     "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": str(f(a, b))})
        msgs.append({"role": "assistant", "content": f"{a} {word} {b} is {f(a, b)}."})
        if i % 5 == 2:
            msgs.append({"role": "user", "content": [{"type": "text", "text": "thanks, "},
                                                      {"type": "text", "text": "bye"}]})
            msgs.append({"role": "assistant", "content": "Goodbye!"})
        out.append({"messages": msgs})
    return out


def hf_view(conv):
    """The same conversation as HF's template sees it: arguments as objects, text parts joined."""
    msgs = []
    for m in conv["messages"]:
        m = json.loads(json.dumps(m))
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        for tc in m.get("tool_calls") or []:
            if isinstance(tc["function"]["arguments"], str):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        msgs.append(m)
    return msgs


def read_shard(path):
    b = open(path, "rb").read()
    width, = struct.unpack("<I", b[16:20])
    n, ndocs = struct.unpack("<QQ", b[24:40])
    docs_off, = struct.unpack("<Q", b[72:80])
    mo, mb = struct.unpack("<QQ", b[288:304])
    dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    toks = np.frombuffer(b, dtype=dt, count=n, offset=4096).astype(np.int64)
    starts = np.frombuffer(b, dtype=np.uint64, count=ndocs, offset=docs_off).astype(np.int64)
    mask = np.frombuffer(b, dtype=np.uint8, count=mb, offset=mo) if mo else None
    return toks, starts, mask


def run(*args, ok=True):
    r = subprocess.run([LOOM, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise RuntimeError(f"loom {' '.join(args)} failed:\n{r.stderr}")
    return r


def build(work, name, convs, tokenizer, template="chatml", extra="", seq_len=32, shard_tokens=1 << 20):
    d = os.path.join(work, name)
    os.makedirs(d)
    with open(os.path.join(d, "conv.jsonl"), "w") as f:
        for c in convs:
            f.write(json.dumps(c) + "\n")
    tok = "byte" if tokenizer == "byte" else f"{{type: bpe, path: {tokenizer}}}"
    open(os.path.join(d, "r.yaml"), "w").write(f"""name: {name}
sources:
  - name: chat
    kind: chat
    path: {d}/conv.jsonl
    template: {template}
{extra}tokenizer: {tok}
seq_len: {seq_len}
val_fraction: 0
output: {d}/out
shard_tokens: {shard_tokens}
""")
    run("data", "build", os.path.join(d, "r.yaml"))
    return os.path.join(d, "out", "train")


def make_bpe(path, convs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([json.dumps(c) for c in convs], tr)
    tok.save(path)


def test_bpe_vs_hf(work, convs):
    print("chatml + BPE vs transformers' apply_chat_template:")
    tokp = os.path.join(work, "tokenizer.json")
    make_bpe(tokp, convs)
    data = build(work, "bpe", convs, tokp)
    toks, starts, mask = read_shard(os.path.join(data, "shard_00000.bin"))
    expect("the shard has a loss-mask section", mask is not None and len(mask) == len(toks))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=tokp)
    fast.chat_template = CHATML_JINJA
    want_ids, want_mask = [], []
    for c in convs:
        out = fast.apply_chat_template(hf_view(c), tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
        want_ids += list(out["input_ids"])
        want_mask += list(out["assistant_masks"])
    expect("token ids equal apply_chat_template's", toks.tolist() == want_ids,
           f"{len(toks)} vs {len(want_ids)} tokens")
    expect("loss mask equals return_assistant_tokens_mask", mask is not None and mask.tolist() == want_mask,
           f"{int(mask.sum()) if mask is not None else -1} vs {sum(want_mask)} masked")
    r = run("data", "verify", data, ok=False)
    expect("data verify accepts the shard", r.returncode == 0, r.stderr[-200:])
    return tokp, data


def test_byte_llama3(work, convs):
    print("llama3 + byte tokenizer:")
    data = build(work, "byte3", convs, "byte", template="llama3")
    toks, starts, mask = read_shard(os.path.join(data, "shard_00000.bin"))
    text = bytes(toks.astype(np.uint8))
    ok = True
    hdr = b"<|start_header_id|>assistant<|end_header_id|>\n\n"
    pos = 0
    asst = np.zeros(len(toks), np.uint8)
    while True:  # every assistant turn: content .. <|eot_id|> inclusive
        i = text.find(hdr, pos)
        if i < 0:
            break
        j = text.find(b"<|eot_id|>", i + len(hdr)) + len(b"<|eot_id|>")
        asst[i + len(hdr):j] = 1
        pos = j
    ok = mask is not None and np.array_equal(mask, asst)
    expect("mask = exactly the assistant turns (content, tool calls, <|eot_id|>)", ok,
           f"{int(mask.sum()) if mask is not None else -1} vs {int(asst.sum())} bytes")
    expect("tool calls use llama3's 'parameters' key", b'{"name": "add", "parameters": {"a": ' in text)
    expect("conversations start with <|begin_of_text|>",
           all(text[s:s + 17] == b"<|begin_of_text|>" for s in starts.tolist()))


def test_trainer_mask(work, tokp, data):
    print("the trainer applies the mask (loss and gradient norm vs PyTorch):")
    V = Tokenizer.from_file(tokp).get_vocab_size()
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    hf = os.path.join(work, "hf_base")
    model.save_pretrained(hf)
    os.system(f"cp {tokp} {hf}/tokenizer.json")
    B, T = 4, 32
    conf = os.path.join(work, "sft.yaml")
    open(conf, "w").write(f"""run:
  dir: {work}/sft
data:
  train: {data}
  shuffle: false
training:
  init_from: {hf}
  steps: 1
  batch_size: {B}
  seq_len: {T}
  lr: 1e-4
  warmup: 0
  grad_clip: 0
  peak_flops: 1e11
eval:
  every: 0
""")
    run("train", conf)
    row = json.loads(open(f"{work}/sft/metrics.jsonl").readline())
    toks, _, mask = read_shard(os.path.join(data, "shard_00000.bin"))
    x = np.stack([toks[j * T:j * T + T] for j in range(B)])
    y = np.stack([toks[j * T + 1:j * T + T + 1] for j in range(B)])
    m = np.stack([mask[j * T + 1:j * T + T + 1] for j in range(B)]).astype(bool)
    logits = model(torch.tensor(x)).logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.tensor(y).reshape(-1), reduction="none")
    loss = ce[torch.tensor(m.reshape(-1))].mean()
    loss.backward()
    gnorm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
    print(f"  {int(m.sum())} of {m.size} targets are assistant tokens")
    check("step-1 loss vs PyTorch masked CE", abs(row["loss"] - loss.item()) / loss.item(), 1e-5)
    check("step-1 grad norm vs PyTorch", abs(row["grad_norm"] - gnorm) / gnorm, 1e-4)
    unmasked = ce.mean().item()
    expect("the unmasked loss is different (the mask matters)", abs(unmasked - loss.item()) > 1e-3,
           f"{unmasked:.5f} vs {loss.item():.5f}")


def test_padding(work, convs):
    print("pack: false (padding) and too_long:")
    long = {"messages": [{"role": "user", "content": "x" * 700}, {"role": "assistant", "content": "ok"}]}
    few = convs[:5] + [long] + convs[5:8]
    data = build(work, "pad", few, "byte", extra="    pack: false\n", seq_len=512, shard_tokens=512 * 16)
    toks, starts, mask = read_shard(os.path.join(data, "shard_00000.bin"))
    expect("every conversation starts a window", all(s % 512 == 0 for s in starts.tolist()), f"{starts.tolist()}")
    expect("split (default): the long conversation is kept", len(starts) == 9, f"{len(starts)} docs")
    text = bytes(toks.astype(np.uint8))
    ends = starts.tolist()[1:] + [len(toks)]
    pads_ok = True
    for s, e in zip(starts.tolist(), ends):
        body = text[s:e].rstrip(b"\x00")
        pads_ok &= body.endswith(b"<|im_end|>\n") and not mask[s + len(body):e].any()
    expect("padding after each conversation has mask 0", pads_ok)
    data = build(work, "drop", few, "byte", extra="    pack: false\n    too_long: drop\n", seq_len=512,
                 shard_tokens=512 * 16)
    toks, starts, mask = read_shard(os.path.join(data, "shard_00000.bin"))
    ds = json.load(open(os.path.join(data, "dataset.json")))
    src = ds["sources"][0]
    expect("too_long: drop drops it and counts it", len(starts) == 8 and src.get("dropped_too_long") == 1,
           f"{len(starts)} docs, {src.get('dropped_too_long')}")


def test_errors(work):
    print("bad input:")
    bad = [{"messages": [{"role": "robot", "content": "x"}]},
           {"messages": [{"role": "user", "content": "x"}]}]
    for i, c in enumerate(bad):
        d = os.path.join(work, f"bad{i}")
        try:
            build(work, f"bad{i}", [c], "byte")
            expect(f"bad conversation {i} refused", False)
        except RuntimeError as e:
            msg = str(e)
            expect(f"bad conversation {i} refused naming file:line", "conv.jsonl:1" in msg and
                   ("role 'robot'" in msg or "no assistant message" in msg), msg.strip().splitlines()[-1])
        del d


def main():
    rng = np.random.default_rng(5)
    convs = conversations(24, rng)
    with tempfile.TemporaryDirectory() as work:
        tokp, data = test_bpe_vs_hf(work, convs)
        test_byte_llama3(work, convs)
        test_trainer_mask(work, tokp, data)
        test_padding(work, convs)
        test_errors(work)
    sys.exit(finish())


if __name__ == "__main__":
    main()
