#!/usr/bin/env bash
# On the GPU machine (from the repository root, after tests/bench/pack_gpu_python.sh here): the
# Python package with CUDA against cudnn workers on the same GPU. Every step is bounded by
# `timeout`; logs go to $OUT (default ./gpu-out).
#   tests/bench/gpu_python.sh [import|test|bench|cbench|all]...
#     import  dfa imports on the machine's Python 3.12 with CUDA (HAVE_CUDA) and torch sees a GPU
#     test    tests/gpu/service/torch_ipc_test.py (IPC from torch, the GPT example, bad inputs)
#     bench   python -m dfa bench --offload (S 16K, 64K, 256K; host paths at 16K)
#     cbench  dfa bench --offload, the C++ twin (S 16K, 64K; IPC)
#     trace   the IPC path at 16K with DFA_TRACE_OPS=1: the daemons' logs (job and coordinator
#             trace lines, each pass's device timeline) in $OUT/trace/ (not part of `all`)
# DFA_OFFLOAD_SEQS, DFA_OFFLOAD_ROUNDS override the Python bench's lengths and rounds.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
pkg=$root/.gpu-python
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
PY=${PY:-/opt/torch/.venv/bin/python3}
command -v "$PY" >/dev/null || PY=python3
NCCL_LIB=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
export LD_LIBRARY_PATH=$pkg/lib:$NCCL_LIB:${LD_LIBRARY_PATH:-}
# cuDNN 9 from PyTorch's environment, for the cudnn workers (loaded at run time).
CUDNN_LIB=$("$PY" -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$CUDNN_LIB" ] && export LD_LIBRARY_PATH=$CUDNN_LIB:$LD_LIBRARY_PATH
export UCX_MODULE_DIR=$pkg/lib/ucx PYTHONPATH=$pkg DFA_BIN_DIR=$pkg/bin PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
what=("$@")
((${#what[@]})) || what=(all)
has() { for w in "${what[@]}"; do [[ $w == "$1" || $w == all ]] && return 0; done; return 1; }
named() { for w in "${what[@]}"; do [[ $w == "$1" ]] && return 0; done; return 1; }

nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv \
  >"$OUT/machine.txt" 2>&1
rc=0
if has import; then
  timeout 60 "$PY" -c '
import sys, torch, dfa, dfa.torch
from dfa import _dfa
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "dfa HAVE_CUDA", _dfa.HAVE_CUDA, "from", dfa.__file__)
t = torch.empty(4096, device="cuda")
e = _dfa.export_cuda_ipc(t.data_ptr())
print("export_cuda_ipc: handle", len(e["handle"]), "bytes, offset", e["offset"], "of",
      e["allocation_bytes"], "device", e["device"])
' 2>&1 | tee "$OUT/import.log" || rc=1
fi
if has test; then
  timeout 100 "$PY" tests/gpu/service/torch_ipc_test.py 2>&1 | tee "$OUT/torch_ipc_test.log" |
    grep -E "ok$|FAIL|ERROR|Error|Ran |OK|SKIPPED|loss|step" | tail -40
  grep -q "^OK" "$OUT/torch_ipc_test.log" || rc=1
fi
if has bench; then
  timeout 190 "$PY" -m dfa bench --offload --seq "${DFA_OFFLOAD_SEQS:-16384,65536,262144}" \
    --rounds "${DFA_OFFLOAD_ROUNDS:-3}" --host-max-seq 16384 --out "$OUT/offload.jsonl" 2>&1 |
    tee "$OUT/offload_bench.log" | grep -v -E 'Warning|warn\(' | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if has cbench; then
  timeout 60 "$pkg/bin/dfa" bench --offload --seqs 16K,64K --rounds 3 --paths ipc \
    --bin-dir "$pkg/bin" 2>&1 | tee "$OUT/offload_cbench.log" | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if named trace; then
  mkdir -p "$OUT/trace"
  DFA_TRACE_OPS=1 timeout 90 "$PY" -m dfa bench --offload --seq 16384 --rounds 2 --paths ipc \
    --log-dir "$OUT/trace" 2>&1 | tee "$OUT/trace/bench.log" | grep -v -E 'Warning|warn\(' | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  grep -h -E "job trace|coordinator trace" "$OUT"/trace/*.log | tail -12
fi
exit $rc
