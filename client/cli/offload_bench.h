// `dfa bench --offload`: one attention layer of a job whose tensors live in CUDA memory on the
// workers' host (this process cudaMallocs them, as PyTorch's caching allocator does), offloaded
// to the service, against the same layer computed in this process by the kernels' backend (the
// local baseline: no service, no copies), in the same run with alternating rounds. For each S:
// forward + backward, causal, 32/8 heads, D 128, bf16 by default; the service through CUDA IPC
// (client/device_attention_job.h) split into transfer / compute / control plane, and through the
// host paths (shared memory, gRPC: the tensors copied to host memory and back, counted);
// outputs compared with the local ones within bf16 tolerance. Its Python twin,
// `python -m dfa bench --offload` (client/python/dfa/offload_bench.py), starts from torch
// tensors and compares with PyTorch SDPA (cuDNN). docs/gpu-service.md has the figures.
#pragma once

#include "client/cli/args.h"
#include "client/cli/command.h"
#include "core/status.h"

namespace dfa::cli {

// The flags of `dfa bench` that only --offload reads (its table's "Offload" group).
FlagGroup OffloadFlagGroup();
// Runs the benchmark; UNIMPLEMENTED when this `dfa` was built without CUDA.
absl::Status RunOffloadBench(Args& args);

}  // namespace dfa::cli
