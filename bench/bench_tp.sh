#!/usr/bin/env bash
# Tensor-parallel benchmark on gpt2-small (124M parameters; B 4 x T 256 by default): one process
# with 2 threads against `mpirun -np 2` with 1 thread per rank at parallel.tp = 2, sequence
# parallelism off and on. REPEAT runs of each case, alternating; per run the median tokens/s
# over the steps after WARM, and the communication share: rank 0's seconds in tensor
# parallelism's collectives (tp_comm_s) over the step time. Peak memory per rank (mem_bytes)
# is shown beside it. The 1-minute load average is recorded before and after.
#   bash bench/bench_tp.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
CONFIG=${CONFIG:-configs/gpt2-small.yaml}
STEPS=${STEPS:-8}
WARM=${WARM:-3}
REPEAT=${REPEAT:-2}
W=$(mktemp -d /tmp/loom-bench-tp.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val= --set training.log_every=1000
        --set training.peak_flops=1e12 ${EXTRA:-})
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
echo "load average before: $(cat "$W/load_before")" >&2
for rep in $(seq "$REPEAT"); do
  OMP_NUM_THREADS=2 "$LOOM" train "$CONFIG" "${COMMON[@]}" --set run.dir="$W/one_$rep" \
    --set training.threads=2 2>/dev/null
  for sp in false true; do
    mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
      "$LOOM" train "$CONFIG" "${COMMON[@]}" --set run.dir="$W/tp_${sp}_$rep" \
      --set training.threads=1 --set parallel.tp=2 --set parallel.sp=$sp 2>/dev/null
  done
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
echo "load average after: $(cat "$W/load_after")" >&2
python3 - "$W" "$WARM" "$REPEAT" "$CONFIG" "${1:-}" <<'PY'
import datetime, json, os, statistics, sys
w, warm, reps, config, write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "--write"
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
def rows(d, r):
    rs = [json.loads(l) for l in open(f"{w}/{d}_{r}/metrics.jsonl")]
    if len(rs) <= warm: sys.exit(f"{d}: {len(rs)} steps, not more than WARM={warm}")
    return rs[warm:]
def tps(d):
    return [statistics.median(x["tokens_per_s"] for x in rows(d, r)) for r in range(1, reps + 1)]
def share(d):  # median over steps of run 1: tp collective seconds / step seconds
    return statistics.median(x["tp_comm_s"] / (x["step_ms"] / 1e3) for x in rows(d, 1))
mem = lambda d: rows(d, 1)[0]["mem_bytes"]
one = tps("one")
t1 = statistics.median(one)
busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 2.5
lines = [f"## Tensor parallelism ({datetime.date.today()})", "",
         f"`bash bench/bench_tp.sh`: {config}, {os.cpu_count()} cores; one process with 2 threads "
         "against `mpirun -np 2` with 1 thread per rank at `parallel.tp = 2`. 1-minute load average "
         f"{load_before} before, {load_after} after"
         + (": the machine was shared with other work, so these are not quiet-machine figures."
            if busy else "."), "",
         f"{reps} runs of each case, alternating; each run's median tokens/s over steps {warm + 1}+, "
         "the median over the runs (min-max shown). Communication share: rank 0's seconds inside "
         "tensor parallelism's collectives (`tp_comm_s`, blocking: the time the step waits on them) "
         "over the step time, median over the steps of run 1.", "",
         "| run | tokens/s | min-max | vs 1x2 | TP comm share | memory per rank (MB) |",
         "|---|---:|---:|---:|---:|---:|",
         f"| 1 rank x 2 threads | {t1:.0f} | {min(one):.0f}-{max(one):.0f} | 1.00 | - | {mem('one')/1e6:.0f} |"]
for sp in ("false", "true"):
    r = tps(f"tp_{sp}")
    lines.append(f"| 2 ranks x 1 thread, tp 2{', sp' if sp == 'true' else ''} | {statistics.median(r):.0f} | "
                 f"{min(r):.0f}-{max(r):.0f} | {statistics.median(r)/t1:.2f} | {100*share(f'tp_{sp}'):.1f}% | "
                 f"{mem(f'tp_{sp}')/1e6:.0f} |")
text = "\n".join(lines) + "\n"
print(text)
if write:
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Tensor parallelism")
PY
