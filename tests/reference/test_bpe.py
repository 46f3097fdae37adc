"""loom's byte-level BPE against Hugging Face `tokenizers` (PyPI), through libloom (ctypes).

On a multi-megabyte mixed corpus built deterministically from files on the machine (fortunes,
C headers, Python sources) plus generated Unicode (CJK, emoji with ZWJ and skin tones,
combining marks, RTL scripts, odd digits) and whitespace runs (tabs, spaces, \\r\\n, trailing
spaces, NBSP, U+3000, U+2028, U+180E, U+0085):

  1. `tokenizers` trains a ByteLevel BPE (vocab 4000, <|endoftext|>); loom trains on the same
     files: the merges and the vocabulary must be identical;
  2. HF-trained tokenizer.json (merges as [a, b] pairs): loom ids == HF ids on the whole corpus
     and line by line on a sample (the first differing line is shown);
  3. loom-trained tokenizer.json (merges as "a b" strings) loaded by HF: same ids both sides;
  4. the same vocabulary as vocab.json + merges.txt: same ids both sides;
  5. the pre-tokenizer split of every Unicode code point in context equals HF's;
  6. decode(encode(x)) == x on random bytes (BPE and byte tokenizers), invalid UTF-8 handling
     as documented, and concurrent encodes from several threads give the same ids.
Exits non-zero on any mismatch.
"""
import ctypes
import glob
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB_PATH = os.environ.get("LOOM_LIB") or os.path.join(REPO, "build", "libloom.so")


# ---- ctypes bindings (include/loom/tokenizer.h) --------------------------------------------
class _Ids(ctypes.Structure):
    _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("n", ctypes.c_size_t), ("cap", ctypes.c_size_t)]


class _TrainOpts(ctypes.Structure):
    _fields_ = [("vocab_size", ctypes.c_uint32), ("min_frequency", ctypes.c_uint64),
                ("specials", ctypes.POINTER(ctypes.c_char_p)), ("n_specials", ctypes.c_int),
                ("verbose", ctypes.c_int)]


_lib = None


def loom():
    global _lib
    if _lib is None:
        if not os.path.exists(LIB_PATH):
            sys.exit(f"test_bpe: {LIB_PATH} not found (build first, or set LOOM_LIB)")
        L = ctypes.CDLL(LIB_PATH)
        P, E = ctypes.c_void_p, ctypes.c_char_p
        PP = ctypes.POINTER(ctypes.c_void_p)
        L.loom_tokenizer_load_json.argtypes = [E, PP, E]
        L.loom_tokenizer_load_vocab_merges.argtypes = [E, E, PP, E]
        L.loom_tokenizer_byte.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, PP, E]
        L.loom_tokenizer_train.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
                                           ctypes.POINTER(_TrainOpts), PP, E]
        L.loom_tokenizer_save_json.argtypes = [P, E, E]
        L.loom_tokenizer_save_vocab_merges.argtypes = [P, E, E, E]
        L.loom_tokenizer_free.argtypes = [P]
        L.loom_tokenizer_encode.argtypes = [P, E, ctypes.c_size_t, ctypes.POINTER(_Ids), E]
        L.loom_tokenizer_decode.argtypes = [P, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), E]
        L.loom_ids_free.argtypes = [ctypes.POINTER(_Ids)]
        L.loom_tokenizer_vocab_size.argtypes = [P]
        L.loom_tokenizer_vocab_size.restype = ctypes.c_uint32
        L.loom_tokenizer_id.argtypes = [P]
        L.loom_tokenizer_id.restype = ctypes.c_char_p
        L.loom_bpe_debug_pieces.argtypes = [P, E, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]
        L.loom_bpe_debug_pieces.restype = ctypes.c_long
        L.loom_bpe_debug_unassigned.argtypes = [ctypes.c_char_p]
        _lib = L
    return _lib


_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


def _err():
    return ctypes.create_string_buffer(2048)


