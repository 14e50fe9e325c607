#include "worker/shm_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

// An open object and its identity and size; closes the descriptor on scope exit.
struct OpenObject {
  int fd = -1;
  struct stat sb {};
  ~OpenObject() {
    if (fd >= 0) close(fd);
  }
};

absl::Status Open(const std::string& name, bool writable, int64_t need, OpenObject* o) {
  o->fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (o->fd < 0) {
    const int e = errno;
    const std::string msg =
        absl::StrCat("shm_name = '", name, "': shm_open failed: ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  if (fstat(o->fd, &o->sb) != 0) return absl::InternalError("fstat of the shared memory failed");
  if (o->sb.st_size < need) {
    return absl::InvalidArgumentError(absl::StrCat("shm_name = '", name, "' has ", o->sb.st_size,
                                                   " bytes; the rows need ", need));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ShmMapping>> Map(const std::string& name, const OpenObject& o,
                                                size_t len, bool writable) {
  auto m = std::make_shared<ShmMapping>();
  // MAP_POPULATE: one page-table fill up front instead of a fault per 4 KiB page.
  void* addr = mmap(nullptr, len, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED | MAP_POPULATE, o.fd, 0);
  if (addr == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of '", name, "': ", std::strerror(errno)));
  }
  m->addr = static_cast<uint8_t*>(addr);
  m->len = len;
  m->dev = o.sb.st_dev;
  m->ino = o.sb.st_ino;
  return m;
}

}  // namespace

ShmMapping::~ShmMapping() {
  if (addr != nullptr) munmap(addr, len);
}

absl::StatusOr<std::shared_ptr<ShmMapping>> MapForCall(const std::string& name, int64_t need,
                                                       bool writable) {
  OpenObject o;
  if (absl::Status st = Open(name, writable, need, &o); !st.ok()) return st;
  return Map(name, o, static_cast<size_t>(need), writable);
}

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMappings::Get(const std::string& name,
                                                             int64_t need) {
  OpenObject o;
  if (absl::Status st = Open(name, /*writable=*/true, need, &o); !st.ok()) return st;
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->first != name) continue;
    std::shared_ptr<ShmMapping> m = it->second;
    kept_.erase(it);
    if (m->dev == o.sb.st_dev && m->ino == o.sb.st_ino && static_cast<int64_t>(m->len) >= need) {
      kept_.emplace_back(name, m);  // most recently used
      return m;
    }
    break;  // the name now names another object (or a larger one): map it afresh
  }
  auto m = Map(name, o, static_cast<size_t>(o.sb.st_size), /*writable=*/true);
  if (!m.ok()) return m.status();
  if (kept_.size() >= kMaxKept) kept_.erase(kept_.begin());
  kept_.emplace_back(name, *m);
  return *m;
}

size_t ShmMappings::kept() const {
  std::lock_guard<std::mutex> l(mu_);
  return kept_.size();
}

}  // namespace dfa
