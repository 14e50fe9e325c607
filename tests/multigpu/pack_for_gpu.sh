#!/usr/bin/env bash
# Builds (here, no GPU needed) what the GPU machine runs and packs it into .gpu-service/ (git
# ignores it; name it in the device tool's `carry`): bin/ the programs, lib/ the shared libraries
# the GPU machine lacks (../shared/gpu/bundle-libs).
#   tests/multigpu/pack_for_gpu.sh [BUILD_DIR] [TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${1:-build-gpu-service}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(arena_allocator_test nccl_transport_test device_memory_pool_test cuda_ipc_test
    cuda_ipc_peer nccl_transport_bench device_ipc_service_test device_ipc_bench dfa-coordinator
    dfa-worker)
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
for t in "${targets[@]}"; do cmake --build "$build" -j2 --target "$t"; done
rm -rf .gpu-service/bin && mkdir -p .gpu-service/bin .gpu-service/lib
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "pack: $t not built" >&2; exit 1; }
  cp "$f" .gpu-service/bin/
  strip --strip-unneeded .gpu-service/bin/"$t" 2>/dev/null || true
done
bundle=${DFA_BUNDLE_LIBS:-$root/../shared/gpu/bundle-libs}
[ -x "$bundle" ] || bundle=/work/shared/gpu/bundle-libs
"$bundle" .gpu-service/lib .gpu-service/bin/*
du -sh .gpu-service
