#!/usr/bin/env bash
# scripts/gpu_check.sh OUT_DIR: the CUDA backend's whole check on a GPU machine, in one command
# (docs/gpu.md "The GPU run"): build (or unpack a prebuilt bundle), run tests/gpu on the GPU,
# then the GPU benchmarks against PyTorch (bench/bench_gpu.py), logs into OUT_DIR, one summary
# table at the end. For a bare machine with the CUDA toolkit and PyTorch but no network.
#
# The build: with loom's build packages installed, cmake builds build-gpu/ (sm_90 only unless
# CMAKE_CUDA_ARCHITECTURES is set). Without them (a GPU image has none of libyaml, oneDNN,
# OpenBLAS, MPI, cmocka), a bundle made beforehand on a machine that has them
# (scripts/gpu_bundle.sh: the binaries and the shared libraries they need, .gpu/bundle.tar.xz)
# is unpacked and used. NCCL and cuBLASLt come from the CUDA toolkit, else from PyTorch's
# nvidia-* wheels.
#   GPU_CHECK_SECTIONS=train,attention,generate (bench_gpu.py --sections), GPU_CHECK_NO_BENCH=1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
t0=$SECONDS
say() { echo "[gpu_check $((SECONDS - t0))s] $*"; }
nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.txt" || true

# libraries the loom binary needs that a GPU image may hold only inside Python wheels
pylibs=$(python3 - <<'PY' 2>/dev/null
import importlib, os
out = []
for m in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        mod = importlib.import_module(m)
        for p in getattr(mod, "__path__", []):
            if os.path.isdir(os.path.join(p, "lib")): out.append(os.path.join(p, "lib"))
    except Exception:
        pass
print(":".join(out))
PY
)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64:/usr/local/cuda/lib${pylibs:+:$pylibs}

B=build-gpu
if [ -f .gpu/bundle.tar.xz ]; then
  say "unpacking the prebuilt bundle .gpu/bundle.tar.xz"
  rm -rf "$B" && mkdir -p "$B" && tar -xJf .gpu/bundle.tar.xz -C "$B" || { say "FAIL: bundle"; exit 1; }
  export LD_LIBRARY_PATH="$PWD/$B/lib:$LD_LIBRARY_PATH"
else
  say "building $B"
  ( cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DLOOM_TESTS=ON -DLOOM_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" &&
    cmake --build "$B" -j "$(nproc)" --target loom comm_driver_dev bench_gpu_attn $(ls tests/gpu/test_cuda_*.c | xargs -n1 basename | sed 's/\.c$//') ) \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; say "FAIL: build (log: $OUT/build.log)"; exit 1; }
fi
"$B/loom" version | tee "$OUT/version.txt"
grep -q '^cuda: device' "$OUT/version.txt" || { say "FAIL: the cuda backend sees no GPU"; exit 1; }

# tests/gpu on the GPU
declare -a names results
for t in "$B"/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  say "test $n"
  s=$SECONDS
  LOOM_TEST_CUDA_BACKEND=cuda timeout 300 "$t" >"$OUT/$n.log" 2>&1
  rc=$?
  names+=("$n"); results+=("$([ $rc = 0 ] && echo pass || echo "FAIL ($rc)") $((SECONDS - s))s $(grep -c '^FAIL' "$OUT/$n.log") failed checks")
done
for t in tests/gpu/test_*.sh; do
  n=$(basename "$t" .sh)
  say "test $n"
  s=$SECONDS
  LOOM_TEST_CUDA_BACKEND=cuda LOOM_BIN="$PWD/$B/loom" LOOM_SRC="$PWD" \
    timeout 400 bash "$t" >"$OUT/$n.log" 2>&1
  rc=$?
  names+=("$n"); results+=("$([ $rc = 0 ] && echo pass || echo "FAIL ($rc)") $((SECONDS - s))s")
done

# the benchmarks
if [ -z "${GPU_CHECK_NO_BENCH:-}" ]; then
  say "bench/bench_gpu.py"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/bench_gpu.py --out "$OUT" --loom "$B/loom" \
    --sections "${GPU_CHECK_SECTIONS:-train,attention,generate}" >"$OUT/bench.log" 2>&1
  brc=$?
fi

echo
echo "## gpu_check summary ($(sed -n 's/^cuda: //p' "$OUT/version.txt"); $((SECONDS - t0)) s)"
echo "| test | result |"
echo "|---|---|"
for i in "${!names[@]}"; do echo "| ${names[$i]} | ${results[$i]} |"; done
if [ -z "${GPU_CHECK_NO_BENCH:-}" ]; then
  echo
  [ -f "$OUT/bench_gpu.md" ] && cat "$OUT/bench_gpu.md" || { echo "bench_gpu.py failed ($brc):"; tail -20 "$OUT/bench.log"; }
fi
fail=0
for r in "${results[@]}"; do case "$r" in pass*) ;; *) fail=1 ;; esac; done
exit $fail
