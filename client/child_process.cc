#include "client/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_join.h"

namespace dfa::client {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(std::string name,
                                                                  std::vector<std::string> argv,
                                                                  std::string log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(name, ": cannot execute ", argv[0], ": ",
                                            std::strerror(errno)));
  }
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(name, ": cannot open log ", log_path, ": ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::UnavailableError(absl::StrCat(name, ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    setpgid(0, 0);  // its own group: a terminal's Ctrl-C reaches only us; we stop it
    execv(args[0], args.data());
    _exit(127);
  }
  close(log_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(std::move(name), pid, std::move(log_path)));
}

ChildProcess::~ChildProcess() {
  if (!exited_) (void)Stop(absl::Seconds(5));
}

bool ChildProcess::Running() {
  if (exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    exit_status_ = status;
    return false;
  }
  return r == 0;
}

void ChildProcess::Signal(int sig) {
  if (!exited_) kill(pid_, sig);
}

absl::Status ChildProcess::Stop(absl::Duration grace) {
  bool killed = false;
  if (Running()) {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + grace;
    while (Running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    if (Running()) {
      kill(pid_, SIGKILL);
      killed = true;
      int status = 0;
      waitpid(pid_, &status, 0);
      exited_ = true;
      exit_status_ = status;
    }
  }
  const int st = exit_status_;
  // Dying of SIGTERM (ours, sent by Stop or Signal) counts as a clean stop.
  const bool clean = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                     (WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
  if (killed) {
    return absl::InternalError(absl::StrCat(name_, " (pid ", pid_, ") ignored SIGTERM for ",
                                            absl::FormatDuration(grace), "; killed. Log tail:\n",
                                            LogTail(10)));
  }
  if (!clean) {
    std::string how = WIFEXITED(st) ? absl::StrCat("exited with status ", WEXITSTATUS(st))
                                    : absl::StrCat("died of signal ", WTERMSIG(st));
    return absl::InternalError(absl::StrCat(name_, " (pid ", pid_, ") ", how, ". Log tail:\n",
                                            LogTail(10)));
  }
  return absl::OkStatus();
}

std::string ChildProcess::LogTail(int lines) const {
  std::ifstream in(log_path_);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

}  // namespace dfa::client
