#!/usr/bin/env bash
# Generation speed: `loom generate` with its KV cache against loom's own no-cache path (every
# token recomputes the forward over its whole context), side by side on the same checkpoint,
# for byte-tiny and gpt2-small (a 1-step checkpoint: speed does not depend on the weights).
# Greedy decoding of TOKENS tokens after a 16-byte prompt, median of REPEAT runs per side.
#   bash bench/bench_generate.sh [--write]   (--write replaces the section in bench/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-build/loom}
TOKENS=${TOKENS:-200}
REPEAT=${REPEAT:-3}
W=$(mktemp -d /tmp/loom-bench-gen.XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -f data/fortunes/train/manifest.jsonl ] || "$LOOM" data build recipes/fortunes.yaml >/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rows=()
for cfg in byte-tiny gpt2-small; do
  "$LOOM" train configs/$cfg.yaml --set run.dir="$W/$cfg" --set training.steps=1 \
    --set checkpoint.every=1 --set data.val= --set training.peak_flops=1e11 2>/dev/null
  for mode in cache nocache; do
    flag=""; [ $mode = nocache ] && flag=--no-kv-cache
    for r in $(seq "$REPEAT"); do
      "$LOOM" generate "$W/$cfg" --prompt "Once upon a time" --tokens "$TOKENS" --temperature 0 \
        --stats $flag 2>&1 >/dev/null | sed -n 's/.*(\([0-9.]*\) tokens\/s.*/\1/p' >> "$W/$cfg.$mode"
    done
  done
  rows+=("$cfg")
done
python3 - "$W" "$TOKENS" "${1:-}" "${rows[@]}" <<'PY'
import datetime, statistics, sys
w, tokens, write, cfgs = sys.argv[1], sys.argv[2], sys.argv[3] == "--write", sys.argv[4:]
lines = [f"## Generation ({datetime.date.today()})", "",
         f"`bash bench/bench_generate.sh`: `loom generate --temperature 0 --tokens {tokens}` after "
         "a 16-byte prompt, 2 threads; the KV cache against loom's own path without one (each "
         "token recomputes its whole context). Median of the runs.", "",
         "| model | KV cache tokens/s | no cache tokens/s | ratio |", "|---|---:|---:|---:|"]
for c in cfgs:
    a = statistics.median(float(x) for x in open(f"{w}/{c}.cache"))
    b = statistics.median(float(x) for x in open(f"{w}/{c}.nocache"))
    lines.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.1f}x |")
text = "\n".join(lines) + "\n"
print(text)
if write:  # replace this section of the shared results file, keep the others
    sys.path.insert(0, "bench")
    from results_md import replace_section
    replace_section(text, "## Generation")
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
