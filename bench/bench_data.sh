#!/usr/bin/env bash
# Data build throughput (MB of input per second) for a few recipe shapes, written into
# bench/RESULTS.md under "## Data build" (only that section is replaced).
#   bash bench/bench_data.sh            # BENCH_MB=64 MB of text per case (BENCH_MB=... to change)
# Cases: text (byte tokens, no steps); text with utf8_repair + length + regex + dedup_exact;
# text with dedup_near; JSONL.zst; text split over 2 MPI ranks x 1 thread (mpirun, when
# installed); then the cached rebuild of an unchanged recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
MB=${BENCH_MB:-64}
THREADS=${OMP_NUM_THREADS:-$(nproc)}
W=$(mktemp -d /tmp/loom-bench-data.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -x "$LOOM" ] || { echo "build loom first (make)"; exit 1; }

python3 - "$W" "$MB" <<'PY'
import json, os, random, sys
w, mb = sys.argv[1], int(sys.argv[2])
random.seed(0)
words = [("".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(random.randint(2, 9))))
         for _ in range(5000)]
os.makedirs(f"{w}/text", exist_ok=True); os.makedirs(f"{w}/jsonl", exist_ok=True)
target, n, f, part = mb << 20, 0, None, 0
jl = open(f"{w}/jsonl/all.jsonl", "w")
while n < target:
    if f is None or f.tell() > (8 << 20):
        if f: f.close()
        f = open(f"{w}/text/part{part:03d}.txt", "w"); part += 1
    doc = " ".join(random.choice(words) for _ in range(random.randint(50, 800)))
    f.write(doc + "\n%\n"); jl.write(json.dumps({"text": doc}) + "\n"); n += len(doc) + 3
f.close(); jl.close()
PY
zstd -q -T0 --rm "$W/jsonl/all.jsonl" -o "$W/jsonl/all.jsonl.zst"
IN_BYTES=$(cat "$W"/text/*.txt | wc -c)

recipe() { # name kind path steps
  cat > "$W/$1.yaml" <<EOF
name: $1
sources:
  - name: s
    kind: $2
    path: $3
$( [ "$2" = text ] && echo '    split: "\n%\n"' )
    steps: $4
tokenizer: byte
output: $W/out-$1
EOF
}
recipe plain text "$W/text" "[]"
recipe filters text "$W/text" '[utf8_repair, {length: {min_bytes: 100}}, {regex: {exclude: "qqq"}}, dedup_exact]'
recipe near text "$W/text" '[{dedup_near: {num_perm: 128, bands: 16, shingle: 5, threshold: 0.8}}]'
recipe jsonl jsonl "$W/jsonl" "[]"

row() { # label yaml threads [launcher...]
  local t0 t1 label=$1 yaml=$2 threads=$3
  shift 3
  rm -rf "$W/out-$(basename "$yaml" .yaml)"
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=${threads%% *} "$@" "$LOOM" data build "$yaml" >/dev/null 2>&1
  t1=$(date +%s.%N)
  python3 -c "import sys; b, t = $IN_BYTES, $t1 - $t0; print(f'| {sys.argv[1]} | {sys.argv[2]} | {b/1e6:.0f} | {t:.2f} | {b/1e6/t:.1f} |')" "$label" "$threads"
}
ROWS=$(
  row "text, no steps" "$W/plain.yaml" 1
  row "text, no steps" "$W/plain.yaml" "$THREADS"
  row "text, utf8_repair + length + regex + dedup_exact" "$W/filters.yaml" "$THREADS"
  row "text, dedup_near (128 perm, 16 bands)" "$W/near.yaml" "$THREADS"
  row "jsonl.zst, no steps" "$W/jsonl.yaml" "$THREADS"
  if command -v mpirun >/dev/null; then
    row "text, no steps" "$W/plain.yaml" "1 (2 ranks x 1 thread)" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS
  fi
)
t0=$(date +%s.%N); OMP_NUM_THREADS=$THREADS "$LOOM" data build "$W/plain.yaml" >/dev/null 2>&1
"$LOOM" data build "$W/plain.yaml" 2>&1 | grep -q "up to date" || { echo "cached rebuild did work"; exit 1; }
t1=$(date +%s.%N)
CACHED=$(python3 -c "print(f'{($t1 - $t0) / 2:.3f}')")

SECTION=$(cat <<EOF
## Data build

\`bash bench/bench_data.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'),
BENCH_MB=$MB). MB/s = input bytes / wall time of \`loom data build\` (reading, steps,
tokenization, shard writing with fsync, manifest, dataset.json), byte tokenizer,
shard_tokens 2^20. "2 ranks x 1 thread" is \`mpirun -np 2 loom data build\` (wall time
including mpirun's start-up, about 0.5 s here); every rank reads the sources and runs the steps,
only hashing, BPE tokenization and shard writing are divided (docs/recipes.md, "Parallel
builds"), so on these 2 shared, busy cores it is slower than one process; ranks are meant
for nodes with more cores than one process's threads use well, and for several nodes.

| case | threads | input MB | seconds | MB/s |
|---|---:|---:|---:|---:|
$ROWS

Unchanged recipe and inputs (cached: stat + dataset.json, nothing read or written): ${CACHED} s.
EOF
)
python3 - "$SECTION" <<'PY'
import re, sys, os
p = "bench/RESULTS.md"
text = open(p).read() if os.path.exists(p) else "# Benchmark results\n"
sec = sys.argv[1].rstrip() + "\n"
m = re.search(r"^## Data build\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
text = text[:m.start()] + sec + "\n" + text[m.end():] if m else text.rstrip() + "\n\n" + sec
open(p, "w").write(text)
PY
echo "$SECTION"
