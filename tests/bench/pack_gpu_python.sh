#!/usr/bin/env bash
# Builds (here, no GPU needed) the Python package `dfa` for the GPU machine's Python 3.12 WITH
# the CUDA IPC path (dfa._dfa.HAVE_CUDA), and packs it with the daemons into .gpu-python/ (git
# ignores it; name it in the device tool's `carry`):
#   .gpu-python/dfa/        the package: dfa/*.py + _dfa.cpython-312-x86_64-linux-gnu.so
#   .gpu-python/examples/   client/python/examples (train_gpt.py)
#   .gpu-python/bin/        dfa-coordinator, dfa-worker, dfa (from DAEMON_BUILD)
#   .gpu-python/lib/        the shared libraries the GPU machine lacks (tests/gpu/bundle_libs.sh)
# There: PYTHONPATH=$PWD/.gpu-python DFA_BIN_DIR=$PWD/.gpu-python/bin
#        LD_LIBRARY_PATH=$PWD/.gpu-python/lib UCX_MODULE_DIR=$PWD/.gpu-python/lib/ucx
#   tests/bench/pack_gpu_python.sh [PY_BUILD_DIR] [DAEMON_BUILD_DIR]
# PY_BUILD_DIR (default build-gpu-python) is configured client-only (proto, core, client: no
# device kernels) with CUDA on, for the headers in .cache/py312/python3.12 (the GPU machine's
# Python 3.12, pyconfig.h included) or $DFA_PY312_INCLUDE (e.g. a pyenv 3.12's
# include/python3.12, whose pyconfig.h is the real one and is used as it is) and SOABI
# cpython-312-x86_64-linux-gnu; nanobind's CMake
# files come from this machine's pip nanobind and the extension links it statically (NB_STATIC),
# so the GPU machine's own nanobind version does not matter. DAEMON_BUILD_DIR (default build,
# the shared CUDA build) gives the daemons. Builds take /tmp/dfa-build.lock (the team's 2 cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
pybuild=${1:-build-gpu-python}
dbuild=${2:-build}
py_include=${DFA_PY312_INCLUDE:-$root/.cache/py312/python3.12}
soabi=cpython-312-x86_64-linux-gnu
lock=/tmp/dfa-build.lock
bundle=$root/tests/gpu/bundle_libs.sh
[ -f "$py_include/Python.h" ] || { echo "pack: $py_include/Python.h missing" >&2; exit 1; }
[ -f "$py_include/pyconfig.h" ] || { echo "pack: $py_include/pyconfig.h missing" >&2; exit 1; }
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "pack: nvcc not found (the CUDA IPC path needs CUDA)" >&2; exit 1; }

# The headers as the compiler sees them: Debian/Ubuntu's pyconfig.h only dispatches to
# <x86_64-linux-gnu/python3.12/pyconfig.h>, which the copy lacks; the x86-64 Linux build
# configuration of a CPython 3.12 here (pyenv's, the same ABI: sizes, alignment, no debug or
# trace-refs build) stands in for it.
inc=$pybuild/python3.12-include
if [ ! -f "$inc/Python.h" ]; then
  mkdir -p "$inc"
  cp -r "$py_include"/. "$inc/"
  if grep -q '<x86_64-linux-gnu/python3.12/pyconfig.h>' "$inc/pyconfig.h"; then
    real=
    for py in $(command -v python3.12 || true) "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
      d=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) &&
        [ -f "$d/pyconfig.h" ] && { real=$d/pyconfig.h; break; }
    done
    [ -n "$real" ] || { echo "pack: $py_include/pyconfig.h dispatches to the multiarch one," \
      "which is missing, and no local python3.12 has one" >&2; exit 1; }
    cp "$real" "$inc/pyconfig.h"
  fi
fi
if [ ! -f "$pybuild/CMakeCache.txt" ]; then
  mkdir -p "$pybuild"
  cmake -S . -B "$pybuild" -DCMAKE_BUILD_TYPE=Release -DDFA_CLIENT_ONLY=ON -DDFA_WITH_CUDA=ON \
    -DDFA_WERROR=OFF -DDFA_PYTHON_TARGET_INCLUDE="$(realpath "$inc")" \
    -DDFA_PYTHON_TARGET_SOABI=$soabi >"$pybuild/configure.log" 2>&1 ||
    { tail -30 "$pybuild/configure.log" >&2; exit 1; }
fi
flock "$lock" cmake --build "$pybuild" -j2 --target dfa_python
flock "$lock" cmake --build "$dbuild" -j2 --target dfa-coordinator dfa-worker dfa

so=$pybuild/client/python/dfa/_dfa.$soabi.so
[ -f "$so" ] || { echo "pack: $so not built" >&2; exit 1; }
# The extension must carry the CUDA path and target 3.12's ABI.
nm -D --defined-only "$so" | grep PyInit__dfa >/dev/null || { echo "pack: $so has no PyInit__dfa" >&2; exit 1; }
grep -q "DFA_PY_HAVE_CUDA=1" "$pybuild/client/python/CMakeFiles/_dfa.dir/flags.make" ||
  { echo "pack: $so was built without the CUDA IPC path" >&2; exit 1; }

out=.gpu-python
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
cp -r "$pybuild/client/python/dfa" "$out/dfa"
cp -r client/python/examples "$out/examples"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$out"/dfa/_dfa.cpython-3[0-9][0-9]-*.so.tmp
find "$out/dfa" -name '_dfa.*.so' ! -name "_dfa.$soabi.so" -delete
strip --strip-unneeded "$out/dfa/_dfa.$soabi.so" 2>/dev/null || true
for t in dfa-coordinator dfa-worker; do cp "$dbuild/worker/$t" "$out/bin/" 2>/dev/null ||
  cp "$dbuild/coordinator/$t" "$out/bin/"; done
cp "$dbuild/client/dfa" "$out/bin/"
strip --strip-unneeded "$out"/bin/* 2>/dev/null || true
"$bundle" "$out/lib" "$out"/bin/* "$out/dfa/_dfa.$soabi.so" >/dev/null
du -sh "$out"
