"""loom's built-in chat templates for the families (chatml for Qwen, llama3, Mistral's [INST],
Gemma's turns), chosen from a tokenizer_config.json's chat_template by its markers (never by
running the Jinja), against transformers' apply_chat_template on small handmade templates that
follow the ones those models ship. Through libloom (ctypes):

  - loom_chat_template_load("DIR/tokenizer_config.json") picks the expected built-in (and Qwen's
    default system message); a list of named templates uses "default";
  - the rendering of whole conversations (loom_chat_render, what `kind: chat` recipes train on)
    equals apply_chat_template(messages, tokenize=False), and the prompt for the next turn
    (loom_chat_prompt_messages: `loom serve`, `loom generate --chat`) equals
    apply_chat_template(messages, add_generation_prompt=True);
  - the ids of the rendering encoded segment by segment (loom_chat_encode, for the loss mask)
    equal apply_chat_template(tokenize=True) with a family-style tokenizer trained in the test
    (Qwen-style byte-level, Llama 3, Mistral's SentencePiece-style legacy form, Gemma);
  - refusals: a template with no known markers, Llama 3.1's dated header, a system message for
    mistral / gemma (whose templates raise), a tokenizer_config.json without chat_template: each
    an error naming the file or the message.
Exits non-zero on any mismatch.
"""
import ctypes
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_bpe_families as fam  # noqa: E402
from test_bpe import loom, _Ids, _err, _libc, LoomTokenizer  # noqa: E402

import transformers  # noqa: E402
from tokenizers import AddedToken  # noqa: E402

transformers.logging.set_verbosity_error()

QWEN25 = (  # Qwen 2.5's template: the tool definitions in its system message, tool calls and results
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>\" }}{%- for tool in tools %}{{- \"\\n\" }}"
    "{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN3 = (  # plain ChatML (no default system message, no tool formats)
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}")
LLAMA31 = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = \"\" %}{%- endif %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}{{- system_message }}{{- \"<|eot_id|>\" }}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
LLAMA32 = LLAMA31.replace('{%- set date_string = \"26 Jul 2024\" %}', '{%- set date_string = strftime_now(\"%d %b %Y\") %}')
PHI3 = "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"

from loomlib import expect, finish  # noqa: E402  (the shared failure list and summary)


def check(cond, what):
    return expect(what, cond)


class _Doc(ctypes.Structure):
    _fields_ = [("text", ctypes.c_char_p), ("len", ctypes.c_size_t), ("cap", ctypes.c_size_t),
                ("seg", ctypes.c_void_p), ("n_seg", ctypes.c_size_t), ("cap_seg", ctypes.c_size_t)]


_jansson = None


def jansson():
    global _jansson
    if _jansson is None:
        loom()
        _jansson = ctypes.CDLL("libjansson.so.4")
        _jansson.json_loads.restype = ctypes.c_void_p
        _jansson.json_loads.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
        _jansson.json_delete.argtypes = [ctypes.c_void_p]
        L = loom()
        P, E = ctypes.c_void_p, ctypes.c_char_p
        L.loom_chat_template_load.argtypes = [E, ctypes.POINTER(P), E]
        L.loom_chat_template_free.argtypes = [P]
        L.loom_chat_render.argtypes = [P, P, ctypes.POINTER(_Doc), E, ctypes.c_size_t]
        L.loom_chat_prompt_messages.argtypes = [P, P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                                E, ctypes.c_size_t]
        L.loom_chat_render_tools.argtypes = [P, P, P, ctypes.POINTER(_Doc), E, ctypes.c_size_t]
        L.loom_chat_prompt_tools.argtypes = [P, P, P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                             E, ctypes.c_size_t]
        L.loom_chat_encode.argtypes = [ctypes.POINTER(_Doc), P, ctypes.POINTER(_Ids), ctypes.POINTER(ctypes.c_void_p), E]
        L.loom_chat_doc_free.argtypes = [ctypes.POINTER(_Doc)]
    return _jansson


