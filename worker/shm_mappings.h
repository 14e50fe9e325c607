// Client shared-memory segments as the worker maps them (Worker.SharedMemoryTransfer).
//
// A call maps the POSIX shared-memory object the client named, copies, and unmaps
// (MapForCall); or, when the client keeps its segment for the session
// (SharedMemoryTransferRequest.keep_mapping), the session keeps the whole object mapped between
// calls (ShmMappings::Get): mapping a segment (page-table fill) costs about as much as copying a
// few MiB, so per-call mapping halves the shared-memory rate for pieces of a few MiB.
//
// A kept mapping is reused only while the name still names the same object (device and inode
// checked with an open + fstat every call, a few microseconds) and the object is still large
// enough; otherwise it is replaced. At most kMaxKept per session (least recently used dropped);
// all are unmapped when the session (their owner) is destroyed. A mapping handed out stays
// valid while the caller holds its shared_ptr, even if it is dropped from the set meanwhile.
//
// Threads: ShmMappings is thread-safe. Errors name the request field: NOT_FOUND (no such
// object), PERMISSION_DENIED (cannot open it), INVALID_ARGUMENT (smaller than `need`),
// INTERNAL (mmap failed).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dfa {

struct ShmMapping {
  ShmMapping() = default;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  uint8_t* addr = nullptr;
  size_t len = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Maps the first `need` (> 0) bytes of object `name` for one call: read-only when !writable.
absl::StatusOr<std::shared_ptr<ShmMapping>> MapForCall(const std::string& name, int64_t need,
                                                       bool writable);

class ShmMappings {
 public:
  static constexpr size_t kMaxKept = 4;

  // A read-write mapping of the whole object `name`, at least `need` (> 0) bytes long.
  absl::StatusOr<std::shared_ptr<ShmMapping>> Get(const std::string& name, int64_t need);
  // Number of mappings kept now (tests).
  size_t kept() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<ShmMapping>>> kept_;  // most recent last
};

}  // namespace dfa
