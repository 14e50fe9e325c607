// Progress of uploads and jobs for the `dfa` command: a redrawn bar when stdout is a terminal,
// plain lines (start and end only) otherwise, so logs stay readable.
// Thread-safe: Add() may be called from the transfer threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/time/time.h"

namespace dfa::cli {

class Progress {
 public:
  // `total` units (bytes or steps); `unit` "B" formats as MiB.
  Progress(std::string label, int64_t total, std::string unit);
  ~Progress();
  void Add(int64_t n);
  void Set(int64_t done);
  void SetTotal(int64_t total) { total_.store(total); }
  // Ends the bar (a newline on terminals) and prints the final line with the rate.
  void Finish();
  static bool IsTerminal();

 private:
  void Draw(bool final_line);
  std::string label_, unit_;
  std::atomic<int64_t> total_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  absl::Time start_, last_draw_;
  bool tty_, finished_ = false;
};

}  // namespace dfa::cli