def load_template(spec):
    jansson()
    h, e = ctypes.c_void_p(), _err()
    rc = loom().loom_chat_template_load(spec.encode(), ctypes.byref(h), e)
    return (h if rc == 0 else None), e.value.decode(errors="replace")


def template_name(h):
    return ctypes.cast(h, ctypes.POINTER(ctypes.c_char_p))[0].decode()


def _json(messages):
    j = jansson().json_loads(json.dumps(messages).encode(), 0, None)
    assert j
    return j


def render(h, messages, tools=None):
    """(text, None) or (None, why); with tools: loom_chat_render_tools"""
    j, d, why = _json(messages), _Doc(), ctypes.create_string_buffer(512)
    if tools is None:
        rc = loom().loom_chat_render(h, j, ctypes.byref(d), why, 512)
    else:
        jt = _json(tools)
        rc = loom().loom_chat_render_tools(h, j, jt, ctypes.byref(d), why, 512)
        jansson().json_delete(jt)
    text = ctypes.string_at(d.text, d.len).decode() if rc == 0 else None
    loom().loom_chat_doc_free(ctypes.byref(d))
    jansson().json_delete(j)
    return (text, None) if rc == 0 else (None, why.value.decode())


def prompt(h, messages, tools=None):
    j, p, s, why = _json(messages), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.create_string_buffer(512)
    if tools is None:
        rc = loom().loom_chat_prompt_messages(h, j, ctypes.byref(p), ctypes.byref(s), why, 512)
    else:
        jt = _json(tools)
        rc = loom().loom_chat_prompt_tools(h, j, jt, ctypes.byref(p), ctypes.byref(s), why, 512)
        jansson().json_delete(jt)
    jansson().json_delete(j)
    if rc != 0:
        return None, why.value.decode()
    out = ctypes.string_at(p).decode()
    _libc.free(p)
    _libc.free(s)
    return out, None


def chat_ids(h, tok, messages):
    j, d, why = _json(messages), _Doc(), ctypes.create_string_buffer(512)
    assert loom().loom_chat_render(h, j, ctypes.byref(d), why, 512) == 0, why.value
    ids, mask, e = _Ids(), ctypes.c_void_p(), _err()
    rc = loom().loom_chat_encode(ctypes.byref(d), tok.h, ctypes.byref(ids), ctypes.byref(mask), e)
    assert rc == 0, e.value
    out = ids.ids[: ids.n]
    loom().loom_ids_free(ctypes.byref(ids))
    _libc.free(mask)
    loom().loom_chat_doc_free(ctypes.byref(d))
    jansson().json_delete(j)
    return out


def conversations(rng, system):
    words = "the cat sat on a mat and then asked why 42 is the answer to everything 你好 café 🙂".split()

    def say():
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 9)))
    convs = []
    for i in range(12):
        msgs = []
        if system and i % 2 == 0:
            msgs.append({"role": "system", "content": "You are " + say() + "."})
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": say() + "?"})
            msgs.append({"role": "assistant", "content": say() + "."})
        convs.append(msgs)
    convs.append([{"role": "user", "content": "line one\nline two"}, {"role": "assistant", "content": "ok\n\nsure"}])
    return convs


def tool_conversations(rng):
    """tool calls (one or two, with and without text) and tool results (one, or two in a row)"""
    out = []
    for i in range(6):
        calls = [{"type": "function", "function": {"name": "add", "arguments": {"a": rng.randint(0, 99), "b": i}}}]
        if i % 2:
            calls.append({"type": "function", "function": {"name": "mul", "arguments": {"x": "é", "y": [1, 2]}}})
        msgs = [{"role": "user", "content": f"compute {i}"},
                {"role": "assistant", "content": "let me see" if i % 3 == 0 else "", "tool_calls": calls}]
        msgs += [{"role": "tool", "content": str(100 + j)} for j in range(len(calls))]
        msgs.append({"role": "assistant", "content": f"it is {i}."})
        out.append(msgs)
    return out


