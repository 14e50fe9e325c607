#!/usr/bin/env bash
# Checks that the kernels of the working tree compile to the same PTX as those of git revision
# REV (default HEAD), kernel by kernel, names and labels normalised: the proof that a change
# (e.g. a new template flag such as kIntervals' kIv) leaves the existing instantiations as they
# were. Kernels only in the working tree are listed as new. Needs nvcc, no GPU.
#   tests/gpu/dense_ptx_check.sh [REV] [FILE.cu ...]   (default: flash_{fwd,bwd}_bf16_hdim128.cu)
# Exits non-zero when an old kernel's PTX differs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rev=${1:-HEAD}
shift || true
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(flash_fwd_bf16_hdim128.cu flash_bwd_bf16_hdim128.cu)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/base"
(cd "$root" && git archive "$rev" kernels/cuda core) | tar -x -C "$tmp/base"
status=0
for f in "${files[@]}"; do
  for side in base new; do
    inc=$([ $side = base ] && echo "$tmp/base" || echo "$root")
    "$nvcc" -I"$inc" -O3 -DNDEBUG -arch=sm_90a -std=c++17 -x cu -ptx "$inc/kernels/cuda/$f" \
      -o "$tmp/$side.ptx"
  done
  python3 - "$tmp/base.ptx" "$tmp/new.ptx" "$f" <<'PY' || status=1
import re, sys
def kernels(path):
    out = {}
    for part in re.split(r'\n(?=\.visible \.entry )', open(path).read())[1:]:
        name = re.match(r'\.visible \.entry (\S+)\(', part).group(1)
        body = part.replace(name, 'F')
        for pat, rep in ((r'_param_\d+', '_param'), (r'\$L__BB\d+_', '$L__BB_'),
                         (r'param\[\d+\]', 'param[N]'), (r'\$L__tmp\d+', 'T'), (r'// \.globl.*', '')):
            body = re.sub(pat, rep, body)
        out[name] = body
    return out
base, new = kernels(sys.argv[1]), kernels(sys.argv[2])
bad = 0
for name, body in base.items():
    # A new trailing template flag mangles as L<b0>E before the parameter list.
    match = [n for n in new if n == name or n.replace('Lb0E', '') == name]
    same = bool(match) and new[match[0]] == body
    bad += not same
    print(f"{sys.argv[3]}: {'same' if same else 'DIFFERS'}  {name}")
for name in new:
    if name not in base and name.replace('Lb0E', '') not in base:
        print(f"{sys.argv[3]}: new  {name}")
sys.exit(1 if bad else 0)
PY
done
exit $status
