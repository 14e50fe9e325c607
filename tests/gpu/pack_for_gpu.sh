#!/usr/bin/env bash
# Copies the GPU kernel tests, benchmarks and tools from BUILD (default: build) and the shared
# libraries they need into $DST (default .cache/gpu-kernels, ignored by git), to be carried to the
# GPU machine (`run` with carry [".cache/gpu-kernels"]) and run there by tests/gpu/run_on_gpu.sh.
# The cuDNN backend's test and benchmark come along when BUILD has them; libcudnn itself is the
# GPU machine's own (PyTorch's environment), libcudart.so.13 is bundled for the cuDNN frontend,
# which loads it at run time.
#   tests/gpu/pack_for_gpu.sh [BUILD]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
dst=${DST:-$root/.cache/gpu-kernels}
mkdir -p "$dst/lib"
progs=()
for p in cuda_backend_test dfa-cuda-kernel-bench dfa_sdpa_cases cudnn_backend_test dfa_cudnn_bench; do
  if [ -x "$build/tests/gpu/$p" ]; then
    cp -u "$build/tests/gpu/$p" "$dst/"
    progs+=("$dst/$p")
  elif [ "${p#cudnn}" = "$p" ] && [ "${p#dfa_cudnn}" = "$p" ]; then
    echo "pack_for_gpu: $build/tests/gpu/$p is missing (build it first)" >&2
    exit 1
  fi
done
"$root/tests/gpu/bundle_libs.sh" "$dst/lib" "${progs[@]}"
if [ -x "$dst/cudnn_backend_test" ]; then
  cudart=$(ls /usr/local/cuda/lib64/libcudart.so.13 2>/dev/null || true)
  [ -n "$cudart" ] && cp -Lu "$cudart" "$dst/lib/"
fi
du -sh "$dst"
