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
//   opening the handle                  UNAVAILABLE; range past the allocation INVALID_ARGUMENT
//   downloads of O/LSE/dQ/dK/dV         FAILED_PRECONDITION before their job ran
//
// Mappings: each session keeps the client allocations it opened (WorkerSession::cuda_ipc, a
// CudaIpcImporter on the session's device) until the session is closed and destroyed, so a
// training loop that reuses its buffers opens each handle once.
// Threads: the caller holds session->mu and has checked that no job runs (as for shared memory);
// the copy runs on the backend's default stream and is synchronised before returning.
#pragma once

#include <cstdint>

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

}  // namespace dfa
