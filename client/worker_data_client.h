// The client's data plane to ONE worker: uploads of Q/K/V/dO rows the worker owns, downloads of
// O/LSE/dQ/dK/dV, seeded synthetic inputs, over a gRPC stream (TensorChunks with CRC32C) or,
// on the same host, through a POSIX shared-memory segment (Worker.SharedMemoryTransfer).
// Tensor bytes never pass through the coordinator.
//
// Thread safety: one object may be used by one thread at a time (it keeps its shared-memory
// segment between calls); objects for different workers
// run in parallel (Session does that). The tensors passed in must outlive the call; downloads
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

namespace dfa::client {

// Called with the number of bytes just moved (from any thread; must be thread-safe).
using ProgressFn = std::function<void(int64_t bytes)>;

struct TransferStats {
  int64_t bytes = 0;
  int64_t chunks = 0;
  double seconds = 0;
};

class WorkerDataClient {
 public:
  WorkerDataClient(std::shared_ptr<grpc::Channel> channel, std::string address,
                   std::string session_id, std::string client_id, absl::Duration timeout);

  // gRPC client-streaming upload of rows `ranges` of `t` as `kind` chunks of <= chunk_bytes.
  // Errors: the worker's status (DATA_LOSS, OUT_OF_RANGE, NOT_FOUND, ...) with its message;
  // INTERNAL when the worker acknowledges fewer bytes than were sent.
  absl::StatusOr<TransferStats> UploadGrpc(v1::TensorKind kind, const HostTensor& t,
                                           std::span<const v1::RowRange> ranges,
                                           int64_t chunk_bytes, const ProgressFn& progress);
  // Server-streaming download of rows `ranges` of `kind` into `t` (one Download call per range);
  // every chunk is checked (ApplyChunk) and the rows must be covered exactly once.
  absl::StatusOr<TransferStats> DownloadGrpc(v1::TensorKind kind, std::span<const v1::RowRange> ranges,
                                             int64_t chunk_bytes, HostTensor* t,
                                             const ProgressFn& progress);
  // Same-host path: one segment of at most `segment_bytes`, reused for pieces of the ranges.
  absl::StatusOr<TransferStats> UploadShm(v1::TensorKind kind, const HostTensor& t,
                                          std::span<const v1::RowRange> ranges,
                                          int64_t segment_bytes, const ProgressFn& progress);
  absl::StatusOr<TransferStats> DownloadShm(v1::TensorKind kind,
                                            std::span<const v1::RowRange> ranges,
                                            int64_t segment_bytes, HostTensor* t,
                                            const ProgressFn& progress);
  // Asks the worker to fill its shard of Q, K, V (and dO) from `seed`.
  absl::Status GenerateInputs(uint64_t seed, bool with_grad_output);

  // Sends raw, caller-made chunks (tests use it to send malformed ones).
  absl::StatusOr<v1::UploadResponse> UploadChunks(std::span<const v1::TensorChunk> chunks);

  const std::string& address() const { return address_; }

 private:
  absl::StatusOr<TransferStats> ShmTransfer(v1::TensorKind kind, std::span<const v1::RowRange> ranges,
                                            int64_t segment_bytes, bool upload, HostTensor* t,
                                            const ProgressFn& progress);

  std::unique_ptr<v1::Worker::Stub> stub_;
  // Kept between shared-memory transfers: its pages stay mapped (no page faults on reuse).
  std::unique_ptr<ShmSegment> segment_;
  std::string address_;
  std::string session_id_;
  std::string client_id_;
  absl::Duration timeout_;
};

}  // namespace dfa::client
