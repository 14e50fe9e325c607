// The client's data plane to ONE worker: uploads of Q/K/V/dO rows the worker owns, downloads of
// O/LSE/dQ/dK/dV, seeded synthetic inputs, over a gRPC stream (TensorChunks with CRC32C) or,
// on the same host, through shared memory the worker makes (Worker.CreateSharedMemory,
// Worker.SharedMemoryTransfer).
// Tensor bytes never pass through the coordinator. Every call carries the session's capability
// (CreateSessionResponse.session_capability) as metadata "x-dfa-session-capability"
// (core/session_capability.h); the worker refuses calls without it (PERMISSION_DENIED).
//
// The gRPC streams are raw (client/raw_stream.h: grpc::GenericStub, public API) so that chunk
// data is neither copied into nor out of a protobuf; the messages on the wire are worker.proto's
// UploadRequest / UploadResponse and DownloadRequest / TensorChunk.
//
// Copies: a gRPC upload checksums the caller's rows and hands them to gRPC in place (slices
// that reference the tensor; no protobuf, no copy in this process: the kernel's socket copy is
// the only one); a gRPC download parses each chunk inside gRPC's receive buffer
// (worker/chunk_wire.h) and copies it once into the tensor, checksumming in the same pass.
// Shared memory moves pieces of <= 8 MiB through two segments kept for the session (and kept
// mapped by the worker: keep_mapping), pipelined: the client packs piece i+1 while the worker
// copies piece i in (upload), or unpacks piece i while the worker writes piece i+1 (download).
//
// Head-split sessions (schedule "heads"): the worker holds a range of the heads of its rows
// (set_heads); the full host tensors are sliced by heads on the way out and filled by heads on
// the way back.
//
// Thread safety: one object may be used by one thread at a time, except that one upload and one
// download may run at once (each direction keeps shared-memory segments of its own between
// calls); objects for different workers run in parallel (Session does that). The tensors passed in must outlive the call; downloads
// write only the rows of `ranges`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/time/time.h"
#include "client/host_tensor.h"
#include "client/shard_io.h"
#include "client/shm_segment.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"

namespace dfa::client {

// Called with the number of bytes just moved (from any thread; must be thread-safe).
using ProgressFn = std::function<void(int64_t bytes)>;

struct TransferStats {
  int64_t bytes = 0;
  int64_t chunks = 0;
  double seconds = 0;
};

// A download of a job's outputs while the job may still run (DownloadRequest.await_job_id): the
// worker sends rows as they become final. Empty job_id: a plain download. `timeout` bounds the
// worker's wait for each chunk's (or shared-memory block's) rows and lengthens each call's
// deadline by as much.
struct OutputAwait {
  std::string job_id;
  absl::Duration timeout = absl::Minutes(2);
};

class WorkerDataClient {
 public:
  static constexpr int64_t kMaxShmPieceBytes = int64_t{8} << 20;

  // `capability`: the session's (empty: none sent; only sessions opened without one accept it).
  WorkerDataClient(std::shared_ptr<grpc::Channel> channel, std::string address,
                   std::string session_id, std::string client_id, std::string capability,
                   absl::Duration timeout);

  // The heads of the full tensors this worker holds (ShardPlacement.q_heads / kv_heads;
  // ShardHeads in shard_io.h): every transfer below moves those heads of its rows. Default:
  // all heads. Set before the first transfer.
  void set_heads(HeadSlice q_heads, HeadSlice kv_heads) {
    q_heads_ = q_heads;
    kv_heads_ = kv_heads;
  }
  HeadSlice heads(v1::TensorKind kind) const { return IsKvKind(kind) ? kv_heads_ : q_heads_; }

