#!/usr/bin/env bash
# Copies the cuDNN backend's GPU test and benchmark from BUILD (default build-kernels-cudnn) and
# the shared libraries they need into .cache/gpu-cudnn/ (git-ignored), to be carried to the GPU
# machine (`run` with carry [".cache/gpu-cudnn"]). libcudnn is not bundled (800 MB): the GPU
# machine's PyTorch environment has it (see cudnn_run_on_gpu.sh). libcudart.so.13 is bundled for
# the cuDNN frontend, which loads it at run time.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-kernels-cudnn}
dst=$root/.cache/gpu-cudnn
mkdir -p "$dst/lib"
for p in cudnn_backend_test dfa_cudnn_bench; do cp -u "$build/tests/gpu/$p" "$dst/"; done
"$root/../shared/gpu/bundle-libs" "$dst/lib" "$dst/cudnn_backend_test" "$dst/dfa_cudnn_bench"
cp -Lu /usr/local/cuda/lib64/libcudart.so.13 "$dst/lib/"
rm -f "$dst"/lib/libcudnn*  # always the GPU machine's own cuDNN
du -sh "$dst"
