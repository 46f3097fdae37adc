"""loom's tokenizer.json support for the tokenizers today's model families ship, against
Hugging Face `tokenizers` (PyPI), through libloom (ctypes).

For each kind, `tokenizers` trains a BPE in the test itself (no download) on a mixed corpus with
the family's normalizer / pre-tokenizer / decoder, then on text held out from training
(multilingual, whitespace runs, digits, emoji, decomposed accents, the added tokens inside the
text):
  - loom's ids == HF's `encode(text, add_special_tokens=False).ids`, document by document;
  - loom's decode == HF's `decode(ids, skip_special_tokens=False)`;
  - the tokenizer.json loom writes (what `loom import --hf` stores) loads in `tokenizers` and
    encodes the same, and reloads in loom with the same tokenizer id;
  - encoding in two parts with LOOM_TOK_CONTINUE at an added-token boundary equals one encode;
  - invalid UTF-8 (which HF cannot take) encodes, and decodes back exactly where the kind has no
    prefix rules;
  - for the Qwen and Mistral-legacy kinds, every code point PCRE2 assigns, in context.
Kinds: GPT-2 ByteLevel; Llama 3 (Split regex + ByteLevel without regex, ignore_merges); Qwen 2.5/3
(NFC + Split regex + ByteLevel); Mistral / Llama 2 legacy (Prepend + Replace normalizer,
byte_fallback, fuse_unk, Replace/ByteFallback/Fuse/Strip decoder); Llama 2 / Mistral non-legacy
(Metaspace prepend_scheme first, split false); Gemma (Replace normalizer, Split " "
merged_with_previous); Metaspace always + split with a Metaspace decoder; NFD + Digits (runs) +
Metaspace never + split with Metaspace/ByteFallback/Fuse decoders; NFKC + Digits and
Split behaviours (removed, merged_with_next, contiguous, inverted); each with specials, one
normalized added token, and lstrip / rstrip markers (Phi-3 style). Then hostile and unsupported
files give errors naming the file and the step. Exits non-zero on any mismatch.
"""
import ctypes
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_bpe  # noqa: E402  (ctypes bindings and the generated Unicode corpus)
from test_bpe import LoomTokenizer, loom, _Ids, _err, _libc  # noqa: E402

from tokenizers import Tokenizer, Regex, models, trainers, pre_tokenizers, normalizers, decoders, AddedToken  # noqa: E402

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
CONTINUE = 1

from loomlib import expect, finish  # noqa: E402  (the shared failure list and summary)


def check(cond, what):
    return expect(what, cond)


def encode_ex(tok, data, flags):
    if isinstance(data, str):
        data = data.encode()
    L = loom()
    L.loom_tokenizer_encode_ex.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                           ctypes.POINTER(_Ids), ctypes.c_char_p]
    ids, e = _Ids(), _err()
    rc = L.loom_tokenizer_encode_ex(tok.h, data, len(data), flags, ctypes.byref(ids), e)
    if rc != 0:
        raise RuntimeError(e.value.decode())
    out = ids.ids[: ids.n] if ids.n else []
    L.loom_ids_free(ctypes.byref(ids))
    return out


def load_error(path):
    h, e = ctypes.c_void_p(), _err()
    rc = loom().loom_tokenizer_load_json(path.encode(), ctypes.byref(h), e)
    if rc == 0:
        loom().loom_tokenizer_free(h)
        return None
    return e.value.decode(errors="replace")


# ---- corpora ------------------------------------------------------------------------------------
def english(rng, n):
    words = ("the of and to in is was that for it with as his on be at by had are but from or have an they "
             "which one you were all her she there would their we him been has when who will no more if out so "
             "said what up its about than into them can only other time new some could these two may first then "
             "do any like my now over such our man me even most made after also did many off before must well "
             "back through years much where your way down should because long each just state people those too "
             "how Mr little good very make world still see own men work day get here between both life being "
             "under never know same last another while us might great old year since against go came right used "
             "take three").split()
    out = []
    for _ in range(n):
        line = []
        for _ in range(rng.randint(3, 18)):
            w = rng.choice(words)
            if rng.random() < 0.1:
                w = w.capitalize()
            if rng.random() < 0.08:
                w += rng.choice([",", ".", "'s", "'ll", "!", "?", ";", "'S"])
            if rng.random() < 0.05:
                w = str(rng.randint(0, 99999))
            line.append(w)
        out.append(" ".join(line) + rng.choice(["\n", "\n", " \n", "\n\n", "\r\n"]))
    return "".join(out)


