"""Tokenization throughput (MB/s): loom's byte-level BPE against Hugging Face `tokenizers`.

    python3 bench/bench_tokenizer.py [--mb 12] [--vocab 8000] [--runs 3] [--write]

Corpus: unrepeated text from the machine, every document once (exact duplicates removed by
hash): the Debian fortunes, C headers under /usr/include and the Python standard library's .py
files, cut at line ends into documents of about 20 kB, and generated multilingual
text (CJK, Arabic, emoji, combining marks; tests/reference/test_bpe.generated_unicode, a fresh
random stream, so no line repeats). One document in five (by hash) is set aside to train the
BPE (vocab --vocab, by `tokenizers`, loaded by both sides); the other four fifths, about --mb
megabytes, are encoded. The ids of both sides are checked equal on every encoded document first.

Each measurement runs in a fresh process that loads the tokenizer from its file right before
the timed encode, so both sides start with empty word caches (cold caches), and only encoding
is timed (ids stay in native arrays on both sides):
  single thread  HF `encode_batch_fast` with TOKENIZERS_PARALLELISM=false (its fastest batch
                 API, run serially); loom `loom_tokenizer_encode` per document in turn
  all threads    HF `encode_batch_fast` on its Rayon pool (RAYON_NUM_THREADS = logical CPUs);
                 loom from a pool of as many Python threads (ctypes releases the GIL; loom's
                 encode is thread-safe)
--runs runs of each, alternating sides; the median MB/s is reported with the spread. The
1-minute load average before and after is recorded. --write replaces the "## Tokenizer"
section of bench/RESULTS.md.
"""
import argparse
import ctypes
import glob
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
import test_bpe as T  # noqa: E402  (bindings and generated Unicode)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def read(path, limit=1 << 20):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def build_corpus(mb):
    """(train_docs, bench_docs): unique documents, about mb MB for the benchmark."""
    share = {"prose": 0.25, "c": 0.3, "py": 0.3, "unicode": 0.15}
    budget = {k: v * mb * 1e6 * 1.25 for k, v in share.items()}  # 1/5 goes to training
    fort = sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                  if os.path.isfile(p) and not os.path.islink(p) and not p.endswith((".dat", ".u8")))
    headers = sorted(glob.glob("/usr/include/**/*.h", recursive=True))
    stdlib = os.path.dirname(os.__file__)
    pys = sorted(p for p in glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)
                 if "site-packages" not in p)
    seen, docs = set(), []

    def chunks(texts):
        """each text cut at line ends into documents of about 20 kB"""
        for text in texts:
            pos = 0
            while pos < len(text):
                end = text.find("\n", pos + 20000)
                end = len(text) if end < 0 else end + 1
                yield text[pos:end]
                pos = end

    def take(kind, texts):
        used = 0
        for t in chunks(texts):
            if used >= budget[kind]:
                break
            if not t.strip():
                continue
            h = hashlib.sha256(t.encode()).digest()
            if h in seen:
                continue
            seen.add(h)
            docs.append(t)
            used += len(t.encode())
        return used

    got = {"prose": take("prose", (read(p) for p in fort)),
           "c": take("c", (read(p) for p in headers)),
           "py": take("py", (read(p) for p in pys))}
    rng = random.Random(20261130)

    def unicode_docs():
        while True:
            yield "".join(T.generated_unicode(rng, 400))
    got["unicode"] = take("unicode", unicode_docs())
    train, bench = [], []
    for d in docs:
        (train if hashlib.sha256(d.encode()).digest()[0] % 5 == 0 else bench).append(d)
    return train, bench, got


# ---- one measurement, in its own process ---------------------------------------------------
def encode_count(lib, h, raw):
    ids, e = T._Ids(), T._err()
    if lib.loom_tokenizer_encode(h, raw, len(raw), ctypes.byref(ids), e) != 0:
        raise RuntimeError(e.value.decode(errors="replace"))
    n = ids.n
    lib.loom_ids_free(ctypes.byref(ids))
    return n


def worker(side, threads, tok_path, corpus_path):
    docs = json.load(open(corpus_path))
    raw = [d.encode() for d in docs]
    if side == "hf":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tok_path)  # fresh: empty cache
        t0 = time.perf_counter()
        enc = tok.encode_batch_fast(docs, add_special_tokens=False)
        dt = time.perf_counter() - t0
        n = sum(len(e) for e in enc)
    else:
        lib = T.loom()
        lm = T.LoomTokenizer.from_json(tok_path)  # fresh: empty cache
        t0 = time.perf_counter()
        if threads == 1:
            counts = [encode_count(lib, lm.h, r) for r in raw]
        else:
            with ThreadPoolExecutor(max_workers=threads) as ex:
                counts = list(ex.map(lambda r: encode_count(lib, lm.h, r), raw))
        dt = time.perf_counter() - t0
        n = sum(counts)
    print(json.dumps({"seconds": dt, "tokens": n, "bytes": sum(len(r) for r in raw)}))