TOOLS = [  # tool definitions (OpenAI's `tools`), with non-ASCII text and nested schemas
    {"type": "function", "function": {"name": "add", "description": "adds two numbers, café",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                     "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
        "q": {"type": "string", "enum": ["x", "y"]}, "tags": {"type": "array", "items": {"type": "string"}}}}}},
]


def with_tools_checks(name, h, fast, convs):
    """rendering and generation prompts with tool definitions equal apply_chat_template(tools=TOOLS);
    returns the number of mismatches"""
    bad = 0
    for c in convs:
        for gen in (False, True):
            msgs = c[:-1] if gen else c
            want = fast.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=gen)
            got, why = (prompt if gen else render)(h, msgs, TOOLS)
            if got != want:
                bad += 1
                if bad <= 2:
                    print(f"  {name} with tools: differs{' (prompt)' if gen else ''}:\n    loom {got!r}\n    hf   {want!r} {why or ''}")
    return bad


FAMILIES = [  # (name, jinja, expected built-in, bos, eos, tokenizer kind, system allowed)
    ("qwen2.5", QWEN25, "qwen", None, "<|im_end|>", "qwen", True),
    ("chatml", QWEN3, "chatml", None, "<|im_end|>", "qwen", True),
    ("llama3", LLAMA3, "llama3", "<|begin_of_text|>", "<|eot_id|>", "llama3", True),
    ("llama3.1", LLAMA31, "llama3.1", "<|begin_of_text|>", "<|eot_id|>", "llama3", True),
    ("mistral", MISTRAL, "mistral", "<s>", "</s>", "mistral_legacy", False),
    ("gemma", GEMMA, "gemma", "<bos>", "<eos>", "gemma", False),
    ("gemma3", GEMMA3, "gemma3", "<bos>", "<eos>", "gemma", True),
]


def write_config(d, chat_template, **extra):
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "tokenizer_config.json")
    with open(p, "w") as f:
        json.dump(dict(extra, chat_template=chat_template), f)
    return p


