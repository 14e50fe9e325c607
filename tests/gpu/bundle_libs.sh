#!/usr/bin/env bash
# Copies the shared libraries that the given programs load (as `ldd` resolves them here) into
# OUT_DIR, so that programs built on this machine run on the GPU machine, whose image has the C
# and C++ runtimes and the CUDA driver but not gRPC, protobuf, abseil, UCX and the like. Left out:
# glibc's libraries and the dynamic loader, libstdc++ / libgcc_s, the CUDA driver (libcuda,
# libnvidia-*), NCCL and cuDNN (the GPU machine's own, from its PyTorch environment). When UCX is
# bundled, its transport modules (loaded at run time, not seen by ldd) go to OUT_DIR/ucx; point
# UCX_MODULE_DIR there.
#   tests/gpu/bundle_libs.sh OUT_DIR PROGRAM...
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out"
skip='/(ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libnvidia-[^/]*|libnccl|libcudnn[^/]*)\.so'
for prog in "$@"; do
  [ -x "$prog" ] || { echo "bundle_libs: $prog is not an executable" >&2; exit 2; }
  if ldd "$prog" | grep -q "not found"; then
    echo "bundle_libs: $prog needs libraries this machine does not have:" >&2
    ldd "$prog" | grep "not found" >&2
    exit 1
  fi
  ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | { grep -Ev "$skip" || true; } |
    while read -r lib; do cp -Lu "$lib" "$out/"; done
done
if ls "$out"/libucp.so* >/dev/null 2>&1; then
  for dir in /usr/lib/x86_64-linux-gnu/ucx /usr/lib64/ucx /usr/local/lib/ucx; do
    if [ -d "$dir" ]; then
      mkdir -p "$out/ucx"
      cp -Lu "$dir"/*.so* "$out/ucx/"
      break
    fi
  done
fi
du -sh "$out"
