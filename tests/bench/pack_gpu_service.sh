#!/usr/bin/env bash
# Builds (here, no GPU needed) what the GPU machine runs for the service and packs it into
# .gpu-service/ (git ignores it; name it in the device tool's `carry`): bin/ the programs, lib/ the
# shared libraries the GPU machine lacks (tests/gpu/bundle_libs.sh).
#   tests/bench/pack_gpu_service.sh [BUILD_DIR] [TARGET...]
# The default targets are what gpu_checks.sh runs; gpu_service.sh and the suites also need
# dfa and dfa-service-io-dump (name all the targets then:
#   tests/bench/pack_gpu_service.sh build-gpu-service dfa dfa-coordinator dfa-worker \
#     dfa-service-io-dump nccl_transport_test device_memory_pool_test nccl_client_group_test).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bundle=$root/tests/gpu/bundle_libs.sh
[ -x "$bundle" ] || { echo "pack: $bundle missing or not executable" >&2; exit 1; }
build=${1:-build-gpu-service}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(arena_allocator_test nccl_transport_test device_memory_pool_test cuda_ipc_test
    cuda_ipc_peer dfa-nccl-transport-bench device_ipc_service_test dfa-device-ipc-bench
    nccl_client_group_test dfa-coordinator dfa-worker)
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
for t in "${targets[@]}"; do cmake --build "$build" -j2 --target "$t"; done
rm -rf .gpu-service/bin && mkdir -p .gpu-service/bin .gpu-service/lib
for t in "${targets[@]}"; do
  # The newest build of the program (a moved test can leave a stale binary at its old path).
  f=$(find "$build" -type f -name "$t" -perm -u+x -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
  [ -n "$f" ] || { echo "pack: $t not built" >&2; exit 1; }
  cp "$f" .gpu-service/bin/
  strip --strip-unneeded .gpu-service/bin/"$t" 2>/dev/null || true
done
"$bundle" .gpu-service/lib .gpu-service/bin/*
du -sh .gpu-service
