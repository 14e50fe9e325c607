// A shared-memory segment for the same-host data path (Worker.SharedMemoryTransfer), made and
// owned by the worker for the session (Worker.CreateSharedMemory: a memfd with its size sealed,
// worker/shm_mappings.h) and mapped here through the path the worker returned
// (/proc/<worker pid>/fd/<n>). The client writes and reads it; it can neither shrink nor grow
// it, so a copy on the worker's side can never fault. The worker frees it with the session (or
// when the session makes more than 4); destruction here only unmaps. Not thread-safe;
// move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace dfa::client {

class ShmSegment {
 public:
  // Asks the worker behind `stub` for a segment (`request`: session, client, bytes; `ctx`: the
  // call's deadline and credentials) and maps it. The worker's status on refusal
  // (RESOURCE_EXHAUSTED, NOT_FOUND, ...); FAILED_PRECONDITION when the segment cannot be opened
  // or mapped here (another host, user or pid namespace: use the gRPC path) or is not what the
  // worker said (size, seals).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(
      v1::Worker::Stub* stub, grpc::ClientContext* ctx,
      const v1::CreateSharedMemoryRequest& request);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // SharedMemoryTransferRequest.shm_name of this segment.
  const std::string& name() const { return name_; }
  uint8_t* data() { return static_cast<uint8_t*>(addr_); }
  int64_t size() const { return size_; }

 private:
  ShmSegment(std::string name, void* addr, int64_t size)
      : name_(std::move(name)), addr_(addr), size_(size) {}
  std::string name_;
  void* addr_;
  int64_t size_;
};

}  // namespace dfa::client
