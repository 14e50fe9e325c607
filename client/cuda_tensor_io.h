// The client's same-host GPU path: a training process hands its CUDA tensors to the session's
// GPU workers by CUDA IPC (Worker.DeviceTransfer), and the workers copy device to device between
// that memory and their session storage — no copy through host memory, no socket.
//
//   DeviceTensor q = DeviceTensor::Dense(q_ptr, DType::kBF16, {B, S, Hq, D});
//   RETURN_IF_ERROR(UploadDevice(*session, v1::TENSOR_Q, q).status());   // ... K, V
//   ASSIGN_OR_RETURN(v1::Job job, session->Run(v1::JOB_FORWARD));
//   RETURN_IF_ERROR(DownloadDevice(*session, v1::TENSOR_O, o).status());  // into CUDA memory
//
// What qualifies: memory from cudaMalloc (PyTorch's default caching allocator: a tensor's
// data_ptr() with its sizes/strides), on any GPU of this host; not cudaMallocAsync pools nor
// expandable segments (cudaIpcGetMemHandle refuses them: INVALID_ARGUMENT / INTERNAL here).
// Every worker of the session must be a cuda/cudnn worker on this host (FAILED_PRECONDITION
// from the worker otherwise; fall back to Session::Upload/Download with host tensors).
//
// Lifetime: the workers keep each allocation they were handed mapped until the session is
// released, so keep the memory allocated (or release the session) before freeing it.
// Ordering: UploadDevice synchronises the tensor's device first (options.synchronize), so work
// queued on it that writes the tensor has finished; DownloadDevice returns after the workers'
// copies have completed, so the data is visible to kernels the caller queues afterwards.
// Threads: like Session::Upload (one call per session at a time; one thread per worker inside).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "core/dtype.h"
#include "core/status.h"

namespace dfa::client {

// A strided tensor in CUDA memory, covering the whole sequence: BSHD kinds
// [batch, seq_len, heads, head_dim], LSE [batch, heads, seq_len] (fp32).
struct DeviceTensor {
  void* data = nullptr;  // device pointer of element [0, 0, 0(, 0)]
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements, one per dim; empty: dense row major

  static DeviceTensor Dense(void* data, DType dtype, std::vector<int64_t> shape) {
    return DeviceTensor{data, dtype, std::move(shape), {}};
  }
  // The strides, dense ones when `strides` is empty.
  std::vector<int64_t> EffectiveStrides() const;
};

struct DeviceTransferOptions {
  // Upload: cudaDeviceSynchronize on the tensor's device before handing it over.
  bool synchronize = true;
};

// Hands rows of `t` to every worker owning them (all workers in parallel, one request per owned
// range). `kind` is TENSOR_Q, TENSOR_K, TENSOR_V or TENSOR_DO. Errors: INVALID_ARGUMENT naming
// the tensor field (shape, strides, dtype: the worker names those it checks), the worker's
// FAILED_PRECONDITION (another host, cpu worker, a handle that cannot be opened here).
absl::StatusOr<TransferStats> UploadDevice(Session& session, v1::TensorKind kind,
                                           const DeviceTensor& t,
                                           const DeviceTransferOptions& options = {});
// Writes `kind` (any tensor kind; dQ/dK/dV may target an fp32 tensor) of every worker's rows
// into `t`.
absl::StatusOr<TransferStats> DownloadDevice(Session& session, v1::TensorKind kind,
                                             const DeviceTensor& t);

// Standing transfers (Worker.BindDeviceTensors): tensors the workers move INSIDE each later job
// of one kind of the session — inputs (upload) copied in as the job starts, outputs written
// into `tensor` before the job's reply — so a training step makes no transfer call.
struct DeviceBinding {
  v1::TensorKind kind = v1::TENSOR_Q;
  const DeviceTensor* tensor = nullptr;
  bool upload = true;
};

// A session's bindings as its workers hold them: Bind sends a worker its new requests only when
// they differ from what it was last sent (same memory, handles, shapes: nothing is sent), so a
// loop that reuses its tensors binds once. Forget() after the session is released or replaced.
// One thread at a time.
class DeviceBindings {
 public:
  // Binds `bindings` to `job` (JOB_FORWARD: Q, K, V in, O, LSE out; JOB_BACKWARD: dO in,
  // dQ, dK, dV out) on every worker of `session` (one request per worker that needs it, all in
  // parallel), replacing that kind's earlier bindings. With options.synchronize it first
  // synchronises the devices of the input tensors (work queued on them that writes them has
  // finished before the job reads them). Errors: as UploadDevice / DownloadDevice, the
  // worker's naming "transfers[i]" and the field. stats.chunks = requests sent (0: every
  // worker already held these bindings), stats.seconds their time; nothing moves here.
  absl::StatusOr<TransferStats> Bind(Session& session, v1::JobKind job,
                                     const std::vector<DeviceBinding>& bindings,
                                     const DeviceTransferOptions& options = {});
  void Forget() { sent_.clear(); }

 private:
  // (session id, rank, job kind) -> the serialized request that worker holds.
  std::map<std::tuple<std::string, int, int>, std::string> sent_;
};

// The DeviceTransferRequest for rows [r.begin, r.end) and heads `heads` (default all; a
// head-split shard's ShardHeads) of `t`, whose element [0, ...] lies at byte `base_offset` of
// the allocation exported as `ipc_handle` (pure; tests and other front ends use it). A head
// slice is a ref that starts at the slice's first head with heads = the slice's size and the
// tensor's own strides (rows strided over all heads; the worker copies strided rows).
// INVALID_ARGUMENT naming the field when `t` has the wrong number of dimensions, does not cover
// the sequence along its rows dimension, or the slice lies outside its heads.
absl::StatusOr<v1::DeviceTransferRequest> MakeDeviceTransferRequest(
    const v1::AttentionSpec& spec, v1::TensorKind kind, const DeviceTensor& t,
    const std::string& ipc_handle, int64_t base_offset, int device, const v1::RowRange& r,
    bool upload, const std::string& host_id, HeadSlice heads = {});

}  // namespace dfa::client
