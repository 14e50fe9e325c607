// Shared-memory segments of one session (Worker.CreateSharedMemory, Worker.SharedMemoryTransfer),
// made and owned by the worker: the worker maps no object a client names.
//
// Create(bytes) makes a memfd (memfd_create with MFD_ALLOW_SEALING), sizes it and reserves its
// pages (ftruncate + fallocate: a full tmpfs is RESOURCE_EXHAUSTED here, never a SIGBUS later),
// seals its size (F_SEAL_SHRINK | F_SEAL_GROW, then F_SEAL_SEAL; checked back with
// F_GET_SEALS) and maps it read-write. The client opens it through the path Create returns,
// /proc/<worker pid>/fd/<fd>, and may write and read it, but can neither shrink it (which would
// make the worker's copy fault) nor grow it, nor lift the seals. SharedMemoryTransfer finds the
// segment by the random name Create gave it (core/random_id.h); before every copy Find checks
// with fstat that the segment holds the bytes the copy touches.
//
// Accounting: each segment's bytes are reserved in the worker's MemoryBudget while it exists.
// At most kMaxSegments per session: a new one drops the least recently used (a transfer that
// holds a dropped segment keeps it mapped until it is done). All go with the session.
//
// Threads: ShmMappings is thread-safe. Errors: INVALID_ARGUMENT (size), RESOURCE_EXHAUSTED
// (memory limit, tmpfs or descriptors full), NOT_FOUND (shm_name unknown to the session),
// OUT_OF_RANGE (the copy is larger than the segment), INTERNAL (a system call failed otherwise).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/memory_budget.h"

namespace dfa {

struct ShmMapping {
  ShmMapping() = default;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();  // unmaps, closes, releases the reservation

  uint8_t* addr = nullptr;
  size_t len = 0;
  int fd = -1;
  MemoryBudget* budget = nullptr;  // where `len` bytes are reserved (null: none)
};

class ShmMappings {
 public:
  static constexpr size_t kMaxSegments = 6;  // a client keeps 2 per direction, + a resize each
  static constexpr int64_t kMaxSegmentBytes = int64_t{1} << 30;

  struct Created {
    std::string name;  // CreateSharedMemoryResponse.shm_name
    std::string path;  // CreateSharedMemoryResponse.path
    int64_t bytes = 0;
  };

  // A new sealed segment of `bytes`, reserved in `budget` (may be null).
  absl::StatusOr<Created> Create(int64_t bytes, MemoryBudget* budget);
  // The segment `name`, checked to hold at least `need` bytes now.
  absl::StatusOr<std::shared_ptr<ShmMapping>> Find(const std::string& name, int64_t need);
  // Segments kept now (tests).
  size_t kept() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<ShmMapping>>> kept_;  // most recent last
};

}  // namespace dfa
