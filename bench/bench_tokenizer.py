"""Tokenization throughput (MB/s): loom's byte-level BPE against Hugging Face `tokenizers`.

    python3 bench/bench_tokenizer.py [--mb 8] [--vocab 8000] [--no-write]

The corpus is the mixed one of tests/reference/test_bpe.py (prose, C, Python, generated
Unicode, whitespace runs), repeated up to --mb megabytes and cut into ~20 kB documents. A
ByteLevel BPE is trained by `tokenizers` on it and loaded by both. Measured, best of 3:
  single thread  each document encoded in turn (HF `encode`, loom `loom_tokenizer_encode`)
  all threads    HF `encode_batch` (its Rayon pool) / loom from a pool of os.cpu_count()
                 Python threads (ctypes releases the GIL; loom's encode is thread-safe)
and loom training time against `tokenizers`' trainer. The ids are checked to be equal. Results
go to stdout and replace the "## Tokenizer" section of bench/RESULTS.md.
"""
import argparse
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
import test_bpe as T  # noqa: E402  (bindings and corpus)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_of(fn, n=3):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def write_results(section):
    path = os.path.join(HERE, "RESULTS.md")
    sys.path.insert(0, HERE)
    from results_md import replace_section  # our section only (bench/results_md.py)
    replace_section(section, "## Tokenizer", path)
    print(f"wrote the Tokenizer section of {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8.0, help="corpus size in MB")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    args = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    load = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="loom_bench_tok_")
    files, docs = T.build_corpus(tmp)
    base = list(docs)
    while sum(len(d.encode()) for d in docs) < args.mb * 1e6:
        docs += base
    nbytes = sum(len(d.encode()) for d in docs)
    mb = nbytes / 1e6
    threads = os.cpu_count() or 1

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    hf.train(files, trainer)
    t_hf_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    T.LoomTokenizer.train(files, args.vocab, ["<|endoftext|>"])
    t_lm_train = time.perf_counter() - t0
    train_mb = sum(os.path.getsize(f) for f in files) / 1e6
    path = os.path.join(tmp, "tok.json")
    hf.save(path)
    lm = T.LoomTokenizer.from_json(path)

    # correctness first
    ref = [e.ids for e in hf.encode_batch(docs[: len(base)], add_special_tokens=False)]
    got = [lm.encode(d) for d in docs[: len(base)]]
    if ref != got:
        sys.exit("bench_tokenizer: loom and HF ids differ")
    raw = [d.encode() for d in docs]

    results = {}
    results["hf_1"] = mb / best_of(lambda: [hf.encode(d, add_special_tokens=False) for d in docs])
    results["lm_1"] = mb / best_of(lambda: [lm.encode(r) for r in raw])
    results["hf_n"] = mb / best_of(lambda: hf.encode_batch(docs, add_special_tokens=False))
    with ThreadPoolExecutor(max_workers=threads) as ex:
        results["lm_n"] = mb / best_of(lambda: list(ex.map(lm.encode, raw)))

    rows = [
        ("single thread", results["hf_1"], results["lm_1"]),
        (f"all threads ({threads})", results["hf_n"], results["lm_n"]),
    ]
    lines = ["## Tokenizer", "",
             f"Byte-level BPE encode throughput, vocab {args.vocab} (trained by `tokenizers` on the corpus of "
             f"tests/reference/test_bpe.py), {mb:.1f} MB in {len(docs)} documents; best of 3; "
             f"{cpu_name()}, {threads} logical CPUs; `tokenizers` {__import__('tokenizers').__version__}; "
             f"{time.strftime('%Y-%m-%d')}; 1-minute load average {load:.1f} when it started (other jobs share "
             f"the machine). Produced by `python3 bench/bench_tokenizer.py`.", "",
             "| | HF tokenizers (MB/s) | loom (MB/s) | loom / HF |", "|---|---:|---:|---:|"]
    for name, h, l in rows:
        lines.append(f"| {name} | {h:.2f} | {l:.2f} | {l / h:.1f}x |")
    lines += ["", f"Training (vocab {args.vocab}, {train_mb:.1f} MB, same merges): `tokenizers` {t_hf_train:.2f} s, "
                  f"loom {t_lm_train:.2f} s (loom trains on one thread).", ""]
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_results(section)


if __name__ == "__main__":
    main()
