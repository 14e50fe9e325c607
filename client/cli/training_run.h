// One forward+backward job on random data through the client library, as `dfa demo` and
// `dfa submit` run it: random Q, K, V, dO (seeded), upload straight to the workers, forward,
// backward (only dO sent), download, optional verification against single-device attention,
// and a report of throughput and each worker's idle fraction on stdout.
#pragma once

#include "client/cli/job_flags.h"
#include "client/client.h"

namespace dfa::cli {

struct TrainingRunOptions {
  JobFlags job;
  bool backward = true;
  bool verify = true;
  int reference_threads = 0;  // 0: the usable CPUs (core/host_limits.h)
  client::TransferPath path = client::TransferPath::kAuto;
  int max_retries = 1;
};

// OK when every job succeeded and (if asked) every tensor matched the reference.
absl::Status RunTrainingJob(client::Client* client, const TrainingRunOptions& options);

// Prints one job's figures: wall time, FLOP/s, and per worker busy/idle and idle fraction.
void PrintJobReport(const char* label, const v1::Job& job);

}  // namespace dfa::cli