def import_check(tmp, corpus):
    """`loom import --hf` of a directory with a family-style tokenizer.json and tokenizer_config.json:
    the checkpoint's tokenizer encodes and decodes as HF through `loom tokenizer`, the recognized
    chat template is recorded and `loom generate --chat` uses it, and `loom export --hf` writes
    it back into tokenizer_config.json as Jinja that renders as the original."""
    import subprocess
    import torch
    loom_bin = os.environ.get("LOOM_BIN") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/loom")
    text = "Hello  world, 12345 日本語 🙂 café\n  indented <|im_end|> end"
    for kind, jinja, want in [("gemma", GEMMA, "gemma"), ("llama3", LLAMA3, "llama3"), ("qwen", QWEN25, "qwen")]:
        d = os.path.join(tmp, f"hf_{kind}")
        hf_tok = fam.train(kind, [corpus])
        cfg = transformers.LlamaConfig(vocab_size=hf_tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, tie_word_embeddings=False)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(d)
        hf_tok.save(os.path.join(d, "tokenizer.json"))
        write_config(d, jinja)
        out = os.path.join(tmp, f"ck_{kind}")
        r = subprocess.run([loom_bin, "import", "--hf", d, out], capture_output=True, text=True)
        if not check(r.returncode == 0, f"import {kind}: {r.stderr[-300:]}"):
            continue
        tj = os.path.join(out, "step_0000000", "tokenizer.json")
        tf = os.path.join(tmp, f"text_{kind}.txt")
        with open(tf, "w", encoding="utf-8") as f:
            f.write(text)
        r = subprocess.run([loom_bin, "tokenizer", "encode", "--tokenizer", tj, "--format", "json", tf],
                           capture_output=True, text=True)
        want_ids = hf_tok.encode(text, add_special_tokens=False).ids
        check(r.returncode == 0 and json.loads(r.stdout) == want_ids,
              f"import {kind}: loom tokenizer encode of the imported tokenizer differs from HF: {r.stdout[:200]} {r.stderr[-200:]}")
        r = subprocess.run([loom_bin, "tokenizer", "decode", "--tokenizer", tj], input=json.dumps(want_ids),
                           capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout == hf_tok.decode(want_ids, skip_special_tokens=False),
              f"import {kind}: loom tokenizer decode differs from HF: {r.stdout[:100]!r}")
        dj = json.load(open(os.path.join(out, "step_0000000", "data.json")))
        check(dj.get("chat_template", {}).get("name") == want,
              f"import {kind}: data.json records chat_template {dj.get('chat_template')}, expected {want}")
        if kind == "qwen":
            check(dj["chat_template"].get("default_system", "").startswith("You are Qwen"),
                  f"import qwen: the default system message is not recorded: {dj['chat_template']}")
        r = subprocess.run([loom_bin, "generate", out, "--chat", "--system", "be brief", "--prompt", "hi",
                            "--tokens", "2", "--temperature", "0", "--format", "ids"], capture_output=True, text=True)
        if kind == "gemma":  # the recorded template is used: Gemma's has no system role
            check(r.returncode != 0 and "no system role" in r.stderr,
                  f"generate --chat --system on the gemma import: rc {r.returncode} {r.stderr[-200:]}")
        else:
            check(r.returncode == 0, f"generate --chat on the {kind} import: {r.stderr[-300:]}")
        # export: tokenizer_config.json carries the template as Jinja, which transformers renders
        # as the original template does (Qwen: with its default system message)
        ex = os.path.join(tmp, f"export_{kind}")
        r = subprocess.run([loom_bin, "export", "--hf", out, ex], capture_output=True, text=True)
        if check(r.returncode == 0, f"export {kind}: {r.stderr[-300:]}"):
            tc = json.load(open(os.path.join(ex, "tokenizer_config.json")))
            bos = {"gemma": "<bos>", "llama3": "<|begin_of_text|>"}.get(kind)  # the originals print it
            orig = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                                        bos_token=bos)
            orig.chat_template = jinja
            back = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(ex, "tokenizer.json"))
            back.chat_template = tc.get("chat_template")
            conv = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello."},
                    {"role": "user", "content": "and?"}]
            same = back.chat_template is not None and all(
                back.apply_chat_template(conv, tokenize=False, add_generation_prompt=g) ==
                orig.apply_chat_template(conv, tokenize=False, add_generation_prompt=g) for g in (False, True))
            check(same, f"export {kind}: the exported chat_template does not render as the original")
        print(f"import {kind}: tokenizer and chat template {want}: ok")


