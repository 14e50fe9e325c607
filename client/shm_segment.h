// A POSIX shared-memory segment created and owned by the client (shm_open + mmap), for the
// same-host data path (Worker.SharedMemoryTransfer). The name is unique per process and
// segment; the object is unlinked and unmapped on destruction. Not thread-safe; move-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace dfa::client {

class ShmSegment {
 public:
  // Creates a segment of `bytes` (> 0) with its space reserved up front (posix_fallocate), so
  // that a full /dev/shm is an error here (RESOURCE_EXHAUSTED) and never a SIGBUS later.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(int64_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // The name to pass to shm_open (starts with '/').
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
