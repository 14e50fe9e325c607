// The daemons' operator log: one timestamped, levelled line per event an operator needs (a
// worker joined or was lost, a session created or released, a job failed, start and stop),
// never one per chunk or plan step. Debian bookworm's abseil (20220623) has no absl/log, so this
// is the project's one logging facility. Lines look like glog's and abseil's:
//
//   I1202 00:32:28.123456 41822 worker_registry.cc:97] worker worker-0 joined at 127.0.0.1:7071
//   ^level letter (I, W, E)   ^UTC month/day time   ^kernel thread id   ^source file:line
//
// Use: DFA_LOG(INFO) << "worker " << id << " joined";  (also WARNING, ERROR). A line below the
// minimum level is skipped before its message is formatted. Each line (prefix, message and
// newline) goes out in one write(2) to the sink (stderr unless SetLogSinkFd), so lines of
// different threads never interleave; a message's own newlines are written as " | " so that
// every event stays one line.
//
// Configuration comes from the daemon's flags at startup (--log_level=info|warning|error,
// ParseLogLevel + SetMinLogLevel); nothing here reads the environment.
// Thread safety: every function may be called from any thread at any time.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/status.h"

namespace dfa {

enum class LogLevel : int { kInfo = 0, kWarning = 1, kError = 2 };

// "info", "warning" or "error" (also "INFO", "warn"): the level. INVALID_ARGUMENT naming `flag`
// and the accepted values otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text, absl::string_view flag);
// 'I', 'W' or 'E'.
char LogLevelLetter(LogLevel level);

// Lines below `level` are dropped (default: kInfo, everything).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
bool LogEnabled(LogLevel level);

// Where lines go: a file descriptor the caller keeps open (default 2, stderr). For tests.
void SetLogSinkFd(int fd);

// The line for `message` without writing it, newline included:
// "<L><MMDD> <HH:MM:SS.uuuuuu> <thread_id> <base name of file>:<line>] <message>\n" (UTC).
std::string FormatLogLine(LogLevel level, absl::Time time, int64_t thread_id,
                          absl::string_view file, int line, absl::string_view message);

// Formats `message` as of now on this thread and writes it in one write(2), when `level` is
// enabled.
void WriteLogLine(LogLevel level, const char* file, int line, absl::string_view message);

// One line being built; written when destroyed. Made by DFA_LOG.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line)
      : level_(level), file_(file), line_(line) {}
  ~LogMessage() { WriteLogLine(level_, file_, line_, stream_.str()); }
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const LogLevel level_;
  const char* const file_;
  const int line_;
  std::ostringstream stream_;
};

namespace log_internal {
// Lets DFA_LOG be an expression whose stream part is skipped when the level is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};
inline constexpr LogLevel INFO = LogLevel::kInfo;
inline constexpr LogLevel WARNING = LogLevel::kWarning;
inline constexpr LogLevel ERROR = LogLevel::kError;
}  // namespace log_internal

}  // namespace dfa

// DFA_LOG(INFO|WARNING|ERROR) << ...;  one line, written at the end of the statement.
#define DFA_LOG(level)                           \
  !::dfa::LogEnabled(::dfa::log_internal::level) \
      ? (void)0                                  \
      : ::dfa::log_internal::Voidify() &         \
            ::dfa::LogMessage(::dfa::log_internal::level, __FILE__, __LINE__).stream()

// The same with a level chosen at run time (evaluated twice: keep it free of side effects):
//   DFA_LOG_AT(failed ? LogLevel::kWarning : LogLevel::kInfo) << ...;
#define DFA_LOG_AT(level_value)          \
  !::dfa::LogEnabled(level_value)        \
      ? (void)0                          \
      : ::dfa::log_internal::Voidify() & \
            ::dfa::LogMessage((level_value), __FILE__, __LINE__).stream()
