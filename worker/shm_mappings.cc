#include "worker/shm_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/random_id.h"

namespace dfa {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

absl::Status SysError(const char* what, int e) {
  const std::string msg = absl::StrCat("shared memory: ", what, " failed: ", std::strerror(e));
  if (e == ENOSPC || e == ENOMEM || e == EMFILE || e == ENFILE) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace

ShmMapping::~ShmMapping() {
  if (addr != nullptr) munmap(addr, len);
  if (fd >= 0) close(fd);
  if (budget != nullptr) budget->Release(static_cast<int64_t>(len));
}

absl::StatusOr<ShmMappings::Created> ShmMappings::Create(int64_t bytes, MemoryBudget* budget) {
  if (bytes < 1 || bytes > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat("bytes = ", bytes, " must be in [1, ",
                                                   kMaxSegmentBytes, "]"));
  }
  auto m = std::make_shared<ShmMapping>();
  if (budget != nullptr) {
    if (absl::Status st = budget->Reserve(bytes); !st.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shared-memory segment of ", bytes, " bytes: ", st.message()));
    }
    m->budget = budget;
  }
  m->len = static_cast<size_t>(bytes);  // the reservation the destructor releases
  m->fd = memfd_create("dfa-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m->fd < 0) return SysError("memfd_create", errno);
  if (ftruncate(m->fd, static_cast<off_t>(bytes)) != 0) return SysError("ftruncate", errno);
  if (const int rc = posix_fallocate(m->fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    return SysError("fallocate", rc);
  }
  if (fcntl(m->fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    return SysError("fcntl(F_ADD_SEALS)", errno);
  }
  const int seals = fcntl(m->fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return absl::InternalError("shared memory: the segment's size seals did not take");
  }
  void* addr =
      mmap(nullptr, m->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m->fd, 0);
  if (addr == MAP_FAILED) return SysError("mmap", errno);
  m->addr = static_cast<uint8_t*>(addr);

  Created c;
  c.name = RandomId("shm-");
  c.path = absl::StrCat("/proc/", getpid(), "/fd/", m->fd);
  c.bytes = bytes;
  std::lock_guard<std::mutex> l(mu_);
  if (kept_.size() >= kMaxSegments) kept_.erase(kept_.begin());
  kept_.emplace_back(c.name, std::move(m));
  return c;
}

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMappings::Find(const std::string& name,
                                                              int64_t need) {
  std::shared_ptr<ShmMapping> m;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first != name) continue;
      m = it->second;
      if (std::next(it) != kept_.end()) {  // most recently used last
        auto entry = std::move(*it);
        kept_.erase(it);
        kept_.push_back(std::move(entry));
      }
      break;
    }
  }
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "shm_name = '", name.substr(0, 64), "' is not a segment this worker made for the session ",
        "(CreateSharedMemory; the 4 most recent are kept)"));
  }
  // The seals make a shorter segment impossible; checked anyway, before every copy.
  struct stat sb {};
  if (fstat(m->fd, &sb) != 0) return SysError("fstat", errno);
  if (sb.st_size < need || static_cast<int64_t>(m->len) < need) {
    return absl::OutOfRangeError(absl::StrCat("shm_name = '", name, "' has ",
                                              std::min<int64_t>(sb.st_size, m->len),
                                              " bytes; the rows need ", need));
  }
  return m;
}

size_t ShmMappings::kept() const {
  std::lock_guard<std::mutex> l(mu_);
  return kept_.size();
}

}  // namespace dfa
