#!/usr/bin/env bash
# Data-parallel benchmark on byte-tiny.
#  1. Throughput: 1 rank x 2 threads against 2 ranks x 1 thread (each ZeRO stage), REPEAT runs
#     each (alternating); per run the median tokens/s over the steps after WARM; the table shows
#     the median over the runs and its ratio to 1 x 2.
#  2. Bytes on the wire: for NP_WIRE ranks and each ZeRO stage, the bytes each rank really sends
#     per step, counted by Open MPI's pml monitoring (bench/dp_wire.py: two runs, 2 and 6 steps,
#     the difference), against the lower bound 2(N-1)/N x gradient bytes and against loom's own
#     accounting (ring formulas on the collectives it issues).
# The 1-minute load average is recorded before and after.
#   bash bench/bench_dp.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-14}
WARM=${WARM:-4}
REPEAT=${REPEAT:-3}
NP_WIRE=${NP_WIRE:-2 4}
W=$(mktemp -d /tmp/loom-bench-dp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val= --set training.log_every=1000)
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
echo "load average before: $(cat "$W/load_before")" >&2
for rep in $(seq "$REPEAT"); do
  OMP_NUM_THREADS=2 "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/r1_$rep" \
    --set training.threads=2 2>/dev/null
  for z in 0 1 2 3; do
    mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
      "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/r2_z${z}_$rep" \
      --set training.threads=1 --set parallel.zero=$z 2>/dev/null
  done
done
params=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['param_bytes'] // 4)" \
  "$W/r1_1/metrics.jsonl")
for np in $NP_WIRE; do
  for z in 0 1 2 3; do
    LOOM_BIN=$LOOM python3 bench/dp_wire.py configs/byte-tiny.yaml --np "$np" --zero $z \
      --params "$params" --set data.val= >"$W/wire_${np}_$z.json"
  done
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
echo "load average after: $(cat "$W/load_after")" >&2
python3 - "$W" "$WARM" "$REPEAT" "$NP_WIRE" "${1:-}" <<'PY'
import datetime, glob, json, os, statistics, sys
w, warm, reps, nps, write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5] == "--write"
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
ncpu = os.cpu_count()
def runs(d):
    """each repetition's median tokens/s over the steps after the warm-up"""
    return [statistics.median(json.loads(l)["tokens_per_s"]
                              for l in list(open(f"{w}/{d}_{r}/metrics.jsonl"))[warm:])
            for r in range(1, reps + 1)]
def comm(d):
    rows = [json.loads(l) for l in list(open(f"{w}/{d}_1/metrics.jsonl"))[warm:]]
    return [statistics.median(x["comm_s"][k] for x in rows) for k in range(2)]
one = runs("r1")
tps1 = statistics.median(one)
busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 2.5
lines = [f"## Data parallelism ({datetime.date.today()})", "",
         f"`bash bench/bench_dp.sh`: byte-tiny (3.3M parameters, B 8 x T 256), {ncpu} cores; one process",
         "with 2 threads against `mpirun -np 2` with 1 thread per rank. 1-minute load average "
         f"{load_before} before, {load_after} after (includes the benchmark's own 2 threads)"
         + (": the machine was shared with other work, so these are not quiet-machine figures."
            if busy else "."), "",
         f"Throughput: {reps} runs of each case, alternating; each run's median tokens/s over "
         f"steps {warm + 1}+; the median over the runs (and the spread, min-max) is shown.", "",
         "| run | tokens/s (median of runs) | min-max over runs | vs 1x2 | comm s/step, start to completion, overlapping compute (rank 0, rank 1; run 1) |",
         "|---|---:|---:|---:|---|",
         f"| 1 rank x 2 threads | {tps1:.0f} | {min(one):.0f}-{max(one):.0f} | 1.00 | - |"]
for z in range(4):
    r = runs(f"r2_z{z}")
    cs = comm(f"r2_z{z}")
    lines.append(f"| 2 ranks x 1 thread, zero {z} | {statistics.median(r):.0f} | {min(r):.0f}-{max(r):.0f} | "
                 f"{statistics.median(r)/tps1:.2f} | {cs[0]:.3f}, {cs[1]:.3f} |")
wire = [json.load(open(f"{w}/wire_{np}_{z}.json")) for np in nps for z in range(4)]
G = wire[0]["grad_bytes"]
lines += ["",
          "Bytes on the wire: what each rank's MPI point-to-point layer really sent per step "
          "(Open MPI's pml monitoring counters, collectives included; `bench/dp_wire.py`: runs of "
          "2 and 6 steps, the difference over 4 steps), against the lower bound 2(N-1)/N x "
          f"{G/1e6:.2f} MB of fp32 gradients (what a ring all-reduce sends: no data-parallel "
          "step can send less on average per rank) and against loom's own `comm_bytes` "
          "(ring formulas applied to the collectives loom issues).", "",
          "| ranks | zero | MB sent/step, each rank | mean | bound | mean / bound | loom's accounting (rank 0) | mean / accounting |",
          "|---:|---:|---|---:|---:|---:|---:|---:|"]
for r in wire:
    acc = r["loom_accounted"][0]
    lines.append(f"| {r['np']} | {r['zero']} | {', '.join(f'{b/1e6:.2f}' for b in r['bytes_per_step'])} | "
                 f"{r['mean']/1e6:.2f} | {r['bound']/1e6:.2f} | {r['mean_over_bound']:.2f} | "
                 f"{acc/1e6:.2f} | {r['mean']/acc:.2f} |")
text = "\n".join(lines) + "\n"
print(text)
if write:  # replace this section of the shared results file, keep the others
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Data parallelism")
PY
