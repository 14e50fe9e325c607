"""Runs before the extension dfa._dfa loads: where PyTorch's NCCL (the nvidia-nccl wheel,
nvidia/nccl/lib/libnccl.so.2) is installed, it is loaded first, so the extension's libnccl.so.2
(the NCCL device path, dfa.device_io) binds to the same library torch uses. Otherwise the
loader would take the build's NCCL for the soname and a later `import torch` could fail on a
symbol only torch's newer NCCL has (`import dfa` before `import torch`). Nothing happens where
that wheel is absent."""

import ctypes
import importlib.util
import os


def preload_torch_nccl():
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return None  # the extension then loads the build's NCCL, as without the wheel
            return path
    return None


preload_torch_nccl()
