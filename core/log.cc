#include "core/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> sink_fd{2};

int64_t ThreadId() {
  thread_local const int64_t id = static_cast<int64_t>(syscall(SYS_gettid));
  return id;
}

absl::string_view BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text, absl::string_view flag) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "info") return LogLevel::kInfo;
  if (t == "warning" || t == "warn") return LogLevel::kWarning;
  if (t == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": '", text, "' is not a level (info, warning or error)"));
}

char LogLevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

void SetMinLogLevel(LogLevel level) {
  min_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel MinLogLevel() { return static_cast<LogLevel>(min_level.load(std::memory_order_relaxed)); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= min_level.load(std::memory_order_relaxed);
}

void SetLogSinkFd(int fd) { sink_fd.store(fd, std::memory_order_relaxed); }

std::string FormatLogLine(LogLevel level, absl::Time time, int64_t thread_id,
                          absl::string_view file, int line, absl::string_view message) {
  std::string out(1, LogLevelLetter(level));
  absl::StrAppend(&out, absl::FormatTime("%m%d %H:%M:%E6S", time, absl::UTCTimeZone()), " ",
                  thread_id, " ", BaseName(file), ":", line, "] ");
  out.reserve(out.size() + message.size() + 1);
  // One event, one line: a message's own line breaks become " | ".
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) {
    message.remove_suffix(1);
  }
  for (char c : message) {
    if (c == '\n') {
      out += " | ";
    } else if (c != '\r') {
      out.push_back(c);
    }
  }
  out.push_back('\n');
  return out;
}

void WriteLogLine(LogLevel level, const char* file, int line, absl::string_view message) {
  if (!LogEnabled(level)) return;
  const std::string text = FormatLogLine(level, absl::Now(), ThreadId(), file, line, message);
  const int fd = sink_fd.load(std::memory_order_relaxed);
  // One write(2) per line: atomic on pipes up to PIPE_BUF and on O_APPEND files, so lines of
  // concurrent threads (and processes sharing the file) do not interleave. A short write (a
  // full disk, a signal) sends the rest rather than losing it.
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report a broken log sink
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace dfa
