// The operator log of real daemons (core/log.h lines on stderr, captured to files by the
// launcher as an operator's would be): a coordinator and two workers as processes on loopback,
// a session created and released, a job that fails at the job stage, a forward job moving many
// chunks, a worker SIGKILLed, then both daemons stopped. Every event's line appears exactly
// once, in the glog layout (level letter, UTC timestamp near now, thread id, file:line), at its
// level; the many-chunk job adds no line per chunk; --log_level=warning keeps only W and E
// lines; a bad --log_level is refused naming the flag.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "client/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/fault/daemons.h"

namespace dfa::testing {
namespace {

constexpr int kLeaseMs = 900;

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A line in the glog layout: level letter, MMDD, HH:MM:SS.uuuuuu, thread id, file:line, "] ".
bool IsLogLine(const std::string& line) {
  static const std::regex kLine(
      R"(^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [A-Za-z0-9_.]+:\d+\] .+$)");
  return std::regex_match(line, kLine);
}

// The log lines of a daemon's output; other lines (the ready lines on stdout) are left out.
std::vector<std::string> LogLines(const std::string& path) {
  std::vector<std::string> out;
  for (const std::string& l : Lines(path)) {
    if (IsLogLine(l)) out.push_back(l);
  }
  return out;
}

// The log lines containing every one of `needles`.
std::vector<std::string> Matching(const std::vector<std::string>& lines,
                                  const std::vector<std::string>& needles) {
  std::vector<std::string> out;
  for (const std::string& l : lines) {
    bool all = true;
    for (const std::string& n : needles) all = all && absl::StrContains(l, n);
    if (all) out.push_back(l);
  }
  return out;
}

// The time a line carries (its year taken as this one's), in UTC.
absl::Time LineTime(const std::string& line) {
  const absl::CivilSecond now = absl::ToCivilSecond(absl::Now(), absl::UTCTimeZone());
  int month = 0, day = 0, hour = 0, minute = 0, second = 0, micros = 0;
  if (std::sscanf(line.c_str() + 1, "%2d%2d %2d:%2d:%2d.%6d", &month, &day, &hour, &minute, &second,
                  &micros) != 6) {
    return absl::InfinitePast();
  }
  return absl::FromCivil(absl::CivilSecond(now.year(), month, day, hour, minute, second),
                         absl::UTCTimeZone()) +
         absl::Microseconds(micros);
}

// Exactly one log line holds all of `needles`; it has level `level` and a UTC time within a
// minute of now. Returns it ("" on failure, recorded).
std::string ExpectOnce(const std::vector<std::string>& lines,
                       const std::vector<std::string>& needles, char level,
                       const std::string& log) {
  const std::vector<std::string> hits = Matching(lines, needles);
  std::string what;
  for (const std::string& n : needles)
    absl::StrAppend(&what, what.empty() ? "" : " + ", "'", n, "'");
  EXPECT_EQ(hits.size(), 1u) << what << " in " << log << ":\n"
                             << [&] {
                                  std::string all;
                                  for (const std::string& l : lines) absl::StrAppend(&all, l, "\n");
                                  return all;
                                }();
  if (hits.size() != 1) return "";
  const std::string& line = hits[0];
  EXPECT_EQ(line[0], level) << line;
  const absl::Duration skew = absl::AbsDuration(LineTime(line) - absl::Now());
  EXPECT_LT(skew, absl::Minutes(1)) << "not a UTC time of this run: " << line;
  return line;
}

// Polls `path` until a log line holds all of `needles`; the time that took, or InfiniteDuration.
absl::Duration WaitForLine(const std::string& path, const std::vector<std::string>& needles,
                           absl::Duration timeout) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < timeout) {
    if (!Matching(LogLines(path), needles).empty()) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::InfiniteDuration();
}

TEST(OperatorLogTest, EachEventIsOneTimestampedLineAtItsLevel) {
  auto created = Daemons::Create();
  if (!created.ok()) GTEST_SKIP() << created.status();
  Daemons& d = **created;
  ASSERT_TRUE(d.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs), "--metrics_port=0"}).ok());
  ASSERT_TRUE(d.StartWorker(0).ok());
  ASSERT_TRUE(d.StartWorker(1).ok());
  ASSERT_TRUE(d.WaitForWorkers(2, absl::Seconds(20)).ok());
  const std::string clog = d.coordinator()->log_path();
  std::unique_ptr<client::Client> c = ConnectClient(d);
  ASSERT_NE(c, nullptr);

  // A session created and used, then released.
  std::string released_id;
  {
    auto session = SessionWithForward(c.get(), 2, 7);
    ASSERT_TRUE(session.ok()) << session.status();
    released_id = (*session)->id();
    ASSERT_TRUE((*session)->Release().ok());
  }

  // A job that fails at the job stage: a forward job before any input reached the workers.
  std::string failed_session, failed_job;
  {
    client::SessionOptions so;
    so.spec = SmallSpec();
    so.num_workers = 2;
    auto session = c->CreateSession(so);
    ASSERT_TRUE(session.ok()) << session.status();
    failed_session = (*session)->id();
    auto submitted = (*session)->Submit(v1::JOB_FORWARD);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    failed_job = submitted->job_id();
    auto watched = (*session)->Watch(failed_job, nullptr);
    ASSERT_FALSE(watched.ok()) << "a forward job without inputs succeeded";
    EXPECT_EQ(watched.status().code(), absl::StatusCode::kFailedPrecondition) << watched.status();
    ASSERT_TRUE((*session)->Release().ok());
  }

  // A forward job of many chunks (Q, K, V uploaded in 4 KiB gRPC chunks): no line per chunk.
  const size_t coordinator_before = LogLines(clog).size();
  const size_t worker_before = LogLines(d.worker(0)->log_path()).size();
  int64_t chunks = 0;
  std::string chunked_id;
  {
    client::SessionOptions so;
    so.spec = SmallSpec();
    so.spec.set_seq_len(4096);
    so.num_workers = 2;
    auto session = c->CreateSession(so);
    ASSERT_TRUE(session.ok()) << session.status();
    chunked_id = (*session)->id();
    client::TransferOptions small;
    small.path = client::TransferPath::kGrpc;
    small.chunk_bytes = 4096;
    for (v1::TensorKind kind : {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_V}) {
      auto t = client::MakeTensor(so.spec, kind);
      ASSERT_TRUE(t.ok()) << t.status();
      client::FillRandom(static_cast<uint64_t>(kind), &*t);
      auto up = (*session)->Upload(kind, *t, small);
      ASSERT_TRUE(up.ok()) << up.status();
      chunks += up->chunks;
    }
    auto job = (*session)->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_GT(job->steps_total(), 2);
    ASSERT_TRUE((*session)->Release().ok());
  }
  EXPECT_GE(chunks, 300) << "the upload was meant to move many chunks";
  const std::vector<std::string> during = [&] {
    std::vector<std::string> all = LogLines(clog);
    return std::vector<std::string>(all.begin() + static_cast<long>(coordinator_before), all.end());
  }();
  // Its session's creation and release, perhaps a client-lease line: a handful, not hundreds.
  EXPECT_LE(during.size(), 4u) << chunks << " chunks; coordinator lines:\n"
                               << absl::StrJoin(during, "\n");
  EXPECT_EQ(Matching(during, {"session " + chunked_id}).size(), 2u) << absl::StrJoin(during, "\n");
  EXPECT_LE(LogLines(d.worker(0)->log_path()).size(), worker_before + 1)
      << "worker-0 logged during a job of " << chunks << " chunks";

  // SIGKILL: no goodbye; the lease tells, with the reason, within the lease (and the tick).
  const absl::Time killed = absl::Now();
  d.KillWorker(1);
  const absl::Duration seen = WaitForLine(clog, {"worker worker-1 lost"}, absl::Seconds(10));
  ASSERT_NE(seen, absl::InfiniteDuration()) << "no 'worker lost' line 10 s after SIGKILL";
  std::printf(
      "worker-1 SIGKILLed: the coordinator logged it lost %.2f s later (lease %d ms); "
      "%lld chunks moved with %zu coordinator lines\n",
      absl::ToDoubleSeconds(absl::Now() - killed), kLeaseMs, static_cast<long long>(chunks),
      during.size());
  EXPECT_LT(absl::Now() - killed, absl::Milliseconds(kLeaseMs) + absl::Seconds(2))
      << "the coordinator logged the loss " << seen << " after SIGKILL (lease " << kLeaseMs
      << " ms)";

  // Clean stops: SIGTERM.
  EXPECT_TRUE(d.worker(0)->Stop(absl::Seconds(10)).ok());
  EXPECT_TRUE(d.coordinator()->Stop(absl::Seconds(10)).ok());

  const std::vector<std::string> cl = LogLines(clog);
  const std::string w0log = d.worker(0)->log_path();
  const std::vector<std::string> w0 = LogLines(w0log);
  ExpectOnce(cl,
             {"dfa-coordinator ", " started: gRPC on " + d.coordinator_address(),
              "metrics on port ", "secure mode off"},
             'I', clog);
  for (int i : {0, 1}) {
    ExpectOnce(cl, {absl::StrCat("worker worker-", i, " joined at ", d.worker_address(i))}, 'I',
               clog);
  }
  ExpectOnce(cl, {"session " + released_id + " created", "S=256", "2 workers [worker-"}, 'I', clog);
  ExpectOnce(cl, {"session " + released_id + " released"}, 'I', clog);
  ExpectOnce(cl,
             {"job " + failed_job, "session " + failed_session, "failed", "FAILED_PRECONDITION",
              "TENSOR_Q"},
             'W', clog);
  ExpectOnce(cl, {"worker worker-1 lost: lease expired", absl::StrCat(kLeaseMs, " ms")}, 'W', clog);
  ExpectOnce(cl, {"dfa-coordinator stopping"}, 'I', clog);
  ExpectOnce(cl, {"dfa-coordinator stopped in"}, 'I', clog);
  // worker-0 is lost only after its own stop (no heartbeat after SIGTERM), if the coordinator
  // outlived its lease.
  const std::vector<std::string> w0_lost = Matching(cl, {"worker worker-0 lost"});
  EXPECT_LE(w0_lost.size(), 1u);

  ExpectOnce(w0,
             {"dfa-worker ", "worker-0 started: gRPC on " + d.worker_address(0),
              "coordinator " + d.coordinator_address(), "secure mode off"},
             'I', w0log);
  ExpectOnce(w0, {"worker worker-0 registered with " + d.coordinator_address()}, 'I', w0log);
  const std::string w0_stop = ExpectOnce(w0, {"dfa-worker worker-0 stopping"}, 'I', w0log);
  if (!w0_lost.empty() && !w0_stop.empty()) {
    EXPECT_GE(LineTime(w0_lost[0]), LineTime(w0_stop)) << w0_lost[0];
  }
  ExpectOnce(w0, {"dfa-worker worker-0 stopped in"}, 'I', w0log);
  // Every line of the daemons' stderr is a log line; stdout adds only the ready lines.
  for (const std::string& path : {clog, w0log}) {
    for (const std::string& l : Lines(path)) {
      if (l.rfind("dfa-coordinator listening on ", 0) == 0 ||
          l.rfind("dfa-coordinator metrics on port ", 0) == 0 ||
          l.rfind("dfa-worker worker-0 listening on ", 0) == 0) {
        continue;
      }
      EXPECT_TRUE(IsLogLine(l)) << "a line in " << path << " outside the log format: " << l;
    }
  }
}

