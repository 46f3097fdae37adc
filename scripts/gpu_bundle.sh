#!/usr/bin/env bash
# scripts/gpu_bundle.sh: the prebuilt bundle scripts/gpu_check.sh unpacks on a GPU machine that
# lacks loom's build packages (docs/gpu.md "The GPU run"): build-gpu/ built here for sm_90 (or
# $CMAKE_CUDA_ARCHITECTURES), and .gpu/bundle.tar.xz holding its loom binary, the tests/gpu
# binaries, bench_gpu_attn and lib/: every shared library they load except the C library's,
# the C++ runtime's and CUDA's own (the GPU machine's toolkit or PyTorch's wheels provide those).
# .gpu/ is ignored by git; the device tool carries it (carry: [".gpu"]).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-gpu
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DLOOM_TESTS=ON -DLOOM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" >/dev/null
tests=$(ls tests/gpu/test_cuda_*.c | xargs -n1 basename | sed 's/\.c$//')
cmake --build "$B" -j "$(nproc)" --target loom bench_gpu_attn comm_driver_dev $tests
stage=$(mktemp -d /tmp/loom-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/lib"
cp "$B/loom" "$stage/"
for t in $tests bench_gpu_attn comm_driver_dev; do cp "$B/tests/$t" "$stage/tests/"; done
skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|linux-vdso)\.so'
for f in "$stage/loom" "$stage"/tests/*; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    cp -L "$path" "$stage/lib/$name"
  done
mkdir -p .gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>"$(git rev-parse --git-common-dir)/info/exclude"
tar -cJf .gpu/bundle.tar.xz -C "$stage" .
ls -la .gpu/bundle.tar.xz
du -sh "$stage/lib"
