// The client's GPU path to workers on another host: NCCL, the client as one extra rank of a
// communicator with its session's workers (the way RL frameworks push weights from a trainer
// to inference servers). No host copy on either side: the worker's NCCL receives into (sends
// from) its session storage, the client's from (into) the caller's CUDA tensor.
//
//   NcclTensorIo io(client.get());                    // one per client, kept across steps
//   io.Upload(*session, v1::TENSOR_Q, q);             // ... K, V; then session->Run(JOB_FORWARD)
//   io.Download(*session, v1::TENSOR_O, o);           // O, LSE, dQ, dK, dV
//   // or io.UploadAuto / DownloadAuto: CUDA IPC when every worker is on this host
//
// The group: made lazily at the first transfer that needs it and reused for every later
// session whose workers are all in it (its ranks are by worker id, so a session that places
// the same workers in another order reuses it too). Making it: NewNcclUniqueId() here (this
// process runs NCCL's bootstrap root: the workers must reach this host),
// Coordinator.JoinClientGroup (the coordinator asks every worker to join, which they do in the
// background), then NcclTransport::Create as the last rank — the workers' own transport
// (core/gpu/nccl_transport.h), non-blocking init, bounded by options.init_timeout (a worker
// that never joins: DEADLINE_EXCEEDED, the communicator aborted, the group dropped).
//
// A transfer: every request is built and checked here first (PlanClientGroupTransfers: the
// tensor's shape, dtype and density, one request per owned range, numbered per worker); then
// one NCCL group of all the client's sends (receives) is posted, one Worker.ClientGroupTransfer
// per range goes to each worker in parallel (each worker posts its side), and the client waits
// for its NCCL group, bounded by options.transfer_timeout. Any failure (a worker refused, a
// worker lost) aborts the communicator and drops the group, so the next call joins a new one;
// the error names the worker.
//
// What qualifies: a dense CUDA tensor (BSHD [B, S, H, D] of the spec's dtype; LSE [B, H, S]
// fp32); sessions whose shards hold all heads (head-split placements: UNIMPLEMENTED, use IPC or
// Upload/Download). Threads: one call at a time per NcclTensorIo.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"
#include "client/cuda_tensor_io.h"
#include "core/status.h"
#include "dfa/v1/coordinator.pb.h"
#include "dfa/v1/worker.pb.h"

namespace dfa {
class NcclTransport;
}

namespace dfa::client {

enum class DevicePath { kCudaIpc, kNccl };

// kCudaIpc when every shard's host is `this_host` (client/client.h: LocalHostName()), kNccl
// otherwise (all workers of the session then go over NCCL).
DevicePath ChooseDevicePath(const v1::CreateSessionResponse& info, const std::string& this_host);

// One request of a transfer and the byte ranges of the caller's tensor that travel with it, in
// the order the worker posts them.
struct PlannedClientTransfer {
  int shard = 0;       // index in the session's shards
  int group_rank = 0;  // the worker's rank in the group
  v1::ClientGroupTransferRequest request;
  struct Piece {
    int64_t offset = 0;  // bytes from t.data
    int64_t bytes = 0;
  };
  std::vector<Piece> pieces;
};

// Pure: checks `t` against the session (INVALID_ARGUMENT naming tensor.shape, tensor.strides,
// tensor.dtype; UNIMPLEMENTED for head-split shards; FAILED_PRECONDITION naming the worker when
// a shard's worker is not in `group`) and builds the requests, numbering each worker's from
// `*next_sequence` (by worker id; advanced).
absl::StatusOr<std::vector<PlannedClientTransfer>> PlanClientGroupTransfers(
    const v1::AttentionSpec& spec, const v1::CreateSessionResponse& info,
    const v1::JoinClientGroupResponse& group, v1::TensorKind kind, const DeviceTensor& t,
    bool upload, int timeout_ms, std::map<std::string, int64_t>* next_sequence);

class NcclTensorIo {
 public:
  struct Options {
    absl::Duration init_timeout = absl::Seconds(60);      // every rank joined by then
    absl::Duration transfer_timeout = absl::Seconds(60);  // one call's NCCL part
  };
  explicit NcclTensorIo(Client* client) : NcclTensorIo(client, Options{}) {}
  NcclTensorIo(Client* client, Options options);
  ~NcclTensorIo();
  NcclTensorIo(const NcclTensorIo&) = delete;
  NcclTensorIo& operator=(const NcclTensorIo&) = delete;

  // `kind` TENSOR_Q, TENSOR_K, TENSOR_V or TENSOR_DO; synchronises the tensor's device first.
  absl::StatusOr<TransferStats> Upload(Session& session, v1::TensorKind kind,
                                       const DeviceTensor& t);
  absl::StatusOr<TransferStats> Download(Session& session, v1::TensorKind kind,
                                         const DeviceTensor& t);
  // The path ChooseDevicePath picks: CUDA IPC (UploadDevice / DownloadDevice) or NCCL.
  absl::StatusOr<TransferStats> UploadAuto(Session& session, v1::TensorKind kind,
                                           const DeviceTensor& t);
  absl::StatusOr<TransferStats> DownloadAuto(Session& session, v1::TensorKind kind,
                                             const DeviceTensor& t);

  // The group in use (nullopt before the first NCCL transfer or after a failure).
  std::optional<v1::JoinClientGroupResponse> group();
  // Groups joined so far (1 when every session reused the first).
  int groups_joined() const { return groups_joined_; }

 private:
  absl::StatusOr<TransferStats> Transfer(Session& session, v1::TensorKind kind,
                                         const DeviceTensor& t, bool upload);
  // Joins a group holding every worker of `session` unless the current one does.
  absl::Status EnsureGroup(Session& session, int device);
  void DropGroup();

  Client* client_;
  const Options options_;
  std::mutex mu_;
  std::optional<v1::JoinClientGroupResponse> group_;
  std::unique_ptr<NcclTransport> transport_;
  std::map<std::string, int64_t> next_sequence_;  // per worker id
  int device_ = -1;
  int groups_joined_ = 0;
};

}  // namespace dfa::client
