# Source this on the GPU machine (from the repository root) before running anything built here:
# the libraries carried in $DFA_GPU_DIR/lib, NCCL from PyTorch's environment, NVLink multicast
# off (a program that uses it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DFA_GPU_DIR=${DFA_GPU_DIR:-$PWD/.gpu-service}
NCCL_LIB=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
export LD_LIBRARY_PATH=$DFA_GPU_DIR/lib:$NCCL_LIB:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$DFA_GPU_DIR/lib/ucx
export PYTHONUNBUFFERED=1
# cuDNN 9 from PyTorch's environment, for workers started with --backend=cudnn (loaded at run time).
CUDNN_LIB=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$CUDNN_LIB" ] && export LD_LIBRARY_PATH=$CUDNN_LIB:$LD_LIBRARY_PATH
