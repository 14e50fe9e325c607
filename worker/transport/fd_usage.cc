#include "worker/transport/fd_usage.h"

#include <dirent.h>
#include <sys/resource.h>

namespace dfa {

int CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

int FdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return r.rlim_cur > static_cast<rlim_t>(1 << 30) ? (1 << 30) : static_cast<int>(r.rlim_cur);
}

bool FdsNearLimit(int headroom) {
  const int limit = FdLimit();
  if (limit < 0) return false;
  const int open = CountOpenFds();
  return open < 0 || open + headroom > limit;
}

}  // namespace dfa
