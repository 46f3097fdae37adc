#!/usr/bin/env bash
# Cost of observability on byte-tiny, one process with 1 thread: training with everything off
# (no profile, no sinks, obs.default_alerts false) against
#   sinks:   the Prometheus endpoint (scraped every 0.5 s by a client during the run),
#            TensorBoard event files and the default alert rules;
#   profile: profile.steps covering every step (every op and phase recorded; the trace written
#            after the last step).
# Wall clock: ROUNDS rounds of "off, sinks, profile" (interleaved, so a change of the machine's
# load falls on the three alike); per run the throughput over steps WARM+1..STEPS from the
# metrics rows' elapsed_s (end to end: the step, its metrics line, the sinks, the alerts), and
# the same per CPU second from the rows' cpu_s (the process's CPU time, all its threads: on a
# loaded machine it does not count the time the process waited for a core); per case the median
# over the rounds, and the median of the per-round ratios to off. The 1-minute load average is
# recorded before and after.
# Instructions (CALLGRIND=1, the default): valgrind callgrind counts per step, which do not
# depend on the machine's load: the observability work of a step does not depend on the model's
# width, so it is counted on byte-tiny's architecture (4 gpt2 blocks, the same ops per step) at
# d_model 64, T 64, B 2 (steps 2-3 of 4), and divided by byte-tiny's own instructions per step
# (step 1 of 2, everything off; steps 1 and 2 differ by < 0.1%).
# Targets (issue 13): profiling costs < 3% of tokens/s, the endpoint and sinks < 1%.
#   bash bench/bench_obs.sh [--write]   (--write replaces the section in bench/RESULTS.md)
#   STEPS=30 WARM=5 ROUNDS=5 CALLGRIND=1 by default
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
STEPS=${STEPS:-30}
WARM=${WARM:-5}
ROUNDS=${ROUNDS:-5}
CALLGRIND=${CALLGRIND:-1}
W=$(mktemp -d /tmp/loom-bench-obs.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

# one training run of case $1 into run dir $2 (more --set arguments after), the scraper with sinks
run_case() {
  local k=$1 dir=$2
  shift 2
  local extra=() scraper=
  case $k in
    profile) extra=(--set profile.steps=1-$STEPS_NOW) ;;
    sinks)
      local port
      port=$(free_port)
      extra=(--set obs.prometheus_port=$port --set obs.tensorboard=true --set obs.default_alerts=true)
      python3 - "$port" "$dir.scrapes" <<'PY' &
import sys, time, urllib.request
port, out, n = sys.argv[1], sys.argv[2], 0
end = time.time() + 3600
while time.time() < end:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read(); n += 1
        open(out, "w").write(str(n))
    except Exception:
        if n: break  # the run ended
    time.sleep(0.5)
PY
      scraper=$!
      ;;
  esac
  OMP_NUM_THREADS=1 "$@" train configs/byte-tiny.yaml --set training.steps=$STEPS_NOW \
    --set checkpoint.every=0 --set data.val= --set training.log_every=1000 \
    --set training.threads=1 --set obs.default_alerts=false --set run.dir="$dir" \
    "${CASE_SETS[@]}" "${extra[@]}" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  if [ -n "$scraper" ]; then wait "$scraper" || true; fi
}

cut -d' ' -f1-3 /proc/loadavg >"$W/load_before"
echo "load average before: $(cat "$W/load_before")" >&2
STEPS_NOW=$STEPS
CASE_SETS=()
for r in $(seq "$ROUNDS"); do
  for k in off sinks profile; do
    echo "round $r/$ROUNDS: $k" >&2
    run_case $k "$W/${k}_$r" "$LOOM"
  done
done
cut -d' ' -f1-3 /proc/loadavg >"$W/load_after"
echo "load average after: $(cat "$W/load_after")" >&2

if [ "$CALLGRIND" = 1 ]; then
  command -v valgrind >/dev/null || { echo "CALLGRIND=1 needs valgrind" >&2; exit 1; }
  CG=(valgrind --tool=callgrind --dump-before=train_obs_step_begin)
  # the observability work per step: byte-tiny's architecture at a small width
  STEPS_NOW=4
  CASE_SETS=(--set model.d_model=64 --set training.seq_len=64 --set training.batch_size=2
             --set training.peak_flops=1e11)
  for k in off sinks profile; do
    echo "callgrind: $k (small width)" >&2
    run_case $k "$W/cg_$k" "${CG[@]}" --callgrind-out-file="$W/cg_$k.out" "$LOOM"
  done
  # byte-tiny's instructions per step
  STEPS_NOW=2
  CASE_SETS=(--set training.peak_flops=1e11)
  echo "callgrind: byte-tiny, off" >&2
  run_case off "$W/cg_base" "${CG[@]}" --callgrind-out-file="$W/cg_base.out" "$LOOM"
fi

python3 - "$W" "$WARM" "$ROUNDS" "$STEPS" "$CALLGRIND" "${1:-}" <<'PY'
import datetime, glob, json, os, statistics as st, sys
w, warm, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
callgrind, write = sys.argv[5] == "1", sys.argv[6] == "--write"
load_before, load_after = (open(f"{w}/load_{k}").read().strip() for k in ("before", "after"))
TOKENS = 8 * 256  # byte-tiny's batch

