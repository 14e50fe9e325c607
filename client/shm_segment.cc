#include "client/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/grpc_status.h"

namespace dfa::client {

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(
    v1::Worker::Stub* stub, grpc::ClientContext* ctx,
    const v1::CreateSharedMemoryRequest& request) {
  if (request.bytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm: size must be > 0, got ",
                                                   request.bytes()));
  }
  v1::CreateSharedMemoryResponse resp;
  RETURN_IF_ERROR(FromGrpcStatus(stub->CreateSharedMemory(ctx, request, &resp),
                                 "worker CreateSharedMemory"));
  const std::string& path = resp.path();
  if (resp.bytes() != request.bytes() || resp.shm_name().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm: the worker answered a segment of ", resp.bytes(), " bytes named '",
        resp.shm_name(), "' for ", request.bytes(), " asked"));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm: cannot open the worker's segment at ", path, ": ", std::strerror(errno),
        " (the worker is on another host, runs as another user or in another pid namespace; "
        "use the gRPC path)"));
  }
  struct stat sb {};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &sb) != 0 || sb.st_size != request.bytes() || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "shm: ", path, " is not the sealed segment of ", request.bytes(), " bytes the worker "
        "announced"));
  }
  void* addr = mmap(nullptr, static_cast<size_t>(request.bytes()), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (addr == MAP_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat("shm: mmap of ", request.bytes(),
                                                      " bytes of ", path, " failed: ",
                                                      std::strerror(map_errno)));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(resp.shm_name(), addr, request.bytes()));
}

ShmSegment::~ShmSegment() { munmap(addr_, static_cast<size_t>(size_)); }

}  // namespace dfa::client
