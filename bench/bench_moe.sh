#!/usr/bin/env bash
# Mixture-of-experts benchmark (issue 11): configs/moe-tiny.yaml (llama, 8 experts of d_ff 256,
# top-2, capacity 1.25) against the dense model with the same active parameters per token
# (the same config with no experts and d_ff = 2 x 256 = 512: a token's feed-forward runs the
# same two 256-wide experts' worth of matmuls, the router's 8 x d_model aside).
#   one process x 2 threads:  MoE vs dense, tokens/s and their ratio;
#   2 ranks x 1 thread:       MoE at ep = 2 vs dense at dp = 2, and the MoE's all-to-all
#                             seconds per step (moe_alltoall_s, the slowest rank's).
# REPEAT runs each (alternating), per run the median tokens/s over the steps after WARM; the
# table shows the median over runs. The 1-minute load average is recorded before and after.
#   bash bench/bench_moe.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-14}
WARM=${WARM:-4}
REPEAT=${REPEAT:-3}
W=$(mktemp -d /tmp/loom-bench-moe.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val= --set training.log_every=1000)
DENSE=(--set model.moe.experts=0 --set model.d_ff=512)
MPI=(mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
echo "load average before: $(cat "$W/load_before")" >&2
for rep in $(seq "$REPEAT"); do
  OMP_NUM_THREADS=2 "$LOOM" train configs/moe-tiny.yaml "${COMMON[@]}" --set run.dir="$W/moe1_$rep" \
    --set training.threads=2 2>/dev/null
  OMP_NUM_THREADS=2 "$LOOM" train configs/moe-tiny.yaml "${COMMON[@]}" "${DENSE[@]}" \
    --set run.dir="$W/dense1_$rep" --set training.threads=2 2>/dev/null
  "${MPI[@]}" "$LOOM" train configs/moe-tiny.yaml "${COMMON[@]}" --set run.dir="$W/moe2_$rep" \
    --set training.threads=1 --set parallel.ep=2 2>/dev/null
  "${MPI[@]}" "$LOOM" train configs/moe-tiny.yaml "${COMMON[@]}" "${DENSE[@]}" \
    --set run.dir="$W/dense2_$rep" --set training.threads=1 2>/dev/null
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
echo "load average after: $(cat "$W/load_after")" >&2
python3 - "$W" "$WARM" "$REPEAT" "${1:-}" <<'PY'
import datetime, json, os, statistics, sys
w, warm, reps, write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "--write"
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
def rows(d, r):
    return [json.loads(l) for l in list(open(f"{w}/{d}_{r}/metrics.jsonl"))[warm:]]
def tps(d):
    return statistics.median(statistics.median(x["tokens_per_s"] for x in rows(d, r))
                             for r in range(1, reps + 1))
def a2a(d):
    return statistics.median(statistics.median(x["moe_alltoall_s"] for x in rows(d, r))
                             for r in range(1, reps + 1))
def step_s(d):
    return statistics.median(statistics.median(x["step_ms"] for x in rows(d, r)) / 1e3
                             for r in range(1, reps + 1))
params = {d: json.loads(open(f"{w}/{d}_1/metrics.jsonl").readline())["param_bytes"] // 4
          for d in ("moe1", "dense1")}
m1, d1, m2, d2 = tps("moe1"), tps("dense1"), tps("moe2"), tps("dense2")
busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 2.5
out = [f"## MoE vs dense (bench/bench_moe.sh)", "",
       f"{datetime.date.today()}, {os.cpu_count()} CPUs, load average before {load_before}, after "
       f"{load_after}{' (NOT a quiet machine: figures are indicative)' if busy else ''}. "
       f"configs/moe-tiny.yaml (llama, C 128, 4 layers, 8 experts of d_ff 256, top-2, capacity "
       f"1.25; {params['moe1']:,} parameters) against the dense model with the same active "
       f"parameters per token (d_ff 512; {params['dense1']:,} parameters); batch 8 x 128 "
       f"tokens, median tokens/s of the steps after {warm}, median of {reps} runs.", "",
       "| layout | MoE tokens/s | dense tokens/s | MoE / dense | all-to-all s/step (MoE) |",
       "|---|---|---|---|---|",
       f"| 1 process x 2 threads | {m1:.0f} | {d1:.0f} | {m1 / d1:.2f} | - |",
       f"| 2 ranks x 1 thread (MoE ep = 2, dense dp = 2) | {m2:.0f} | {d2:.0f} | {m2 / d2:.2f} | "
       f"{a2a('moe2'):.4f} of {step_s('moe2'):.3f} |", ""]
text = "\n".join(out)
print(text)
if write:
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## MoE vs dense")
PY
