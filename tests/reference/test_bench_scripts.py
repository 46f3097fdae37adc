"""The benchmark scripts measure what they say (bench/README.md), on small inputs:

  bench_tokenizer.py: the corpus is unrepeated (every document once, the BPE's training part
    disjoint from the encoded part); each timed encode runs in a fresh process (cold caches) with
    HF's encode_batch_fast; a short run produces both table rows with positive MB/s.
  bench_train.py: fewer than 10 measured steps are refused; an MFU above 100% (a peak given far
    too low) is printed as it is, with a warning, never clamped; the load is recorded and the
    machine called quiet only when other processes used under 5% of the CPU time.
  bench_longctx_torch.py: loom and PyTorch side by side at a long(ish) T: every row has a
    step time and the CPU seconds per step (also with no warm-up step: the only step's CPU
    counts from the process's start), PyTorch's peak RSS above loom's by at least torch's import.
  levels.py (bench_attention.py --levels): a run whose loom or PyTorch reports another level
    than the one pinned is refused; pinned to avx2, PyTorch reports AVX2 and loom its avx2
    kernels.
(bench_dp.sh's bytes on the wire: tests/mpi/test_dp_wire.sh; bench_cp.sh:
tests/mpi/test_bench_cp.sh.)
"""
import hashlib
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_tokenizer  # noqa: E402
import bench_train  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, **kw):
    env = dict(os.environ)
    env.setdefault("LOOM_BIN", os.path.join(REPO, "build", "loom"))
    return subprocess.run([sys.executable] + args, cwd=REPO, capture_output=True, text=True,
                          env=env, **kw)


# ---- tokenizer benchmark ------------------------------------------------------------------
train, bench, got = bench_tokenizer.build_corpus(1.0)
hashes = [hashlib.sha256(d.encode()).digest() for d in train + bench]
check(len(set(hashes)) == len(hashes), f"corpus: {len(hashes)} documents, each once")
check(not set(map(hash, train)) & set(map(hash, bench)), "corpus: BPE training part disjoint from the encoded part")
nbytes = sum(len(d.encode()) for d in bench)
check(nbytes >= 0.6e6, f"corpus: {nbytes / 1e6:.2f} MB to encode for --mb 1")
check(all(got[k] > 0 for k in ("prose", "c", "py", "unicode")), f"corpus: every kind present {got}")
src = open(os.path.join(REPO, "bench", "bench_tokenizer.py")).read()
check("encode_batch_fast" in src and "Tokenizer.from_file(tok_path)  # fresh" in src,
      "tokenizer: HF's encode_batch_fast on a tokenizer loaded in the measuring process")

r = run(["bench/bench_tokenizer.py", "--mb", "0.3", "--runs", "1"], timeout=600)
check(r.returncode == 0, f"bench_tokenizer.py --mb 0.3 --runs 1 exits 0 {r.stderr[-500:]}")
rows = re.findall(r"^\| (single thread|all threads \(\d+\)) \| ([\d.]+) \(.*?\) \| ([\d.]+) \(.*?\) \| ([\d.]+)x \|$",
                  r.stdout, re.M)
check(len(rows) == 2 and all(float(x) > 0 for row in rows for x in row[1:]),
      f"tokenizer: both rows with positive MB/s: {rows}")
check("load average" in r.stdout and "cold caches" in r.stdout, "tokenizer: load and cold caches stated")

# ---- training benchmark -------------------------------------------------------------------
r = run(["bench/bench_train.py", "--configs", "byte-tiny", "--steps", "5", "--no-torch"], timeout=300)
check(r.returncode != 0 and "at least 10" in r.stderr, "train: --steps 5 refused")

o = bench_train.OtherWork()
other, avail = o.result()
check(other >= 0 and avail >= 0, "train: other-work CPU accounting runs")

r = run(["bench/bench_train.py", "--configs", "byte-tiny", "--no-torch", "--steps", "10",
         "--warmup", "1", "--repeat", "1", "--peak", "0.5"], timeout=600)
check(r.returncode == 0, f"bench_train.py byte-tiny loom only exits 0 {r.stderr[-800:]}")
m = re.search(r"\|\s+byte-tiny \|.*?\|\s+([\d.]+)% \|\s+- \|\s+([\d.]+)% \|", r.stdout)
check(m is not None and float(m.group(1)) > 100 and abs(float(m.group(1)) - float(m.group(2))) < 0.05 * float(m.group(1)),
      f"train: MFU against a 0.5 GFLOP/s peak printed above 100% as it is, = loom's logged: {m and m.groups()}")
check("WARNING: an MFU above 100%" in r.stdout, "train: MFU above 100% comes with a warning")
check(re.search(r"other processes used \d+ of the \d+ CPU-seconds", r.stdout) is not None
      and ("a quiet machine" in r.stdout or "NOT a quiet machine" in r.stdout),
      "train: the load and the quiet/not-quiet verdict are printed")

# ---- long-context benchmark, loom against PyTorch ------------------------------------------
for warm in ("0",):  # (no warm-up: the case whose CPU was once missing)
    r = run(["bench/bench_longctx_torch.py", "--T", "1024", "--rounds", "1", "--steps", "1",
             "--warmup", warm, "--variants", "loom none,torch eager"], timeout=600)
    check(r.returncode == 0, f"bench_longctx_torch.py --warmup {warm} exits 0 {r.stderr[-800:]}")
    rows = dict(re.findall(r"^\| 1024 \| (loom none|torch eager) \| (.*)$", r.stdout, re.M))
    cells = {k: [c.strip() for c in v.split("|")] for k, v in rows.items()}
    check(sorted(cells) == ["loom none", "torch eager"], f"longctx --warmup {warm}: both rows: {rows}")
    check(all(re.fullmatch(r"[\d.]+", c[0]) and float(c[0]) > 0 and re.fullmatch(r"[\d.]+", c[3])
              and float(c[3]) > 0 for c in cells.values()),
          f"longctx --warmup {warm}: step s and CPU s/step in every row: {cells}")
    check(len(cells) == 2 and float(cells["torch eager"][5]) > float(cells["loom none"][5]) + 0.2,
          f"longctx --warmup {warm}: PyTorch's peak RSS includes its import: {cells}")

# ---- pinned levels (bench/levels.py, bench_attention.py --levels) --------------------------
import levels  # noqa: E402
check(levels.check_used("avx2", {"loom": "avx2", "torch": "AVX2"}, "x") is None,
      "levels: reports that match the pinned level are accepted")
check(levels.check_used("avx2", {"loom": "avx512", "torch": "AVX2"}, "x") is not None,
      "levels: loom at another level than pinned is refused")
check(levels.check_used("avx2", {"loom": "avx2", "torch": "AVX512"}, "x") is not None,
      "levels: PyTorch at another capability than pinned is refused")
if "avx2" in levels.machine_levels(os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom"))):
    env = dict(os.environ, **levels.level_env("avx2"))
    r = subprocess.run([sys.executable, "-c", "import torch; "
                        "print(torch.backends.cpu.get_cpu_capability())"],
                       capture_output=True, text=True, env=env, timeout=120)
    check(r.stdout.strip() == "AVX2", f"levels: PyTorch pinned to avx2 reports AVX2: {r.stdout!r}")
    lb = os.environ.get("LOOM_BIN", os.path.join(REPO, "build", "loom"))
    r = subprocess.run([lb, "version"], capture_output=True, text=True, env=env, timeout=60)
    check("kernels: avx2," in r.stdout, f"levels: loom pinned to avx2 runs its avx2 kernels: {r.stdout!r}")

if failures:
    sys.exit(f"{len(failures)} failure(s)")
print("PASS")
