#!/usr/bin/env bash
# Copies the GPU test/benchmark binaries from BUILD (default build-kernels-cuda) and the shared
# libraries they need into $DST (default .gpu-kernels/, ignored by git), to be carried to the GPU
# machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-kernels-cuda}
dst=${DST:-$root/.gpu-kernels}
mkdir -p "$dst/lib"
for p in cuda_backend_test dfa_kernel_bench dfa_sdpa_cases; do cp -u "$build/tests/gpu/$p" "$dst/"; done
"$root/../shared/gpu/bundle-libs" "$dst/lib" "$dst"/cuda_backend_test "$dst"/dfa_kernel_bench "$dst"/dfa_sdpa_cases