def code(rng, n):
    out = []
    for _ in range(n):
        ind = rng.choice(["", "    ", "        ", "\t", "\t\t"])
        out.append(ind + rng.choice(["if (x == 1) {", "return y + 2;", "for i in range(10):", "}",
                                     "def f(a, b=3):", "x = [1, 2, 3]  # list", "printf(\"%d\\n\", n);",
                                     "  // comment", "while True: pass"]) + rng.choice(["\n", "  \n", "\n\n"]))
    return "".join(out)


def held_out(rng):
    docs = [english(rng, 30), code(rng, 30), test_bpe.generated_unicode(rng, 60)]
    docs += [
        "Hello world", " Hello world", "  leading spaces", "trailing spaces   ", "a\n\n\nb\r\n\r\nc",
        "tabs\t\tand  double  spaces", "    indented\n        more", "x" * 300, " " * 40, "\n" * 10,
        "digits 1234567890 12 345 6789 1,000,000 3.14159 0x1F ٣٤٥ ０１２",
        "emoji 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷😀😀", "日本語のテキストと中文文本和한국어 텍스트",
        "Ελληνικά, кириллица, עברית, العربية, हिन्दी, ไทย", "café naïve coöperate", "cafe\u0301 nai\u0308ve A\u030a",
        "\u1100\u1161\u11a8 Hangul jamo", "ﬁ ligature ① circled Ⅻ ½ ２ ｆｕｌｌ", "I'M YOU'LL he'S it'd WE'VE",
        "don't can't won't ſtop", "mixed\u00a0nbsp\u3000ideographic\u2028line", "a  b   c    d",
        "<s>", "</s>", "<unk>", "text with <s> inside and </s> end", "<|im_start|>user\nhi<|im_end|>\n",
        "<start_of_turn>model\nok<end_of_turn>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "▁already▁has▁meta", "a▁ b ▁c", "", " ", "x", "\t", "1", "🙂",
        "hello  <|end|>\n\n<|assistant|>   answer  <|user|>\tq", "x\u3000<|end|>\u3000y <|end|><|end|>  z",
        "  <|user|>", "<|assistant|>  ", "a <|user|> <|end|> b", "[INST] x [INST]y",
        "<s> a</s>  <s>b", "café\u00a0<|user|>", "日本<|end|>語",
        "it'ſ IT'Ś x'ſt 'ﬅ 'İ A'LL 'Ll 'lL '\u212a ǅ'D ß's",
    ]
    return docs


# ---- building the tokenizers ---------------------------------------------------------------------
SPECIAL = ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>"]


