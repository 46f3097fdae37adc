#!/usr/bin/env bash
# Cost of observability on byte-tiny (one process, 2 threads): tokens/s with everything off
# (obs.default_alerts false) against
#   profile: profile.steps covering every step (the profiling op table, every op and phase
#            recorded; the trace written after the last step, outside the measured steps),
#   sinks:   the Prometheus endpoint (scraped every 0.5 s by a client during the run),
#            TensorBoard event files and the default alert rules.
# REPEAT runs of each, alternating; per run the median tokens/s over the steps after WARM; the
# table shows the median over the runs and its ratio to off. Targets (issue 13): profiling
# costs < 3%, the endpoint and sinks < 1%. The 1-minute load average is recorded.
#   bash bench/bench_obs.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-30}
WARM=${WARM:-5}
REPEAT=${REPEAT:-3}
W=$(mktemp -d /tmp/loom-bench-obs.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
COMMON=(--set training.steps=$STEPS --set checkpoint.every=0 --set data.val= --set training.log_every=1000
        --set training.threads=2 --set obs.default_alerts=false)
PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
echo "load average before: $(cat "$W/load_before")" >&2
for rep in $(seq "$REPEAT"); do
  OMP_NUM_THREADS=2 "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/off_$rep" 2>/dev/null
  OMP_NUM_THREADS=2 "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/profile_$rep" \
    --set profile.steps=1-$STEPS 2>/dev/null
  python3 - "$PORT" "$W/scrapes_$rep" <<'PY' &
import sys, time, urllib.request
port, out, n = sys.argv[1], sys.argv[2], 0
end = time.time() + 600
while time.time() < end:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read(); n += 1
        open(out, "w").write(str(n))
    except Exception:
        if n: break  # the run ended
    time.sleep(0.5)
PY
  SCRAPER=$!
  OMP_NUM_THREADS=2 "$LOOM" train configs/byte-tiny.yaml "${COMMON[@]}" --set run.dir="$W/sinks_$rep" \
    --set obs.prometheus_port=$PORT --set obs.tensorboard=true --set obs.default_alerts=true 2>/dev/null
  wait $SCRAPER || true
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
echo "load average after: $(cat "$W/load_after")" >&2
python3 - "$W" "$WARM" "$REPEAT" "$STEPS" "${1:-}" <<'PY'
import datetime, json, os, statistics, sys
w, warm, reps, steps, write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "--write"
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
def runs(d):
    return [statistics.median(json.loads(l)["tokens_per_s"]
                              for l in list(open(f"{w}/{d}_{r}/metrics.jsonl"))[warm:])
            for r in range(1, reps + 1)]
scrapes = [int(open(f"{w}/scrapes_{r}").read()) if os.path.exists(f"{w}/scrapes_{r}") else 0
           for r in range(1, reps + 1)]
off = runs("off")
base = statistics.median(off)
busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 2.5
lines = [f"## Observability overhead ({datetime.date.today()})", "",
         f"`bash bench/bench_obs.sh`: byte-tiny (B 8 x T 256), one process with 2 threads, {steps} "
         f"steps, {reps} runs of each case alternating; each run's median tokens/s over steps "
         f"{warm + 1}+, the median over the runs shown. 1-minute load average {load_before} "
         f"before, {load_after} after"
         + (": the machine was shared with other work, so these are not quiet-machine figures."
            if busy else "."), "",
         "| case | tokens/s (median of runs) | min-max over runs | vs off | target |",
         "|---|---:|---:|---:|---|",
         f"| off (no profile, no sinks, no alerts) | {base:.0f} | {min(off):.0f}-{max(off):.0f} | 1.000 | |"]
for d, what, target in (("profile", f"profile.steps 1-{steps} (every step recorded)", "< 3% slower"),
                        ("sinks", f"Prometheus (scraped every 0.5 s: {min(scrapes)}+ scrapes per run) + TensorBoard + default alerts", "< 1% slower")):
    r = runs(d)
    lines.append(f"| {what} | {statistics.median(r):.0f} | {min(r):.0f}-{max(r):.0f} | "
                 f"{statistics.median(r) / base:.3f} | {target} |")
text = "\n".join(lines) + "\n"
print(text)
if write:
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Observability overhead")
PY
