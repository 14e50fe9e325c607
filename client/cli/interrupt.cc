#include "client/cli/interrupt.h"

#include <signal.h>
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

void OnSignal(int sig) {
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
  std::fprintf(stderr, "\n%s: interrupted (%s)%s\n", s.command.c_str(),
               sig == SIGINT ? "Ctrl-C" : "SIGTERM",
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
    if (read(g_pipe[0], &c, 1) != 1) continue;
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
  s.installed = true;
  std::thread(Watch).detach();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
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