  // gRPC client-streaming upload of rows `ranges` of `t` as `kind` chunks of <= chunk_bytes.
  // Errors: the worker's status (DATA_LOSS, OUT_OF_RANGE, NOT_FOUND, ...) with its message;
  // INTERNAL when the worker acknowledges fewer bytes than were sent.
  absl::StatusOr<TransferStats> UploadGrpc(v1::TensorKind kind, const HostTensor& t,
                                           std::span<const v1::RowRange> ranges,
                                           int64_t chunk_bytes, const ProgressFn& progress);
  // Server-streaming download of rows `ranges` of `kind` into `t` (one Download call per range);
  // every chunk is checked (ApplyChunk) and the rows must be covered exactly once.
  absl::StatusOr<TransferStats> DownloadGrpc(v1::TensorKind kind,
                                             std::span<const v1::RowRange> ranges,
                                             int64_t chunk_bytes, HostTensor* t,
                                             const ProgressFn& progress,
                                             const OutputAwait& await = {});
  // Same-host path: pieces of at most min(segment_bytes / 2, kMaxShmPieceBytes) (whole rows)
  // through two segments kept between calls, two worker calls in flight.
  absl::StatusOr<TransferStats> UploadShm(v1::TensorKind kind, const HostTensor& t,
                                          std::span<const v1::RowRange> ranges,
                                          int64_t segment_bytes, const ProgressFn& progress);
  absl::StatusOr<TransferStats> DownloadShm(v1::TensorKind kind,
                                            std::span<const v1::RowRange> ranges,
                                            int64_t segment_bytes, HostTensor* t,
                                            const ProgressFn& progress,
                                            const OutputAwait& await = {});
  // Asks the worker to fill its shard of Q, K, V (and dO) from `seed`.
  absl::Status GenerateInputs(uint64_t seed, bool with_grad_output);

  // Same-host CUDA IPC (Worker.DeviceTransfer; client/cuda_tensor_io.h builds the request):
  // sends `request` with this session's session_id and client_id filled in. Returns the bytes
  // the worker moved; the worker's status (FAILED_PRECONDITION, INVALID_ARGUMENT, ...)
  // otherwise.
  absl::StatusOr<int64_t> DeviceTransfer(v1::DeviceTransferRequest request);
  // The NCCL path from another host (Worker.ClientGroupTransfer; client/nccl_tensor_io.h builds
  // the request and posts the NCCL side): `group_secret` goes as metadata. The call's deadline
  // is the request's timeout_ms plus this client's timeout.
  absl::StatusOr<int64_t> ClientGroupTransfer(v1::ClientGroupTransferRequest request,
                                              const std::string& group_secret);
  // Standing CUDA IPC transfers of the session's jobs (Worker.BindDeviceTensors; built by
  // client/cuda_tensor_io.h's DeviceBindings). Returns the bytes per job.
  absl::StatusOr<int64_t> BindDeviceTensors(v1::BindDeviceTensorsRequest request);

  // Sends raw, caller-made chunks (tests use it to send malformed ones).
  absl::StatusOr<v1::UploadResponse> UploadChunks(std::span<const v1::TensorChunk> chunks);

  const std::string& address() const { return address_; }

 private:
  absl::StatusOr<TransferStats> ShmTransfer(v1::TensorKind kind,
                                            std::span<const v1::RowRange> ranges,
                                            int64_t segment_bytes, bool upload, HostTensor* t,
                                            const ProgressFn& progress,
                                            const OutputAwait& await = {});

  // Deadline and capability of one call.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // Makes sure segments_[upload][0..n) exist and hold `bytes` each.
  absl::Status EnsureSegments(bool upload, int n, int64_t bytes);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  grpc::GenericStub raw_stub_;  // Upload and Download as raw chunk streams
  // Kept between shared-memory transfers, two per direction ([0] downloads, [1] uploads): their
  // pages stay mapped here (no page faults on reuse) and, through keep_mapping, in the worker
  // (which keeps up to 4 per session).
  std::unique_ptr<ShmSegment> segments_[2][2];
  HeadSlice q_heads_, kv_heads_;
  std::string address_;
  std::string session_id_;
  std::string client_id_;
  std::string capability_;
  absl::Duration timeout_;
};

}  // namespace dfa::client
