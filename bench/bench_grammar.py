"""The cost of constrained decoding per token: milliseconds of token-mask computation.

    python3 bench/bench_grammar.py [--vocab 50257] [--tokens 400] [--lib build/libloom.so]

For the byte tokenizer and for a byte-level BPE of --vocab ids (trained by `tokenizers` on the
Python standard library's .py files, cached under $TMPDIR), a JSON schema of the kind agents
send (an object with strings, numbers, an enum, an array of objects, $ref) is compiled and
random walks generate documents: each step computes the mask (loom_grammar_mask, the call the
engine makes per token), draws a uniformly random allowed token and advances. Only the mask
calls are timed. Uniform draws favour long tokens that end inside strings, where the most
tokens are allowed, so this is the expensive end for the automaton's part of the cost. The
engine adds one pass over the V logits (writing -inf) per token; `loom generate --stats`
reports the engine's whole cost per token (mask and that pass).
"""
import argparse
import ctypes
import glob
import json
import os
import random
import statistics
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = {
    "$defs": {"item": {"type": "object", "properties": {
        "sku": {"type": "string", "maxLength": 16}, "qty": {"type": "integer"},
        "price": {"type": "number"}}, "required": ["sku", "qty"]}},
    "type": "object",
    "properties": {
        "customer": {"type": "string"}, "email": {"type": ["string", "null"]},
        "status": {"enum": ["open", "paid", "shipped"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 8},
        "note": {"type": "string", "maxLength": 200}},
    "required": ["customer", "status", "items"]}


def bpe_tokenizer(vocab):
    path = os.path.join(tempfile.gettempdir(), f"loom-bench-grammar-bpe{vocab}.json")
    if os.path.exists(path):
        return path
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    def texts():
        for f in files:
            try:
                yield open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                pass
    tok.train_from_iterator(texts(), tr)
    tok.save(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--lib", default=os.path.join(HERE, "..", "build", "libloom.so"))
    a = ap.parse_args()
    L = ctypes.CDLL(a.lib)
    P, E = ctypes.c_void_p, ctypes.c_char_p
    for name, args, res in [
        ("loom_tokenizer_load", [E, ctypes.POINTER(P), E], ctypes.c_int),
        ("loom_tokenizer_vocab_size", [P], ctypes.c_uint32),
        ("loom_tokenizer_special_id", [P, E], ctypes.c_int32),
        ("loom_grammar_json", [P, E, ctypes.POINTER(P), E], ctypes.c_int),
        ("loom_grammar_vocab_from_tokenizer", [P, ctypes.c_int, ctypes.c_int32, ctypes.POINTER(P), E], ctypes.c_int),
        ("loom_grammar_state_new", [P], P), ("loom_grammar_state_free", [P], None),
        ("loom_grammar_state_advance", [P, P, ctypes.c_size_t], ctypes.c_int),
        ("loom_grammar_state_terminal", [P], ctypes.c_int),
        ("loom_grammar_scratch_new", [], P),
        ("loom_grammar_mask", [P, P, ctypes.c_int, P, P], ctypes.c_int),
        ("loom_grammar_vocab_token", [P, ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)], P)]:
        f = getattr(L, name)
        f.argtypes, f.restype = args, res
    err = ctypes.create_string_buffer(2048)
    rows = []
    for spec in ["byte", "bpe"]:
        path = "byte" if spec == "byte" else bpe_tokenizer(a.vocab)
        tok = P()
        assert L.loom_tokenizer_load(path.encode(), ctypes.byref(tok), err) == 0, err.value
        V = L.loom_tokenizer_vocab_size(tok)
        g = P()
        t0 = time.perf_counter()
        assert L.loom_grammar_json(None, json.dumps(SCHEMA).encode(), ctypes.byref(g), err) == 0, err.value
        t_compile = time.perf_counter() - t0
        v = P()
        t0 = time.perf_counter()
        assert L.loom_grammar_vocab_from_tokenizer(tok, V, L.loom_tokenizer_special_id(tok, b"<|endoftext|>"),
                                                   ctypes.byref(v), err) == 0, err.value
        t_vocab = time.perf_counter() - t0
        sc = L.loom_grammar_scratch_new()
        allow = (ctypes.c_uint8 * V)()
        rng = random.Random(1)
        times, n_allowed, docs = [], [], 0
        while len(times) < a.tokens:
            s = L.loom_grammar_state_new(g)
            budget = 300
            while budget > 0 and not L.loom_grammar_state_terminal(s) and len(times) < a.tokens:
                t0 = time.perf_counter()
                n = L.loom_grammar_mask(s, v, budget, allow, sc)
                times.append(time.perf_counter() - t0)
                n_allowed.append(n)
                ids = [i for i in range(V) if allow[i]]
                t = rng.choice(ids)
                ln = ctypes.c_size_t()
                b = L.loom_grammar_vocab_token(v, t, ctypes.byref(ln))
                if not b:
                    break  # the end-of-text token
                assert L.loom_grammar_state_advance(s, b, ln.value) == 0
                budget -= 1
            docs += 1
            L.loom_grammar_state_free(s)
        ms = sorted(1e3 * t for t in times)
        rows.append((spec, V, 1e3 * t_compile, 1e3 * t_vocab, statistics.mean(ms), ms[len(ms) // 2],
                     ms[int(0.99 * (len(ms) - 1))], statistics.mean(n_allowed), len(ms), docs))
    print("| tokenizer | ids | compile ms | vocab trie ms | mask ms/token (mean) | median | p99 | allowed ids (mean) | masks | documents |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.0f} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.3f} | {r[7]:.0f} | {r[8]} | {r[9]} |")


if __name__ == "__main__":
    sys.exit(main())
