#!/usr/bin/env bash
# `make run`: build the default dataset, train byte-tiny for a few minutes, print samples.
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
STEPS=${STEPS:-600}
RUN=${RUN:-runs/byte-tiny}
if [ ! -f data/fortunes/train/manifest.jsonl ]; then
  echo "== building the default dataset (recipes/fortunes.yaml)"
  "$LOOM" data build recipes/fortunes.yaml
fi
echo "== training byte-tiny for $STEPS steps into $RUN (run again to resume; raise STEPS to continue)"
"$LOOM" train configs/byte-tiny.yaml --set run.dir="$RUN" --set training.steps="$STEPS"
echo "== samples"
for seed in 1 2 3; do
  echo "--- seed $seed"
  "$LOOM" generate "$RUN" --prompt "Q: " --tokens 200 --temperature 0.8 --top-k 40 --seed $seed
done
echo "== run directory: $RUN (config.yaml, metrics.jsonl, ckpt/)"