def exported_jinja(tmp, corpus):
    """loom_chat_template_jinja (what `loom export --hf` writes as tokenizer_config.json's
    chat_template): for every built-in, transformers' apply_chat_template on it renders each
    conversation and each generation prompt as loom does, raises where loom refuses (a role the
    template lacks), and loom recognizes the written template as the same built-in (and Qwen's
    default system message)"""
    lib = loom()
    lib.loom_chat_template_jinja.restype = ctypes.c_void_p
    tp = os.path.join(tmp, "jinja_tok.json")
    fam.train("gpt2", [corpus]).save(tp)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=tp)
    for name in ("plain", "chatml", "qwen", "llama3", "llama3.1", "mistral", "gemma", "gemma3"):
        h, msg = load_template(name)
        p = lib.loom_chat_template_jinja(h)
        jinja = ctypes.string_at(p).decode()
        _libc.free(ctypes.c_void_p(p))
        fast.chat_template = jinja
        system_ok = name not in ("mistral", "gemma")
        convs = conversations(random.Random(5), system_ok)
        if name in ("plain", "chatml", "qwen", "llama3", "llama3.1"):  # the ones with tool calls
            convs += tool_conversations(random.Random(6))
            convs.append([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": "two"}'}}]}])
        convs.append([{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}]},
                      {"role": "assistant", "content": "ok"}])
        bad = 0
        for c in convs:
            for gen in (False, True):
                msgs = c[:-1] if gen else c
                want = fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
                got, why = (prompt if gen else render)(h, msgs)
                if got != want:
                    bad += 1
                    if bad <= 2:
                        print(f"  {name} (exported Jinja): differs{' (prompt)' if gen else ''}:\n"
                              f"    loom {got!r}\n    hf   {want!r} {why or ''}")
        if name in ("plain", "chatml", "qwen", "llama3", "llama3.1"):
            bad += with_tools_checks(name + " (exported Jinja)", h, fast, convs)
        else:
            try:
                fast.apply_chat_template(convs[0], tools=TOOLS, tokenize=False)
                raised = False
            except Exception:
                raised = True
            check(raised and render(h, convs[0], TOOLS)[0] is None,
                  f"{name}: tools are not refused by the template without a tool-call format")
        check(bad == 0, f"{name}: apply_chat_template on the exported Jinja: {bad} of {4 * len(convs)} "
                        f"renderings (with and without tools) differ from loom's")
        if not system_ok:
            sysc = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
            try:
                fast.apply_chat_template(sysc, tokenize=False)
                raised = False
            except Exception:
                raised = True
            check(raised and render(h, sysc)[0] is None, f"{name}: the exported Jinja does not refuse a system message")
        cfg = write_config(os.path.join(tmp, f"jinja_{name}"), jinja)
        h2, msg = load_template(cfg)
        ok = h2 is not None and template_name(h2) == name
        if ok:
            c = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
            ok = render(h2, c) == render(h, c)
        check(ok, f"{name}: the exported Jinja is read back as {template_name(h2) if h2 else msg!r}")
        for x in (h, h2):
            if x:
                lib.loom_chat_template_free(x)
    print(f"exported Jinja: every built-in renders as loom's through apply_chat_template")