class LoomTokenizer:
    def __init__(self, handle):
        self.h = handle

    @staticmethod
    def _check(rc, err):
        if rc != 0:
            raise RuntimeError(err.value.decode(errors="replace"))

    @classmethod
    def from_json(cls, path):
        h, e = ctypes.c_void_p(), _err()
        cls._check(loom().loom_tokenizer_load_json(path.encode(), ctypes.byref(h), e), e)
        return cls(h)

    @classmethod
    def from_vocab_merges(cls, vocab, merges):
        h, e = ctypes.c_void_p(), _err()
        cls._check(loom().loom_tokenizer_load_vocab_merges(vocab.encode(), merges.encode(), ctypes.byref(h), e), e)
        return cls(h)

    @classmethod
    def byte(cls, specials=()):
        arr = (ctypes.c_char_p * max(1, len(specials)))(*[s.encode() for s in specials])
        h, e = ctypes.c_void_p(), _err()
        cls._check(loom().loom_tokenizer_byte(arr, len(specials), ctypes.byref(h), e), e)
        return cls(h)

    @classmethod
    def train(cls, files, vocab_size, specials=(), min_frequency=0):
        fa = (ctypes.c_char_p * len(files))(*[f.encode() for f in files])
        sa = (ctypes.c_char_p * max(1, len(specials)))(*[s.encode() for s in specials])
        o = _TrainOpts(vocab_size, min_frequency, sa, len(specials), 0)
        h, e = ctypes.c_void_p(), _err()
        cls._check(loom().loom_tokenizer_train(fa, len(files), ctypes.byref(o), ctypes.byref(h), e), e)
        return cls(h)

    def save_json(self, path):
        e = _err()
        self._check(loom().loom_tokenizer_save_json(self.h, path.encode(), e), e)

    def encode(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        ids, e = _Ids(), _err()
        self._check(loom().loom_tokenizer_encode(self.h, data, len(data), ctypes.byref(ids), e), e)
        out = ids.ids[: ids.n] if ids.n else []
        loom().loom_ids_free(ctypes.byref(ids))
        return out

    def decode(self, ids):
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        p, n, e = ctypes.c_void_p(), ctypes.c_size_t(), _err()
        self._check(loom().loom_tokenizer_decode(self.h, arr, len(ids), ctypes.byref(p), ctypes.byref(n), e), e)
        out = ctypes.string_at(p, n.value)
        _libc.free(p)
        return out

    def piece_ends(self, data):
        ends = (ctypes.c_size_t * (len(data) + 1))()
        n = loom().loom_bpe_debug_pieces(self.h, data, len(data), ends, len(data) + 1)
        assert n >= 0
        return ends[:n]

    def pieces(self, data):
        out, start = [], 0
        for e in self.piece_ends(data):
            out.append(data[start:e])
            start = e
        return out

    def vocab_size(self):
        return loom().loom_tokenizer_vocab_size(self.h)

    def id(self):
        return loom().loom_tokenizer_id(self.h).decode()

    def __del__(self):
        if getattr(self, "h", None) and _lib is not None:
            _lib.loom_tokenizer_free(self.h)
            self.h = None


# ---- the corpus ------------------------------------------------------------------------------
def _read_text(path, limit):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _take(paths, budget, per_file):
    parts, used = [], 0
    for p in paths:
        if used >= budget:
            break
        t = _read_text(p, per_file)
        if t:
            parts.append(t)
            used += len(t)
    return parts


def generated_unicode(rng, n_lines):
    ranges = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x0600, 0x06FF),
              (0x05D0, 0x05EA), (0x0900, 0x097F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0E00, 0x0E7F),
              (0x00C0, 0x024F), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2200, 0x22FF), (0x2500, 0x257F)]
    combining = ["\u0301", "\u0300", "\u0308", "\u0327", "\u20DD", "\u0651", "\u093F"]
    spaces = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\u00a0", "\u3000", "\u2028", "\u180e", "\u0085",
              "\u2003", "\r\n", "\n\n", " \n", "\u200b"]
    digits = ["0123", "٣٤٥", "０１２", "४२", "1,000.50", "3.14159", "½", "Ⅻ", "²³"]
    emoji = ["👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "😀😀😀"]
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(1, 14)):
            k = rng.random()
            if k < 0.45:
                lo, hi = rng.choice(ranges)
                w = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))
                if rng.random() < 0.2:
                    w += rng.choice(combining)
            elif k < 0.6:
                w = rng.choice(digits)
            elif k < 0.7:
                w = rng.choice(emoji)
            elif k < 0.85:
                w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzAB'-_.,;:!?()[]{}<>/\\\"'s'll") for _ in range(rng.randint(1, 9)))
            else:
                w = "'" + rng.choice(["s", "t", "re", "ve", "m", "ll", "d", "S", "T"])
            words.append(w)
            words.append(rng.choice(spaces) if rng.random() < 0.3 else " ")
        tail = rng.choice(["", "", " ", "   ", "\t", " \t"])
        lines.append("".join(words) + tail + rng.choice(["\n", "\r\n", "\n\n"]))
    return "".join(lines)


