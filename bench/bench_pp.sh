#!/usr/bin/env bash
# Pipeline-parallel benchmark on byte-tiny with 8 layers (d 256, seq 256).
#  1. Bubble fraction: for p = 2, 4 stages and m = 4, 8 micro-batches (one row each), gpipe
#     and 1f1b: per rank the seconds it waited in pipeline receives over the seconds inside the
#     pipeline's batches (metrics.jsonl pp_bubble_s / pp_run_s), median over the steps after
#     WARM; the table shows the mean over the stages and the largest, beside the formula
#     (p - 1) / (m + p - 1) (equal forward and backward time per stage; the first stage's
#     embedding and the last stage's head make the stages a little unequal).
#  2. Peak activation memory per rank: the arenas each stage held (pp_peak_arenas,
#     pp_act_bytes): gpipe m per stage, 1f1b min(m, p - s).
# One thread per rank: p = 4 needs 4 idle cores for meaningful bubble figures. The 1-minute load
# average is recorded before and after.
#   bash bench/bench_pp.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-8}
WARM=${WARM:-3}
PS=${PS:-2 4}
MS=${MS:-4 8}
W=$(mktemp -d /tmp/loom-bench-pp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val= --set training.log_every=1000
        --set model.n_layer=8 --set training.threads=1)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average before: $load_before" >&2
for p in $PS; do
  for m in $MS; do
    for sched in gpipe 1f1b; do
      mpirun -np "$p" --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
        "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/p${p}_m${m}_$sched" \
        --set parallel.pp="$p" --set parallel.microbatches="$m" --set training.batch_size="$m" \
        --set parallel.pp_schedule=$sched 2>/dev/null
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average after: $load_after" >&2
python3 - "$W" "$WARM" "$PS" "$MS" "$load_before" "$load_after" "$(nproc)" >"$W/section.md" <<'PY'
import json, statistics, sys
w, warm, ps, ms = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
load_before, load_after, cores = sys.argv[5], sys.argv[6], sys.argv[7]
print("## Pipeline parallelism\n")
print("`bash bench/bench_pp.sh`: byte-tiny with 8 layers (d 256, seq 256), one row per "
      "micro-batch, one thread per rank; bubble = seconds a rank waited in pipeline receives "
      "over its seconds in the pipeline (`pp_bubble_s / pp_run_s`), median over the steps after "
      f"the first {warm}. Machine: {cores} cores; load average before {load_before}, after "
      f"{load_after}.\n")
print("| p | m | schedule | bubble, mean over stages | largest stage | formula (p-1)/(m+p-1) | mean / formula | peak arenas per stage | largest rank's activations (MiB) |")
print("|---|---|---|---|---|---|---|---|---|")
for p in map(int, ps):
    for m in map(int, ms):
        for sched in ("gpipe", "1f1b"):
            rows = [json.loads(l) for l in open(f"{w}/p{p}_m{m}_{sched}/metrics.jsonl")][warm:]
            frac = [statistics.median(r["pp_bubble_s"][k] / r["pp_run_s"][k] for r in rows)
                    for k in range(p)]
            mean, worst = sum(frac) / p, max(frac)
            formula = (p - 1) / (m + p - 1)
            arenas = [int(x) for x in rows[-1]["pp_peak_arenas"]]
            act = max(rows[-1]["pp_act_bytes"]) / 2**20
            print(f"| {p} | {m} | {sched} | {mean:.3f} | {worst:.3f} | {formula:.3f} | "
                  f"{mean / formula:.2f} | {arenas} | {act:.1f} |")
PY
cat "$W/section.md"
if [ "${1:-}" = "--write" ]; then  # replace this section of the shared results file
  python3 -c 'import sys; sys.path.insert(0, "bench"); from results_md import replace_section
replace_section(open(sys.argv[1]).read(), "## Pipeline parallelism")' "$W/section.md"
fi