def add_byte_tokens(tok):
    """SentencePiece-style files hold <0x00>..<0xFF> in model.vocab (not as added tokens):
    insert them after the first three specials, renumbering the rest."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    order = sorted(vocab.items(), key=lambda kv: kv[1])
    head, tail = order[:3], order[3:]
    new, nid = {}, 0
    for k, _ in head:
        new[k] = nid
        nid += 1
    for b in range(256):
        new[f"<0x{b:02X}>"] = nid
        nid += 1
    for k, _ in tail:
        new[k] = nid
        nid += 1
    j["model"]["vocab"] = new
    for a in j["added_tokens"]:
        a["id"] = new[a["content"]]
    return Tokenizer.from_str(json.dumps(j))


def train(kind, files):
    byte_level = kind in ("gpt2", "llama3", "qwen", "splits")
    if byte_level:
        model = models.BPE(ignore_merges=(kind == "llama3"))
    else:
        model = models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    meta = "\u2581"
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    elif kind == "qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
    elif kind == "splits":
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(r"[,.;:]"), behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
            pre_tokenizers.Split("-", behavior="merged_with_previous"),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
    elif kind == "mistral_legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(meta), normalizers.Replace(" ", meta)])
        tok.decoder = decoders.Sequence([decoders.Replace(meta, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif kind == "metaspace_first":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=meta, prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace(meta, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif kind == "gemma":
        tok.normalizer = normalizers.Replace(" ", meta)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace(meta, " "), decoders.ByteFallback(), decoders.Fuse()])
    elif kind == "metaspace_always":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=meta, prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement=meta, prepend_scheme="always", split=True)
    elif kind == "metaspace_never":
        tok.normalizer = normalizers.NFD()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                                     pre_tokenizers.Metaspace(replacement=meta, prepend_scheme="never",
                                                                              split=True)])
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement=meta, prepend_scheme="never", split=True),
                                         decoders.ByteFallback(), decoders.Fuse()])
    else:
        raise ValueError(kind)
    kw = {"vocab_size": 1500, "special_tokens": SPECIAL[:3] if not byte_level else ["<|endoftext|>"],
          "show_progress": False}
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    else:
        kw["limit_alphabet"] = 200  # rare characters are left to byte_fallback
    tok.train(files, trainers.BpeTrainer(**kw))
    if not byte_level:
        tok = add_byte_tokens(tok)
    # the family's added tokens: specials (not normalized) and one normalized non-special token
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL
                            if tok.token_to_id(s) is None])
    tok.add_tokens([AddedToken("[INST]", special=False, normalized=True)])
    # Phi-3-style markers that take the whitespace around them
    tok.add_special_tokens([AddedToken("<|assistant|>", special=True, normalized=False, rstrip=True),
                            AddedToken("<|end|>", special=True, normalized=False, lstrip=True, rstrip=True),
                            AddedToken("<|user|>", special=True, normalized=False, lstrip=True)])
    return tok


# ---- the checks ----------------------------------------------------------------------------------
def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(kind, hf, lm, docs):
    bad = 0
    for d in docs:
        want = hf.encode(d, add_special_tokens=False).ids
        got = lm.encode(d)
        if got != want:
            bad += 1
            if bad <= 3:
                i = first_diff(got, want)
                print(f"  {kind}: ids differ on {d[:60]!r} at {i}: loom {got[max(0, i - 3):i + 5]} "
                      f"hf {want[max(0, i - 3):i + 5]} (hf tokens {hf.encode(d, add_special_tokens=False).tokens[max(0, i - 3):i + 5]})")
            continue
        hd = hf.decode(want, skip_special_tokens=False)
        ld = lm.decode(got).decode("utf-8", errors="replace")
        if ld != hd:
            bad += 1
            if bad <= 3:
                print(f"  {kind}: decode differs on {d[:60]!r}: loom {ld[:80]!r} hf {hd[:80]!r}")
    check(bad == 0, f"{kind}: {bad} of {len(docs)} held-out texts differ from HF (ids or decode)")
    return bad


def every_code_point(kind, hf, lm):
    """Every code point PCRE2's tables assign (loom classifies with them; docs/tokenizers.md), in
    context (inside a word, before a digit, after an apostrophe, doubled, after a tab): ids equal."""
    bm = ctypes.create_string_buffer(0x110000 // 8)
    assert loom().loom_bpe_debug_unassigned(bm) == 0
    un = bm.raw
    cps = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF) and not (un[c >> 3] >> (c & 7)) & 1]

    def ctx(c):
        return f"x{chr(c)}y {chr(c)}1 '{chr(c)}{chr(c)}\t{chr(c)}\n"
    bad = []
    for i in range(0, len(cps), 256):
        chunk = "".join(ctx(c) for c in cps[i:i + 256])
        if hf.encode(chunk, add_special_tokens=False).ids != lm.encode(chunk):
            bad += [c for c in cps[i:i + 256] if hf.encode(ctx(c), add_special_tokens=False).ids != lm.encode(ctx(c))]
    check(not bad, f"{kind}: {len(bad)} of {len(cps)} code points in context differ from HF: {[hex(c) for c in bad[:12]]}")
    return len(cps)


def main():
    rng = random.Random(2026)
    tmp = tempfile.mkdtemp(prefix="loom_bpe_fam_")
    train_text = english(rng, 3000) + code(rng, 1500) + test_bpe.generated_unicode(rng, 1500)
    train_text += "".join(f"{rng.randint(0, 10**6)} " for _ in range(2000)) + "\n"
    corpus = os.path.join(tmp, "train.txt")
    with open(corpus, "w", encoding="utf-8", newline="") as f:
        f.write(train_text)
    docs = held_out(random.Random(7))
    # the held-out documents also as lines (short inputs) and as one long text
    lines = [ln for d in docs[:3] for ln in d.splitlines(keepends=True)][:400]
    docs_all = docs + lines + ["".join(docs)]

    kinds = ["gpt2", "llama3", "qwen", "splits", "mistral_legacy", "metaspace_first", "gemma", "metaspace_always",
             "metaspace_never"]
    for kind in kinds:
        hf = train(kind, [corpus])
        path = os.path.join(tmp, f"{kind}.json")
        hf.save(path)
        try:
            lm = LoomTokenizer.from_json(path)
        except RuntimeError as e:
            check(False, f"{kind}: loom does not load it: {e}")
            continue
        bad = compare(kind, hf, lm, docs_all)
        if kind in ("qwen", "mistral_legacy"):  # NFC + Split regex + ByteLevel; Prepend/Replace + character BPE
            n = every_code_point(kind, hf, lm)
            print(f"{kind}: every one of {n} code points in context compared")
        # what loom writes (loom import --hf stores it) encodes the same in HF and in loom
        saved = os.path.join(tmp, f"{kind}.saved.json")
        lm.save_json(saved)
        hf2 = Tokenizer.from_file(saved)
        lm2 = LoomTokenizer.from_json(saved)
        check(lm2.id() == lm.id(), f"{kind}: the saved tokenizer.json reloads with another id")
        bad2 = sum(hf2.encode(d, add_special_tokens=False).ids != lm.encode(d) for d in docs)
        check(bad2 == 0, f"{kind}: HF loading loom's saved file differs on {bad2} texts")
        # encoding in parts at an added-token boundary (chat segments) equals one encode
        a, b = "<s>first part of the text, ", "<s> and the second part\n"
        check(lm.encode(a + b) == lm.encode(a) + encode_ex(lm, b, CONTINUE),
              f"{kind}: encode(a + b) != encode(a) + encode_ex(b, CONTINUE)")
        a, b = "Hello there", " general Kenobi"
        if kind in ("gpt2", "llama3", "qwen"):  # the split falls on a pre-token boundary
            check(lm.encode(a + b) == lm.encode(a) + encode_ex(lm, b, CONTINUE),
                  f"{kind}: continued encode differs at a word boundary")
        # invalid UTF-8: encodes; decodes back exactly where the kind adds nothing
        raw = b"ab\xff\xfe cd \xc3( \xe2\x82 ok \xf0\x9f\x98\x80 \x80end"
        ids = lm.encode(raw)
        check(all(0 <= i < lm.vocab_size() for i in ids), f"{kind}: ids out of range on invalid UTF-8")
        if kind in ("gpt2", "llama3", "qwen", "gemma"):
            check(lm.decode(ids) == raw, f"{kind}: decode(encode(invalid UTF-8)) != input: {lm.decode(ids)!r}")
            r2 = random.Random(5)
            for _ in range(200):
                x = bytes(r2.randrange(256) for _ in range(r2.randint(0, 40)))
                if lm.decode(lm.encode(x)) != x:
                    check(False, f"{kind}: decode(encode(x)) != x for x = {x!r}")
                    break
        elif kind == "mistral_legacy":
            check(lm.decode(ids) == raw, f"{kind}: decode(encode(invalid UTF-8)) != input: {lm.decode(ids)!r}")
        print(f"{kind}: vocab {lm.vocab_size()}, {len(docs_all)} texts, {'ok' if bad == 0 and bad2 == 0 else 'MISMATCH'}")

    # ---- refusals: clear errors naming the file and the step --------------------------------------
    base = json.loads(train("gpt2", [corpus]).to_str())
    cases = [
        ("normalizer", {"type": "Lowercase"}, "Lowercase"),
        ("normalizer", {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "b"}, "Regex"),
        ("normalizer", {"type": "Sequence"}, "normalizers"),
        ("pre_tokenizer", {"type": "Whitespace"}, "Whitespace"),
        ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": False},
         "does not compile"),
        ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": False}, "behavior"),
        ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "Digits"}]},
         "after ByteLevel"),
        ("pre_tokenizer", {"type": "Metaspace", "replacement": "ab", "prepend_scheme": "always"}, "one character"),
        ("pre_tokenizer", {"type": "Metaspace", "replacement": "_", "prepend_scheme": "sometimes"}, "prepend_scheme"),
        ("decoder", {"type": "WordPiece"}, "WordPiece"),
        ("decoder", {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "a"},
                                                                          "content": "b"}]}, "after Fuse"),
        ("decoder", {"type": "Strip", "content": " ", "start": -1, "stop": 0}, "start"),
    ]
    nest = {"type": "Sequence", "pretokenizers": []}
    cur = nest
    for _ in range(8):
        inner = {"type": "Sequence", "pretokenizers": []}
        cur["pretokenizers"].append(inner)
        cur = inner
    cases.append(("pre_tokenizer", nest, "deep"))
    for key, value, needle in cases:
        j = dict(base)
        j[key] = value
        p = os.path.join(tmp, "bad.json")
        with open(p, "w") as f:
            json.dump(j, f)
        msg = load_error(p)
        check(msg is not None and p in msg and needle in msg,
              f"refusal of {key} {json.dumps(value)[:60]}: expected an error naming the file and '{needle}', got {msg!r}")
    sys.exit(finish("test_bpe_families: all checks passed"))


if __name__ == "__main__":
    main()
