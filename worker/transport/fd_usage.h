// File descriptors of this process: how many are open and how many the process may have
// (RLIMIT_NOFILE's soft limit, read at each call: `prlimit` may change it while we run). Session
// admission (worker/session_admission.h) and the UCX transport's error mapping use them.
// Thread-safe.
#pragma once

namespace dfa {

// Entries of /proc/self/fd (-1 when it cannot be read).
int CountOpenFds();
// RLIMIT_NOFILE's soft limit (-1 when unlimited or unknown).
int FdLimit();
// True when fewer than `headroom` descriptors are left under the limit.
bool FdsNearLimit(int headroom);

}  // namespace dfa
