#include "client/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_join.h"

namespace dfa::client {
namespace {

// The thread every child is forked from. PR_SET_PDEATHSIG fires when the thread that forked
// the child exits, not the process: a child forked from a short-lived thread (the Python
// binding starts clusters from one per call) would be signalled when that thread ends. This
// thread lives as long as the process, so the signal comes exactly when the process dies.
// One per process: a fork()ed copy of this process starts its own on first use.
class Spawner {
 public:
  static Spawner& Get() {
    static const bool registered = [] {
      // In a fork()ed child the spawner thread does not exist and the state may be mid-use:
      // forget it (leaked) and start afresh. The handler runs before the child has any other
      // thread; prepare/parent keep the pointer's mutex consistent across the fork.
      pthread_atfork([] { CreateMu().lock(); }, [] { CreateMu().unlock(); },
                     [] {
                       new (&CreateMu()) std::mutex();
                       instance_ = nullptr;
                     });
      return true;
    }();
    (void)registered;
    std::lock_guard<std::mutex> lock(CreateMu());
    if (instance_ == nullptr) instance_ = new Spawner();  // never destroyed (detached thread)
    return *instance_;
  }

  // Runs `fn` on the spawner thread; returns its result. Calls are serialised.
  pid_t Run(const std::function<pid_t()>& fn) {
    std::lock_guard<std::mutex> one_at_a_time(call_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &fn;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [this] { return done_; });
    return result_;
  }

 private:
  Spawner() { std::thread([this] { Loop(); }).detach(); }

  static std::mutex& CreateMu() {
    alignas(std::mutex) static unsigned char storage[sizeof(std::mutex)];
    static std::mutex* mu = new (storage) std::mutex();
    return *mu;
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return job_ != nullptr; });
      const std::function<pid_t()>* job = job_;
      job_ = nullptr;
      lock.unlock();
      const pid_t r = (*job)();
      lock.lock();
      result_ = r;
      done_ = true;
      cv_.notify_all();
    }
  }

  static inline Spawner* instance_ = nullptr;
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<pid_t()>* job_ = nullptr;
  bool done_ = false;
  pid_t result_ = -1;
};

}  // namespace

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
  int fork_errno = 0;
  const pid_t pid = Spawner::Get().Run([&]() -> pid_t {
    const pid_t parent = getpid();
    const pid_t p = fork();
    if (p < 0) fork_errno = errno;
    if (p != 0) return p;
    // Child: only async-signal-safe calls until exec.
    // SIGTERM when this process dies, however it dies (SIGKILL included): a daemon never
    // outlives the program that started it. A parent that died before this line: exit now.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    // exec resets handled signals, not ignored ones (Python ignores SIGPIPE): the default.
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    setpgid(0, 0);  // its own group: a terminal's Ctrl-C reaches only us; we stop it
    execv(args[0], args.data());
    _exit(127);
  });
  close(log_fd);
  if (pid < 0) {
    return absl::UnavailableError(absl::StrCat(name, ": fork: ", std::strerror(fork_errno)));
  }
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
