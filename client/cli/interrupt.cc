#include "client/cli/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "absl/time/clock.h"

namespace dfa::cli {
namespace {

std::atomic<int> g_signal{0};  // the last signal (0: none yet)
std::atomic<bool> g_exit_mode{false};
std::atomic<int> g_exit_mode_signals{0};  // signals that arrived in mode kCleanUpAndExit
int g_pipe[2] = {-1, -1};
constexpr absl::Duration kOutputCheck = absl::Milliseconds(200);

struct State {
  std::mutex mu;  // guards everything below; held while clean-ups run
  std::condition_variable cv;
  std::string command = "dfa";
  bool installed = false;
  int next_handle = 1;
  std::map<int, std::pair<std::string, std::function<void()>>> cleanups;
};

State& state() {
  static State* s = new State();  // never destroyed: the watcher may use it during exit
  return *s;
}

// True when stdout or stderr is a pipe (or socket) whose reader has gone: `dfa demo | head -1`
// after head exited. A terminal that hung up is SIGHUP's business, not this.
bool OutputBroken() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) continue;
    pollfd p{fd, 0, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0) return true;
  }
  return false;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "Ctrl-C";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE: the output's reader has gone";
    default:
      return "signal";
  }
}

void OnSignal(int sig) {
  if (sig == SIGPIPE) {
    // A write to a pipe or socket without a reader. The watcher decides whether it was this
    // program's output (then it is an interrupt) or a connection (the write's EPIPE is enough).
    const char c = static_cast<char>(sig);
    ssize_t n = write(g_pipe[1], &c, 1);
    (void)n;
    return;
  }
  g_signal.store(sig);
  // A second signal while cleaning up: exit now.
  if (g_exit_mode.load() && g_exit_mode_signals.fetch_add(1) > 0) _exit(128 + sig);
  const char c = static_cast<char>(sig);
  ssize_t n = write(g_pipe[1], &c, 1);
  (void)n;
}

// Runs the clean-ups (latest first) and exits 128 + the signal. Callers hold no lock.
[[noreturn]] void CleanUpAndExit() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);  // a second caller waits here until the exit
  const int sig = g_signal.load();
  std::fflush(stdout);
  std::fprintf(stderr, "\n%s: interrupted (%s)%s\n", s.command.c_str(), SignalName(sig),
               s.cleanups.empty() ? "" : "; cleaning up (Ctrl-C again to exit now)");
  for (auto it = s.cleanups.rbegin(); it != s.cleanups.rend(); ++it) {
    std::fprintf(stderr, "%s: %s\n", s.command.c_str(), it->second.first.c_str());
    it->second.second();
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(128 + sig);
}

void Watch() {
  while (true) {
    char c = 0;
    // A signal, or every kOutputCheck a look at stdout/stderr: a reader that went away while
    // nothing was written (a long job, a cluster kept up) counts as a SIGPIPE.
    pollfd p{g_pipe[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kOutputCheck))) == 1) {
      if (read(g_pipe[0], &c, 1) != 1) continue;
    } else if (!Interrupts::Requested() && OutputBroken()) {
      c = SIGPIPE;
    } else {
      continue;
    }
    if (c == SIGPIPE) {
      // Only a broken stdout/stderr interrupts (once: later writes raise it again).
      if (!OutputBroken()) continue;
      int none = 0;
      if (!g_signal.compare_exchange_strong(none, SIGPIPE)) continue;
      if (g_exit_mode.load()) g_exit_mode_signals.fetch_add(1);  // a Ctrl-C now exits at once
    }
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mu);
      s.cv.notify_all();
    }
    if (g_exit_mode.load()) CleanUpAndExit();
  }
}

}  // namespace

void Interrupts::Install(const std::string& command, Mode mode) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.command = command;
  g_exit_mode.store(mode == Mode::kCleanUpAndExit);
  if (s.installed) return;
  if (pipe(g_pipe) != 0) return;  // no handler then: the default action (the process dies)
  // The handler never blocks: signals beyond a full pipe are dropped (one byte is enough).
  fcntl(g_pipe[1], F_SETFL, fcntl(g_pipe[1], F_GETFL) | O_NONBLOCK);
  s.installed = true;
  std::thread(Watch).detach();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &sa, nullptr);
}

bool Interrupts::Installed() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.installed;
}

bool Interrupts::Requested() { return g_signal.load() != 0; }
int Interrupts::Signal() { return g_signal.load(); }

bool Interrupts::WaitFor(absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  // Short sleeps: the watcher notifies under the lock, but a signal may land between the check
  // and the wait.
  while (!Requested()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    State& s = state();
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait_for(lock, absl::ToChronoMilliseconds(std::min(left, absl::Milliseconds(100))));
  }
  return true;
}

void Interrupts::BlockIfExiting() {
  if (!Requested() || !g_exit_mode.load() || !Installed()) return;
  while (true) absl::SleepFor(absl::Seconds(1));  // the watcher calls _exit
}

void Interrupts::CleanUpAndExitIfRequested() {
  if (!Requested() || !Installed()) return;
  g_exit_mode.store(true);
  g_exit_mode_signals.fetch_add(1);  // a Ctrl-C from now on exits at once
  CleanUpAndExit();
}

int Interrupts::AddCleanup(const std::string& what, std::function<void()> fn) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const int h = s.next_handle++;
  s.cleanups[h] = {what, std::move(fn)};
  return h;
}

void Interrupts::RemoveCleanup(int handle) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.cleanups.erase(handle);
}

}  // namespace dfa::cli
