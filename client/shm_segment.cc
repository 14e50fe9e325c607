#include "client/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dfa::client {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm: size must be > 0, got ", bytes));
  }
  static std::atomic<uint64_t> counter{0};
  std::string name = absl::StrCat("/dfa-client-", getpid(), "-", counter.fetch_add(1));
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  }
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm: cannot reserve ", bytes, " bytes for ", name, ": ", std::strerror(rc)));
  }
  void* addr = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (addr == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm: mmap of ", bytes, " bytes failed: ", std::strerror(map_errno)));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(std::move(name), addr, bytes));
}

ShmSegment::~ShmSegment() {
  munmap(addr_, static_cast<size_t>(size_));
  shm_unlink(name_.c_str());
}

}  // namespace dfa::client