def build_corpus(dirpath, target=2_600_000):
    """Writes corpus files into dirpath; returns (paths, docs): the documents are pieces of about
    20 kB of every file, cut at line ends. Deterministic on a given machine."""
    rng = random.Random(20240611)
    fort = sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                  if os.path.isfile(p) and not p.endswith((".dat", ".u8")))
    headers = sorted(glob.glob("/usr/include/*.h"))
    stdlib = os.path.dirname(os.__file__)
    pys = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    chunks = {
        "prose.txt": "".join(_take(fort, target * 3 // 10, 400_000)),
        "c.txt": "".join(_take(headers, target * 2 // 10, 60_000)),
        "py.txt": "".join(_take(pys, target * 2 // 10, 60_000)),
        "unicode.txt": generated_unicode(rng, 9000),
    }
    ws = []
    for _ in range(3000):
        ws.append(rng.choice(["x", "if (a)", "    return 1;", "\tint y;", "word", "42"]) +
                  rng.choice(["  ", "\t\t", "    ", " \t", ""]) + rng.choice(["\n", "\r\n", "   \n", "\n\n\n"]))
    chunks["whitespace.txt"] = "".join(ws)
    paths, docs = [], []
    for name, text in chunks.items():
        p = os.path.join(dirpath, name)
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        paths.append(p)
        pos = 0
        while pos < len(text):
            end = text.find("\n", pos + 20000)
            end = len(text) if end < 0 else end + 1
            docs.append(text[pos:end])
            pos = end
    return paths, docs


# ---- checks ----------------------------------------------------------------------------------
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def compare_ids(name, hf_tok, lm_tok, docs, sample_lines):
    """loom encodes the documents joined by <|endoftext|> in one call; HF encodes them as a
    batch (a special token is a hard boundary, so the ids must be the concatenation)."""
    text = "<|endoftext|>".join(docs)
    eot = hf_tok.token_to_id("<|endoftext|>")
    t0 = time.time()
    ref = []
    for i, e in enumerate(hf_tok.encode_batch(docs, add_special_tokens=False)):
        ref += ([eot] if i else []) + e.ids
    t1 = time.time()
    got = lm_tok.encode(text)
    t2 = time.time()
    print(f"{name}: {len(text.encode()) / 1e6:.2f} MB, {len(ref)} ids; HF {t1 - t0:.2f} s, loom {t2 - t1:.2f} s")
    ok = check(got == ref, f"{name}: ids differ on the whole corpus (first at {first_diff(got, ref)}, "
                           f"{len(got)} vs {len(ref)} ids)")
    if not ok:
        shown = 0
        for line in sample_lines:
            r = hf_tok.encode(line, add_special_tokens=False).ids
            g = lm_tok.encode(line)
            if r != g:
                print(f"  line {line!r}\n    HF   {r}\n    loom {g}")
                shown += 1
                if shown == 5:
                    break
    # line by line (short inputs exercise the edges of every line)
    bad = [ln for ln in sample_lines if lm_tok.encode(ln) != hf_tok.encode(ln, add_special_tokens=False).ids]
    check(not bad, f"{name}: {len(bad)} of {len(sample_lines)} sample lines differ, e.g. {bad[:1]!r}")
    return got


def byte_level_spelling():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def check_pretokenizer(lm_tok):
    """Every code point in a few contexts: loom's pieces == HF ByteLevel's pieces."""
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    table = {b: c for b, c in byte_level_spelling().items()}
    bad = []
    # code points PCRE2's tables leave unassigned are left out: newer Unicode versions (as in the
    # Oniguruma of `tokenizers`) class them as letters etc. (see docs/tokenizers.md)
    bitmap = ctypes.create_string_buffer(0x110000 // 8)
    assert loom().loom_bpe_debug_unassigned(bitmap) == 0
    unassigned = bitmap.raw
    # every assigned code point below U+20000, every 16th in the ideograph planes above
    cps = [c for c in range(1, 0x110000) if not (0xD800 <= c <= 0xDFFF) and not (unassigned[c >> 3] >> (c & 7)) & 1
           and (c < 0x20000 or c % 16 == 0)]
    print(f"pre-tokenizer: {len(cps)} code points assigned in PCRE2's Unicode tables")
    step = 4000
    for k in range(0, len(cps), step):
        s = "".join(f"a{chr(c)}1 {chr(c)}{chr(c)}  {chr(c)}\n" for c in cps[k:k + step])
        ref = [p for p, _ in pre.pre_tokenize_str(s)]
        raw = s.encode()
        spelled = raw.decode("latin-1").translate(table)  # one character per byte
        got, start = [], 0
        for e in lm_tok.piece_ends(raw):
            got.append(spelled[start:e])
            start = e
        if ref != got:
            i = first_diff(got, ref)
            bad.append((hex(cps[k]), got[i - 2:i + 3], ref[i - 2:i + 3]))
            if len(bad) >= 3:
                break
    check(not bad, f"pre-tokenizer splits differ from HF: {bad}")


def main():
    from tokenizers import Tokenizer, ByteLevelBPETokenizer, decoders, models, pre_tokenizers, processors, trainers
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="loom_test_bpe_")
    files, docs = build_corpus(tmp)
    text = "<|endoftext|>".join(docs)
    lines = text.splitlines(keepends=True)
    rng = random.Random(7)
    sample = rng.sample(lines, min(1500, len(lines))) + ["", " ", "\n", "<|endoftext|>", "a<|endoftext|>b",
                                                          "  <|endoftext|>  ", "it's 'S  ok'll\t\t\n"]
    print(f"corpus: {len(text.encode()) / 1e6:.2f} MB, {len(lines)} lines ({time.time() - t_start:.1f} s)")
    check(len(text.encode()) > 2_000_000, "the corpus is at least 2 MB")

    # 1. train with HF and with loom, same files
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.time()
    hf.train(files, trainer)
    t1 = time.time()
    hf_json = os.path.join(tmp, "hf.json")
    hf.save(hf_json)
    lm_trained = LoomTokenizer.train(files, 4000, ["<|endoftext|>"])
    t2 = time.time()
    print(f"training (vocab 4000): HF {t1 - t0:.2f} s, loom {t2 - t1:.2f} s")
    lm_json = os.path.join(tmp, "loom.json")
    lm_trained.save_json(lm_json)
    a, b = json.load(open(hf_json)), json.load(open(lm_json))
    hm = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in a["model"]["merges"]]
    lmm = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in b["model"]["merges"]]
    i = first_diff(hm, lmm)
    check(hm == lmm, f"loom's merges differ from HF's (first at {i}: loom {lmm[i:i + 3]} HF {hm[i:i + 3]})")
    check(a["model"]["vocab"] == b["model"]["vocab"], "loom's trained vocabulary differs from HF's")
    check(isinstance(a["model"]["merges"][0], list) and isinstance(b["model"]["merges"][0], str),
          "both merge spellings are exercised (HF writes pairs, loom writes strings)")

    # 2. HF-trained tokenizer.json in loom
    lm_hf = LoomTokenizer.from_json(hf_json)
    check(lm_hf.vocab_size() == 4000, f"vocab size {lm_hf.vocab_size()} == 4000")
    ids_hf = compare_ids("HF-trained tokenizer.json", hf, lm_hf, docs, sample)

    # 3. loom-trained tokenizer.json in HF
    hf_lm = Tokenizer.from_file(lm_json)
    compare_ids("loom-trained tokenizer.json", hf_lm, lm_trained, docs, sample)
    check(LoomTokenizer.from_json(lm_json).id() == lm_trained.id(), "tokenizer id survives save/load")

    # 4. the same vocabulary as vocab.json + merges.txt
    vocab, merges = hf.model.save(tmp)
    hf_vm = ByteLevelBPETokenizer(vocab, merges)
    hf_vm.add_special_tokens(["<|endoftext|>"])
    lm_vm = LoomTokenizer.from_vocab_merges(vocab, merges)
    compare_ids("vocab.json + merges.txt", hf_vm, lm_vm, docs, sample[:500])
    check(lm_vm.id() == lm_hf.id(), "vocab+merges and tokenizer.json of one vocabulary share a tokenizer id")

    # 5. pre-tokenizer on every code point
    t0 = time.time()
    check_pretokenizer(lm_hf)
    print(f"pre-tokenizer over all code points: {time.time() - t0:.1f} s")

    # 6. decode and round trips
    check(lm_hf.decode(ids_hf) == text.encode(), "decode(encode(corpus)) == corpus")
    check(hf.decode(ids_hf, skip_special_tokens=False) == text, "HF decodes loom's ids to the corpus")
    byte_tok = LoomTokenizer.byte(["<|endoftext|>"])
    rnd = random.Random(99)
    for trial in range(300):
        n = rnd.choice([0, 1, 2, 3, 7, 64, 1000, 20000])
        x = bytes(rnd.getrandbits(8) for _ in range(n))
        if trial % 10 == 0:
            x = x[: n // 2] + b"<|endoftext|>" + x[n // 2:]
        if trial % 7 == 0:
            x = x.replace(b"\x00", b" " * 40)  # long whitespace runs
        for tok, name in ((lm_hf, "bpe"), (lm_trained, "bpe-loom"), (byte_tok, "byte")):
            ids = tok.encode(x)
            if not check(tok.decode(ids) == x, f"{name}: decode(encode(x)) != x for {x[:40]!r}... ({n} bytes)"):
                break
            if not check(all(0 <= i < tok.vocab_size() for i in ids), f"{name}: ids in range"):
                break
    bt = byte_tok.encode(b"ab<|endoftext|>\xff")
    check(bt == [97, 98, 256, 255], f"byte tokenizer ids {bt}")
    # invalid UTF-8: valid runs encode as HF would, each invalid run is a piece of its own
    x = "héllo wörld".encode() + b"\xff\xfe" + " and 'tis".encode() + b"\xc3" + "é".encode()
    want = lm_hf.encode("héllo wörld") + lm_hf.encode(b"\xff\xfe") + lm_hf.encode(" and 'tis") + \
        lm_hf.encode(b"\xc3") + lm_hf.encode("é")
    check(lm_hf.encode(x) == want, "invalid UTF-8 splits the input into independent runs")
    check(lm_hf.pieces(b"ab\xff\xfecd") == [b"ab", b"\xff\xfe", b"cd"], "invalid bytes form one piece per run")

    # concurrent encodes (ctypes releases the GIL): same ids as the single-threaded run
    chunk_lines = lines[:20000]
    want = [lm_hf.encode(ln) for ln in chunk_lines]
    with ThreadPoolExecutor(max_workers=4) as ex:
        got = list(ex.map(lm_hf.encode, chunk_lines))
    check(got == want, "encode is thread-safe (4 threads)")

    print(f"test_bpe: {time.time() - t_start:.1f} s, {len(failures)} failure(s)")
    if failures:
        sys.exit(1)
    print("test_bpe: OK")


if __name__ == "__main__":
    main()
