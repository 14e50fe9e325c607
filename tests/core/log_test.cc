// The operator log (core/log.h): the line format, level parsing and filtering, and that lines
// written from many threads at once arrive whole (one write(2) each).
#include "core/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/civil_time.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

// The glog/abseil layout: level letter, MMDD, HH:MM:SS.uuuuuu, thread id, file:line, "] ".
const std::regex kLinePattern(
    R"(^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [A-Za-z0-9_.]+:\d+\] .*$)");

// A temporary file that the log writes to for the length of a test.
class LogToFile {
 public:
  LogToFile() {
    std::string templ = absl::StrCat(::testing::TempDir(), "/log_test_XXXXXX");
    fd_ = mkstemp(templ.data());
    path_ = templ;
    // O_APPEND, like the log files the launchers give the daemons.
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_APPEND);
    SetLogSinkFd(fd_);
  }
  ~LogToFile() {
    SetLogSinkFd(2);
    SetMinLogLevel(LogLevel::kInfo);
    close(fd_);
    unlink(path_.c_str());
  }
  std::vector<std::string> Lines() const {
    std::ifstream in(path_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

TEST(LogTest, FormatsLikeGlogInUtc) {
  const absl::Time t =
      absl::FromCivil(absl::CivilSecond(2026, 12, 2, 0, 32, 28), absl::UTCTimeZone()) +
      absl::Microseconds(123456);
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, t, 4711, "/src/coordinator/job_manager.cc", 123,
                          "job j-1 failed"),
            "I1202 00:32:28.123456 4711 job_manager.cc:123] job j-1 failed\n");
  EXPECT_EQ(FormatLogLine(LogLevel::kWarning, t, 1, "registrar.cc", 7, "x"),
            "W1202 00:32:28.123456 1 registrar.cc:7] x\n");
  EXPECT_EQ(FormatLogLine(LogLevel::kError, t, 1, "a.cc", 1, "x").substr(0, 1), "E");
  // Microseconds are zero-padded; the hour is UTC whatever the local zone is.
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, absl::FromUnixSeconds(0) + absl::Microseconds(5), 9,
                          "b.cc", 2, "epoch"),
            "I0101 00:00:00.000005 9 b.cc:2] epoch\n");
}

TEST(LogTest, OneEventStaysOneLine) {
  const std::string line =
      FormatLogLine(LogLevel::kInfo, absl::UnixEpoch(), 1, "c.cc", 3, "first\nsecond\r\nthird\n");
  EXPECT_EQ(line, "I0101 00:00:00.000000 1 c.cc:3] first | second | third\n");
}

TEST(LogTest, ParsesLevelsAndNamesTheFlag) {
  EXPECT_EQ(*ParseLogLevel("info", "--log_level"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("WARNING", "--log_level"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("warn", "--log_level"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error", "--log_level"), LogLevel::kError);
  const absl::Status bad = ParseLogLevel("verbose", "--log_level").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--log_level"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("'verbose'"), std::string::npos) << bad;
  EXPECT_NE(bad.message().find("info, warning or error"), std::string::npos) << bad;
  EXPECT_FALSE(ParseLogLevel("", "--log_level").ok());
}

int side_effects = 0;
std::string Expensive() {
  ++side_effects;
  return "expensive";
}

TEST(LogTest, MinimumLevelDropsLinesWithoutFormattingThem) {
  LogToFile sink;
  SetMinLogLevel(LogLevel::kWarning);
  side_effects = 0;
  DFA_LOG(INFO) << "dropped " << Expensive();
  EXPECT_EQ(side_effects, 0);
  DFA_LOG(WARNING) << "kept " << Expensive();
  DFA_LOG(ERROR) << "kept too";
  DFA_LOG_AT(LogLevel::kInfo) << "dropped as well";
  DFA_LOG_AT(LogLevel::kError) << "kept at run time";
  EXPECT_EQ(side_effects, 1);
  SetMinLogLevel(LogLevel::kError);
  DFA_LOG(WARNING) << "dropped at error";
  const std::vector<std::string> lines = sink.Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].substr(0, 1), "W");
  EXPECT_NE(lines[0].find("log_test.cc:"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("] kept expensive"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].substr(0, 1), "E");
  EXPECT_NE(lines[2].find("] kept at run time"), std::string::npos) << lines[2];
  for (const std::string& l : lines) EXPECT_TRUE(std::regex_match(l, kLinePattern)) << l;
}

TEST(LogTest, LinesFromManyThreadsDoNotInterleave) {
  LogToFile sink;
  constexpr int kThreads = 8, kLines = 400;
  // Long enough that a line written in pieces would be caught split by another thread's.
  const std::string payload(300, 'x');
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &payload] {
      for (int i = 0; i < kLines; ++i) {
        DFA_LOG(INFO) << "thread " << t << " line " << i << " " << payload;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<std::string> lines = sink.Lines();
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kLines));
  std::vector<int> next(kThreads, 0);
  std::set<std::string> thread_ids;
  for (const std::string& l : lines) {
    ASSERT_TRUE(std::regex_match(l, kLinePattern)) << l;
    const size_t body = l.find("] thread ");
    ASSERT_NE(body, std::string::npos) << l;
    int t = -1, i = -1;
    char rest[8] = {0};
    ASSERT_EQ(std::sscanf(l.c_str() + body, "] thread %d line %d %7s", &t, &i, rest), 3) << l;
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kThreads);
    EXPECT_EQ(i, next[t]++) << "lines of one thread out of order: " << l;
    EXPECT_EQ(l.substr(l.size() - payload.size()), payload) << l;
    std::vector<std::string> fields = absl::StrSplit(l, ' ');
    thread_ids.insert(fields[2]);
  }
  // The thread id field tells the writers apart.
  EXPECT_EQ(thread_ids.size(), static_cast<size_t>(kThreads));
}

}  // namespace
}  // namespace dfa
