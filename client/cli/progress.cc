#include "client/cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace dfa::cli {

bool Progress::IsTerminal() { return isatty(STDOUT_FILENO) == 1; }

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(absl::Now()),
      last_draw_(absl::InfinitePast()), tty_(IsTerminal()) {}

Progress::~Progress() { Finish(); }

void Progress::Add(int64_t n) {
  done_.fetch_add(n);
  Draw(false);
}

void Progress::Set(int64_t done) {
  done_.store(done);
  Draw(false);
}

void Progress::Finish() {
  Draw(true);
}

void Progress::Draw(bool final_line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  const absl::Time now = absl::Now();
  if (!final_line && (!tty_ || now - last_draw_ < absl::Milliseconds(100))) return;
  last_draw_ = now;
  const int64_t done = done_.load();
  const int64_t total = total_.load();
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(now - start_));
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
  std::string amount;
  if (unit_ == "B") {
    amount = absl::StrFormat("%.1f/%.1f MiB  %.2f GB/s", done / 1048576.0, total / 1048576.0,
                             done / secs / 1e9);
  } else {
    amount = absl::StrFormat("%d/%d %s", done, total, unit_);
  }
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::printf("\r  %-18s [%s] %3.0f%%  %s  %.2fs%s", label_.c_str(), bar.c_str(), frac * 100,
                amount.c_str(), secs, final_line ? "\n" : "");
  } else if (final_line) {
    std::printf("  %-18s done  %s  %.2fs\n", label_.c_str(), amount.c_str(), secs);
  }
  std::fflush(stdout);
  if (final_line) finished_ = true;
}

}  // namespace dfa::cli
