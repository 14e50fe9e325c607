// What `dfa bench` measured, kept as data so that the command can print it as text while it
// runs and as one JSON document at the end (`--json`, keys in docs/client.md). The figures are
// the text output's: every number a text line shows is a field here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dfa/v1/coordinator.pb.h"

namespace dfa::cli {

// One data-plane line: best rate of the repeats and the mean CPU seconds per GB.
struct BenchRate {
  double best_gbps = 0;
  double client_cpu_per_gb = 0;
  double worker_cpu_per_gb = 0;  // 0 when the workers' pids are unknown (--coordinator)
  int64_t bytes = 0;             // one run's bytes
  int64_t pieces = 0;            // gRPC chunks or shared-memory segments of one run
};

struct BenchTransferLine {
  std::string label;         // the text output's, e.g. "upload   gRPC, 1 stream"
  std::string direction;     // "upload" or "download"
  std::string path;          // "grpc" or "shm"
  bool all_workers = false;  // every worker's shard in parallel (else rank 0's alone)
  BenchRate rate;
};

struct BenchTransfers {
  int64_t tensor_mib = 0;    // --transfer-mib
  int64_t tensor_bytes = 0;  // what one tensor of the runs holds (at least 16 MiB)
  int repeats = 0;
  std::string schedule;  // the session's plan
  bool workers_measured = false;
  double memcpy_gbps = 0;  // one thread, best before and after the transfers
  std::vector<BenchTransferLine> lines;
  bool round_trip_exact = false;
};

// The single-process CPU kernel on the same problem.
struct BenchSingle {
  int threads = 0;
  double forward_seconds = 0;
  double forward_flops_per_second = 0;
  double backward_seconds = 0;  // 0 without backward
  double backward_flops_per_second = 0;
};

struct BenchAttention {
  v1::AttentionSpec spec;
  std::string description;  // the text output's summary of the spec ("B=1 S=16384 ...")
  int workers = 0;
  std::string schedule;
  int repeat = 0;
  bool backward = false;
  std::vector<v1::Job> jobs;  // in the order run: forward[, backward] per repeat
  double best_forward_flops_per_second = 0;
  double best_backward_flops_per_second = 0;
  std::optional<BenchSingle> single;  // absent with --skip-single
};

struct BenchReport {
  std::string coordinator;
  bool local_cluster = false;  // started by the bench (no --coordinator)
  int local_workers = 0;
  std::string local_backend;
  int local_threads = 0;
  std::optional<BenchTransfers> transfers;  // absent with --skip-transfer
  std::optional<BenchAttention> attention;  // absent with --skip-attention
};

// The control plane's share of a job: its wall time less the longest worker's busy + idle
// (what the text report calls "outside the workers"); 0 without worker figures.
double SecondsOutsideWorkers(const v1::Job& job);

// The whole report as one JSON object (sections skipped are null).
std::string BenchReportJson(const BenchReport& report);

}  // namespace dfa::cli