def main():
    tmp = tempfile.mkdtemp(prefix="loom_chat_tpl_")
    rng = random.Random(11)
    corpus = os.path.join(tmp, "train.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(fam.english(rng, 2000) + fam.test_bpe.generated_unicode(rng, 300))
    for name, jinja, want, bos, eos, kind, system_ok in FAMILIES:
        cfg = write_config(os.path.join(tmp, name), jinja)
        h, msg = load_template(cfg)
        if not check(h is not None, f"{name}: tokenizer_config.json not recognized: {msg}"):
            continue
        check(template_name(h) == want, f"{name}: recognized as {template_name(h)}, expected {want}")
        # a family-style tokenizer whose specials include the template's markers
        hf_tok = fam.train(kind, [corpus])
        markers = {"mistral": ["[INST]", "[/INST]"], "gemma": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
                   "gemma3": ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]}
        hf_tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in markers.get(name, [])])
        tp = os.path.join(tmp, name, "tokenizer.json")
        hf_tok.save(tp)
        fast = transformers.PreTrainedTokenizerFast(tokenizer_file=tp, bos_token=bos, eos_token=eos)
        fast.chat_template = jinja
        lm_tok = LoomTokenizer.from_json(tp)
        bad_text = bad_prompt = bad_ids = 0
        convs = conversations(random.Random(3), system_ok)
        if name == "qwen2.5":
            convs += tool_conversations(random.Random(4))
        for c in convs:
            want_text = fast.apply_chat_template(c, tokenize=False)
            got, why = render(h, c)
            if got != want_text:
                bad_text += 1
                if bad_text <= 2:
                    print(f"  {name}: rendering differs:\n    loom {got!r}\n    hf   {want_text!r} {why or ''}")
            want_prompt = fast.apply_chat_template(c[:-1], tokenize=False, add_generation_prompt=True)
            gotp, why = prompt(h, c[:-1])
            if gotp != want_prompt:
                bad_prompt += 1
                if bad_prompt <= 2:
                    print(f"  {name}: prompt differs:\n    loom {gotp!r}\n    hf   {want_prompt!r} {why or ''}")
            want_ids = list(fast.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"])
            got_ids = chat_ids(h, lm_tok, c)
            if got_ids != want_ids:
                bad_ids += 1
                if bad_ids <= 2:
                    i = fam.first_diff(got_ids, want_ids)
                    print(f"  {name}: ids differ at {i}: loom {got_ids[i:i + 6]} hf {want_ids[i:i + 6]} "
                          f"({fast.convert_ids_to_tokens(want_ids[i:i + 6])})")
        if name == "qwen2.5":
            bt = with_tools_checks(name, h, fast, convs)
            check(bt == 0, f"{name}: {bt} of {2 * len(convs)} renderings with tools differ from apply_chat_template")
        check(bad_text == 0, f"{name}: {bad_text} of {len(convs)} renderings differ from apply_chat_template")
        check(bad_prompt == 0, f"{name}: {bad_prompt} of {len(convs)} generation prompts differ")
        check(bad_ids == 0, f"{name}: {bad_ids} of {len(convs)} conversations' ids differ")
        if not system_ok:
            _, why = render(h, [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "yo"}])
            check(why is not None and "no system role" in why, f"{name}: a system message is not refused: {why!r}")
        loom().loom_chat_template_free(h)
        # a recipe's `template: auto` takes the tokenizer_config.json beside its tokenizer.json
        import test_chat_sft as sft
        data = sft.build(os.path.join(tmp, name), "auto", [{"messages": c} for c in convs], tp, template="auto",
                         seq_len=64)
        toks, _, mask = sft.read_shard(os.path.join(data, "shard_00000.bin"))
        want_all = [i for c in convs for i in fast.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"]]
        check(toks.tolist() == want_all, f"{name}: `loom data build` with template: auto: the shard's ids differ "
                                         f"from apply_chat_template's ({len(toks)} vs {len(want_all)} tokens)")
        print(f"{name}: {want}, {len(convs)} conversations: "
              f"{'ok' if bad_text == bad_prompt == bad_ids == 0 else 'MISMATCH'}")

    exported_jinja(tmp, corpus)
    import_check(tmp, corpus)
    # template: auto without a tokenizer_config.json beside the tokenizer: an error naming it
    import test_chat_sft as sft
    lone = os.path.join(tmp, "lone")
    os.makedirs(lone)
    fam.train("gpt2", [corpus]).save(os.path.join(lone, "tokenizer.json"))
    try:
        sft.build(lone, "auto", [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}],
                  os.path.join(lone, "tokenizer.json"), template="auto")
        check(False, "template: auto without tokenizer_config.json was accepted")
    except RuntimeError as e:
        check(os.path.join(lone, "tokenizer_config.json") in str(e), f"template: auto, no tokenizer_config.json: {e}")
    # named templates: the "default" one
    cfg = write_config(os.path.join(tmp, "named"), [{"name": "tool_use", "template": PHI3},
                                                     {"name": "default", "template": LLAMA3}])
    h, msg = load_template(cfg)
    check(h is not None and template_name(h) == "llama3", f"named templates: {msg}")
    # refusals
    for label, tpl, needle in [("phi3", PHI3, "none of the markers"), ("llama3.2", LLAMA32, "strftime_now"),
                               ("chatml-like", "{{ '<|im_start|>' + m + '<|im_end|>' }}", "layout"),
                               ("qwen3", QWEN25.replace("{{- '<|im_start|>assistant\\n' }}",
                                                        "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"),
                                "<think>")]:
        cfg = write_config(os.path.join(tmp, label), tpl)
        h, msg = load_template(cfg)
        check(h is None and cfg in msg and needle in msg and "never runs Jinja" in msg,
              f"{label}: expected a refusal naming {cfg} and '{needle}', got {msg!r}")
    d = os.path.join(tmp, "nochat")
    os.makedirs(d)
    cfg = os.path.join(d, "tokenizer_config.json")
    with open(cfg, "w") as f:
        json.dump({"bos_token": "<s>"}, f)
    h, msg = load_template(cfg)
    check(h is None and cfg in msg and "no chat_template" in msg, f"no chat_template: {msg!r}")
    sys.exit(finish("test_chat_templates: all checks passed"))


if __name__ == "__main__":
    main()
