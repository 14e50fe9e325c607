// Worker.DeviceTransfer (proto/dfa/v1/worker.proto): a client on this host hands its CUDA tensor
// to the worker by CUDA IPC, and the worker copies rows between it and the session's device
// storage on the GPU — a cudaMemcpyAsync per batch when the layouts match (dense rows, same
// dtype), otherwise one strided cast kernel (the backend's Convert): fp32 gradients into a
// bf16/f16 tensor, LSE [B, H, rows] out of the storage's [B, H, local rows], row-strided slices.
// No host staging, no socket.
//
// Checks, in order (each error names the request field):
//   kind, rows                          INVALID_ARGUMENT / OUT_OF_RANGE (inside ONE owned range)
//   tensor.dtype / shape / strides      INVALID_ARGUMENT (against the spec and the rows)
//   tensor.cuda_ipc_handle / offset     INVALID_ARGUMENT (size, sign)
//   host_id                             FAILED_PRECONDITION (client on another host)
//   the session's backend               FAILED_PRECONDITION (cpu worker)
//   opening the handle                  FAILED_PRECONDITION (tensor.cuda_ipc_handle);
//                                       range past the allocation INVALID_ARGUMENT (tensor.offset)
//   downloads of O/LSE/dQ/dK/dV         FAILED_PRECONDITION before their job ran
//
// Mappings: each session keeps the client allocations it opened (WorkerSession::cuda_ipc, a
// CudaIpcImporter on the session's device) until the session is closed and destroyed, so a
// training loop that reuses its buffers opens each handle once.
// Threads: the caller holds session->mu and has checked that no job runs (as for shared memory);
// the copy runs on the backend's default stream and is synchronised before returning.
// Bindings (BindDeviceTensors below): the same transfers, kept by the session and done by the
// worker inside each job, so that a step of a training loop makes no transfer call at all.
#pragma once

#include <cstdint>
#include <string>

#include "dfa/v1/worker.pb.h"
#include "core/status.h"
#include "worker/worker_session.h"

namespace dfa {

// The checks above that need no GPU (kind, rows, tensor shape/dtype/strides, handle size,
// host_id against `this_host`). `bytes_out` gets the size of the session's rows in the client's
// tensor dtype.
absl::Status ValidateDeviceTransfer(const WorkerSession& s, const v1::DeviceTransferRequest& req,
                                    const std::string& this_host, int64_t* bytes_out);

// Validates, then moves the rows. Returns the bytes moved (DeviceTransferResponse.bytes).
absl::StatusOr<int64_t> RunDeviceTransfer(WorkerSession* s, const v1::DeviceTransferRequest& req);

// Worker.BindDeviceTensors: standing transfers the worker does inside every job of a kind, so a
// training step makes no DeviceTransfer call. RunJob (worker_service.cc) runs a job's bound
// inputs (all copies queued, one synchronisation) before the job and its bound outputs after
// it, before the RunJob reply; the copies' time and bytes go to WorkerJobStats.
inline constexpr int kMaxBoundTransfers = 16;

// The checks that need no GPU, for every transfer (errors "transfers[i]: " + DeviceTransfer's):
// job is JOB_FORWARD / JOB_BACKWARD, at most kMaxBoundTransfers, each transfer's kind an input
// (upload) or output (download) of that job. `bytes_out`: the bytes per job.
absl::Status ValidateBinding(const WorkerSession& s, const v1::BindDeviceTensorsRequest& req,
                             const std::string& this_host, int64_t* bytes_out);
// Validates, opens every handle (range checked), then replaces the job kind's bindings.
// Returns the bytes per job. The caller holds s->mu and has checked that no job runs.
absl::StatusOr<int64_t> BindDeviceTensors(WorkerSession* s,
                                          const v1::BindDeviceTensorsRequest& req);

struct BoundTransferStats {
  double seconds = 0;
  int64_t bytes = 0;
};
// The bound inputs (`inputs`) or outputs of `job`, completed on return (inputs count as
// uploaded). Nothing bound: returns at once. The caller holds s->mu.
absl::Status RunBoundTransfers(WorkerSession* s, v1::JobKind job, bool inputs,
                               BoundTransferStats* stats);

}  // namespace dfa