TEST(OperatorLogTest, LogLevelFlagKeepsWarningsAndRefusesUnknownLevels) {
  auto created = Daemons::Create();
  if (!created.ok()) GTEST_SKIP() << created.status();
  Daemons& d = **created;
  ASSERT_TRUE(
      d.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs), "--log_level=warning"}).ok());
  ASSERT_TRUE(d.StartWorker(0, {"--log_level=warning"}).ok());
  ASSERT_TRUE(d.WaitForWorkers(1, absl::Seconds(20)).ok());
  d.KillWorker(0);
  const std::string clog = d.coordinator()->log_path();
  ASSERT_NE(WaitForLine(clog, {"worker worker-0 lost: lease expired"}, absl::Seconds(10)),
            absl::InfiniteDuration());
  EXPECT_TRUE(d.coordinator()->Stop(absl::Seconds(10)).ok());
  const std::vector<std::string> cl = LogLines(clog);
  ExpectOnce(cl, {"worker worker-0 lost: lease expired"}, 'W', clog);
  for (const std::string& l : cl)
    EXPECT_NE(l[0], 'I') << "an info line at --log_level=warning: " << l;
  EXPECT_TRUE(Matching(cl, {"joined"}).empty());

  // An unknown level: refused before anything starts, naming the flag and the levels.
  for (const char* binary : {"coordinator", "worker"}) {
    auto path = client::LocalCluster::FindBinary(
        "", binary, std::string(binary) == "worker" ? "dfa-worker" : "dfa-coordinator");
    ASSERT_TRUE(path.ok()) << path.status();
    const std::string log = absl::StrCat(d.log_dir(), "/bad-level-", binary, ".log");
    auto proc = client::ChildProcess::Start(binary, {*path, "--log_level=verbose"}, log);
    ASSERT_TRUE(proc.ok()) << proc.status();
    for (int i = 0; i < 500 && (*proc)->Running(); ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_FALSE((*proc)->Running()) << binary << " runs with --log_level=verbose";
    EXPECT_TRUE(WIFEXITED((*proc)->exit_status()));
    EXPECT_EQ(WEXITSTATUS((*proc)->exit_status()), 2) << (*proc)->LogTail(5);
    const std::string tail = (*proc)->LogTail(5);
    EXPECT_TRUE(absl::StrContains(tail, "--log_level")) << tail;
    EXPECT_TRUE(absl::StrContains(tail, "info, warning or error")) << tail;
  }
}

}  // namespace
}  // namespace dfa::testing
