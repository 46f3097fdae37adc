#!/usr/bin/env bash
# Loader throughput (tokens/s) vs what training consumes; see bench/RESULTS.md, "Loader".
# usage: bash bench/bench_loader.sh [BUILD_DIR]   (default build/, needs libloom_static.a)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
[ -f "$BUILD/libloom_static.a" ] || { echo "build first: make (no $BUILD/libloom_static.a)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/loom-bench-loader.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -std=c11 -I"$SRC/include" -I"$SRC/src" "$SRC/bench/bench_loader.c" "$BUILD/libloom_static.a" \
   $(pkg-config --libs jansson yaml-0.1 libcrypto libpcre2-8 libzstd) -fopenmp -lm -ldnnl -lopenblas $(cat "$BUILD/loom_extra_libs.txt") \
   $(mpicc --showme:link 2>/dev/null || true) -o "$WORK/bench_loader"
"$WORK/bench_loader" "$WORK/data"
