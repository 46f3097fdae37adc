#!/usr/bin/env bash
# Generation tokens/s, loom against transformers on the same weights: bench/bench_infer.py
# (its docstring says what is measured).
#   bash bench/bench_infer.sh [--threads 1,2] [--repeat 5] [--tokens 64] [--write]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/bench_infer.py "$@"
