#!/usr/bin/env bash
# Puts the header-only cuDNN C++ frontend where CMake looks for it (.cache/cudnn-frontend/include,
# git-ignored), from PyPI's nvidia-cudnn-frontend wheel (which ships include/cudnn_frontend*.h).
# Only the headers are used: the wheel's Python module is not installed. Idempotent; without
# network or pip it says so and exits 0 (the cuDNN backend is then simply not built).
#   kernels/cuda/cudnn_frontend_setup.sh [VERSION]      (default 1.32.0)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=${1:-1.32.0}
dst=$root/.cache/cudnn-frontend
if [ -f "$dst/include/cudnn_frontend.h" ] && grep -q "MINOR_VERSION $(echo "$version" | cut -d. -f2)\b" \
    "$dst/include/cudnn_frontend_version.h" 2>/dev/null; then
  exit 0
fi
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Any platform wheel carries the same headers; ask for one that exists for this interpreter.
if ! "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$tmp" "nvidia-cudnn-frontend==$version" 2>"$tmp/err"; then
  echo "cudnn_frontend_setup: could not download nvidia-cudnn-frontend==$version (cuDNN backend not built):" >&2
  tail -2 "$tmp/err" >&2
  exit 0
fi
rm -rf "$dst"
mkdir -p "$dst"
"$py" - "$tmp" "$dst" <<'PY'
import glob, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(src + "/*.whl")[0]) as z:
    z.extractall(dst, [n for n in z.namelist() if n.startswith("include/")])
PY
echo "cudnn_frontend_setup: cuDNN frontend $version headers in $dst/include"