def measure(side, threads, tok_path, corpus_path):
    env = dict(os.environ)
    if side == "hf":
        env["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
        env["RAYON_NUM_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", side, str(threads),
                          tok_path, corpus_path], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_tokenizer: {side} worker failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_results(section):
    sys.path.insert(0, HERE)
    from results_md import replace_section  # our section only (bench/results_md.py)
    path = os.path.join(HERE, "RESULTS.md")
    replace_section(section, "## Tokenizer", path)
    print(f"wrote the Tokenizer section of {path}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=12.0, help="benchmark corpus size in MB")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="replace the section of bench/RESULTS.md")
    args = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    tmp = tempfile.mkdtemp(prefix="loom_bench_tok_")
    train_docs, docs, got = build_corpus(args.mb)
    nbytes = sum(len(d.encode()) for d in docs)
    mb = nbytes / 1e6
    threads = os.cpu_count() or 1
    train_path = os.path.join(tmp, "train.txt")
    with open(train_path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(train_docs))

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    hf.train([train_path], trainer)
    t_hf_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    T.LoomTokenizer.train([train_path], args.vocab, ["<|endoftext|>"])
    t_lm_train = time.perf_counter() - t0
    tok_path = os.path.join(tmp, "tok.json")
    hf.save(tok_path)
    corpus_path = os.path.join(tmp, "corpus.json")
    json.dump(docs, open(corpus_path, "w"))

    # correctness first, on every document
    lm = T.LoomTokenizer.from_json(tok_path)
    for i, e in enumerate(hf.encode_batch(docs, add_special_tokens=False)):
        if e.ids != lm.encode(docs[i]):
            sys.exit(f"bench_tokenizer: loom and HF ids differ on document {i}")
    del lm

    cases = [("hf", 1), ("lm", 1), ("hf", threads), ("lm", threads)]
    mbs = {c: [] for c in cases}
    tokens = {}
    for run in range(args.runs):
        order = cases if run % 2 == 0 else [c for pair in ((cases[1], cases[0]), (cases[3], cases[2])) for c in pair]
        for c in order:
            r = measure(c[0], c[1], tok_path, corpus_path)
            mbs[c].append(r["bytes"] / 1e6 / r["seconds"])
            tokens.setdefault(c[0], r["tokens"])
    if tokens["hf"] != tokens["lm"]:
        sys.exit(f"bench_tokenizer: token counts differ: HF {tokens['hf']}, loom {tokens['lm']}")
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    busy = float(load_before.split()[0]) > 0.5
    med = {c: statistics.median(v) for c, v in mbs.items()}
    rng = {c: f"{min(v):.2f}-{max(v):.2f}" for c, v in mbs.items()}
    rows = [("single thread", ("hf", 1), ("lm", 1)),
            (f"all threads ({threads})", ("hf", threads), ("lm", threads))]
    lines = ["## Tokenizer", "",
             f"Byte-level BPE encode throughput, vocab {args.vocab}, on {mb:.1f} MB of unrepeated text in "
             f"{len(docs)} documents (each document once: fortunes {got['prose']/1e6:.1f} MB, C headers "
             f"{got['c']/1e6:.1f} MB, Python stdlib {got['py']/1e6:.1f} MB, generated multilingual "
             f"{got['unicode']/1e6:.1f} MB, one fifth of it set aside to train the BPE), "
             f"{tokens['lm']} tokens, ids equal on every document. "
             "Each run is a fresh process that loads the tokenizer just before the timed encode "
             "(cold caches on both sides). HF: `encode_batch_fast` (its fastest batch API), "
             "serially with TOKENIZERS_PARALLELISM=false, then on its Rayon pool of "
             f"{threads} threads; loom: `loom_tokenizer_encode` per document, in turn, then from "
             f"{threads} threads. Median of {args.runs} runs (alternating sides), min-max in "
             f"brackets. {cpu_name()}, {threads} logical CPUs; `tokenizers` "
             f"{__import__('tokenizers').__version__}; {time.strftime('%Y-%m-%d %H:%M')}; 1-minute "
             f"load average {load_before} before, {load_after} after"
             + (" (the machine was shared with other work: not quiet-machine figures)." if busy else "."),
             f"Produced by `python3 bench/bench_tokenizer.py --write`.", "",
             "| | HF tokenizers (MB/s) | loom (MB/s) | loom / HF |", "|---|---:|---:|---:|"]
    for name, h, l in rows:
        lines.append(f"| {name} | {med[h]:.2f} ({rng[h]}) | {med[l]:.2f} ({rng[l]}) | {med[l] / med[h]:.1f}x |")
    lines += ["", f"Training (vocab {args.vocab}, on the {os.path.getsize(train_path)/1e6:.1f} MB set aside): "
                  f"`tokenizers` {t_hf_train:.2f} s (its threads), loom {t_lm_train:.2f} s (one thread); "
                  "one run each (tests/reference/test_bpe.py checks that both learn the same merges).", ""]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_results(section)


if __name__ == "__main__":
    main()
