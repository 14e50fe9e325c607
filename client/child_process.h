// A child process started by the client tools (dfa demo, dfa bench, integration tests) to run
// a daemon on this host: its stdout and stderr go to a log file; it is stopped with SIGTERM
// and, after a bounded wait, SIGKILL. Destruction stops it. Not thread-safe; move-only.
//
// A child never outlives this process: it is forked from one thread that lives as long as the
// process and set to receive SIGTERM when its parent dies (PR_SET_PDEATHSIG), so a launcher
// killed by SIGKILL, or dying any other way without running its clean-up, still takes its
// daemons with it. The child starts with an empty signal mask, SIGPIPE at its default action,
// stdin on /dev/null and its own process group (a terminal's Ctrl-C reaches only the launcher,
// which stops it).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"

namespace dfa::client {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; output appended to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(std::string name,
                                                             std::vector<std::string> argv,
                                                             std::string log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // False once the process has exited (reaps it; exit_status() then holds its wait status).
  bool Running();
  int exit_status() const { return exit_status_; }
  // SIGTERM, then up to `grace` for it to exit, then SIGKILL. OK when it exited by itself with
  // status 0 or on SIGTERM; INTERNAL (with the log's tail) when it crashed, failed, or had to be
  // killed.
  absl::Status Stop(absl::Duration grace);
  // Sends a signal without waiting (fault tests: SIGKILL, SIGSTOP).
  void Signal(int sig);
  // The last `lines` lines of its log.
  std::string LogTail(int lines) const;

 private:
  ChildProcess(std::string name, pid_t pid, std::string log_path)
      : name_(std::move(name)), pid_(pid), log_path_(std::move(log_path)) {}
  std::string name_;
  pid_t pid_;
  std::string log_path_;
  bool exited_ = false;
  int exit_status_ = 0;
};

}  // namespace dfa::client