def run(d):
    rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    assert len(rows) == steps and rows[-1]["step"] == steps, d
    a, b = rows[warm - 1], rows[-1]  # steps warm+1..steps
    tokens = TOKENS * (b["step"] - a["step"])
    return tokens / (b["elapsed_s"] - a["elapsed_s"]), tokens / (b["cpu_s"] - a["cpu_s"])

res = {k: [run(f"{k}_{r}") for r in range(1, rounds + 1)] for k in ("off", "sinks", "profile")}
scrapes = [int(open(f"{w}/sinks_{r}.scrapes").read()) if os.path.exists(f"{w}/sinks_{r}.scrapes")
           else 0 for r in range(1, rounds + 1)]

def instr_per_step(out, which):
    """instructions of the dump parts that are whole steps (a dump before each step begins:
    OUT.1 is the start-up, OUT.k+1 step k; OUT itself, the last part, the last step and the end)"""
    def count(f):
        for line in open(f):
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    parts = {int(f.rsplit(".", 1)[1]): count(f) for f in glob.glob(out + ".*")}
    if any(s + 1 not in parts for s in which):
        return 0, 0
    return st.mean(parts[s + 1] for s in which), count(out)

cg = {}
if callgrind:
    for k in ("off", "sinks", "profile"):
        cg[k] = instr_per_step(f"{w}/cg_{k}.out", (2, 3))
    cg["base"] = instr_per_step(f"{w}/cg_base.out", (1,))
    if not cg["base"][0]:
        sys.exit("callgrind: no count for byte-tiny's step 1")

busy = float(load_before.split()[0]) > 0.5 or float(load_after.split()[0]) > 2.5
lines = [f"## Observability overhead ({datetime.date.today()})", "",
         f"`bash bench/bench_obs.sh`: byte-tiny (B 8 x T 256), one process with 1 thread, {steps} "
         f"steps per run, {rounds} rounds of off / sinks / profile interleaved; per run the "
         f"throughput over steps {warm + 1}-{steps} from the metrics rows' `elapsed_s` (wall clock, "
         f"end to end: step, metrics line, sinks, alerts) and `cpu_s` (the process's CPU seconds, "
         f"all threads); per case the median over the rounds (min-max) and the median of the "
         f"per-round ratios to off. 1-minute load average {load_before} before, {load_after} after"
         + (" (a shared machine: the wall-clock figures carry its noise; the CPU-time ones less "
            "so, the instruction counts not at all)." if busy else "."), ""]
hdr = ("| case | tokens/s, wall clock | vs off | tokens per CPU second | vs off |"
       + (" instructions per step vs off |" if callgrind else "") + " target |")
lines += [hdr, "|---" * (hdr.count("|") - 1) + "|"]
what = {"off": "off (no profile, no sinks, no alerts)",
        "sinks": f"sinks: Prometheus (scraped every 0.5 s, {min(scrapes)}+ scrapes a run) + TensorBoard + default alerts",
        "profile": f"profile.steps 1-{steps} (every step recorded)"}
target = {"off": "", "sinks": "< 1% slower", "profile": "< 3% slower"}
for k in ("off", "sinks", "profile"):
    row = f"| {what[k]} |"
    for i in (0, 1):
        v = [x[i] for x in res[k]]
        ratio = st.median(res[k][r][i] / res["off"][r][i] for r in range(rounds))
        row += f" {st.median(v):.0f} ({min(v):.0f}-{max(v):.0f}) | {ratio:.3f} |"
    if callgrind:
        extra = cg[k][0] - cg["off"][0]
        row += (" 1 |" if k == "off" else
                f" {1 + extra / cg['base'][0]:.6f} (+{extra / 1e6:.3f} M of {cg['base'][0] / 1e9:.2f} G) |")
    lines.append(row + f" {target[k]} |")
if callgrind:
    prof_end = cg["profile"][1] - cg["off"][1]  # the last parts: the last step and the end
    lines += ["", f"Instructions (callgrind, load-independent): byte-tiny executes "
              f"{cg['base'][0] / 1e9:.2f} G instructions per step (1 thread); the observability work "
              f"of a step, counted on the same architecture at a small width (d_model 64, T 64, B 2: "
              f"{cg['off'][0] / 1e6:.1f} M per step with everything off), is "
              f"+{(cg['sinks'][0] - cg['off'][0]) / 1e6:.3f} M with the sinks and "
              f"+{(cg['profile'][0] - cg['off'][0]) / 1e6:.3f} M with the profiler; writing and "
              f"merging the trace after the window's last step is a one-time "
              f"{prof_end / 1e6:.1f} M."]
lines += ["", "History: the first measurement (2026-11-30; 2 threads, per-step `tokens_per_s`, which "
          "leaves the sinks' work out; load about 2) gave 0.963 (profile) and 0.978 (sinks) of off "
          "with a spread over runs larger than the gap. Callgrind then counted +0.44 M instructions "
          "per step for the profiler (91% `snprintf` of op shapes, twice per op) and +0.17 M for "
          "the sinks (91% the Prometheus text formatted every step), and /proc/self/status parsed "
          "every step (52 k, in off too); docs/observability.md (Cost) says what replaced them."]
text = "\n".join(lines) + "\n"
print(text)
if write:
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Observability overhead")
PY
