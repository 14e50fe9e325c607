// ClientLeases (coordinator/client_lease.h) on a fake clock: a lease's secret is required to
// re-attach or to record a session, a re-attach within the grace keeps the sessions, a lost
// lease hands its sessions back after the grace (or after a beat timeout plus the grace), a
// clean close hands back nothing, and the limits answer RESOURCE_EXHAUSTED naming their flag.
#include "coordinator/client_lease.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dfa {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000000);
constexpr absl::Duration kTick = absl::Milliseconds(100);

// Calls Expire every 100 ms (the coordinator's tick) from its last call up to `t`, and returns
// everything it handed back: a longer gap would be a stall of the coordinator.
class Ticker {
 public:
  explicit Ticker(ClientLeases* leases) : leases_(leases) {}
  std::vector<ClientLeases::Expired> Until(absl::Time t) {
    std::vector<ClientLeases::Expired> out;
    while (now_ < t) {
      now_ = std::min(now_ + kTick, t);
      for (auto& e : leases_->Expire(now_)) out.push_back(std::move(e));
    }
    return out;
  }
  // Jumps to `t` with one call (the coordinator did not run in between).
  std::vector<ClientLeases::Expired> JumpTo(absl::Time t) {
    now_ = t;
    return leases_->Expire(t);
  }

 private:
  ClientLeases* const leases_;
  absl::Time now_ = kT0;
};

ClientLeaseOptions Options() {
  ClientLeaseOptions o;
  o.beat_interval = absl::Seconds(1);
  o.timeout = absl::Seconds(3);
  o.grace = absl::Seconds(5);
  o.max_leases = 3;
  o.max_sessions_per_lease = 2;
  return o;
}

TEST(ClientLeaseTest, NewLeaseHasAnUnguessableIdAndSecret) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "client-a", kT0);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = leases.Attach("", "", "client-b", kT0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(absl::StartsWith(a->lease_id, "l-"));
  EXPECT_EQ(a->lease_id.size(), 34u);  // "l-" + 128 bits in hex
  EXPECT_EQ(a->secret.size(), 43u);    // 256 bits in base64url
  EXPECT_NE(a->lease_id, b->lease_id);
  EXPECT_NE(a->secret, b->secret);
  EXPECT_NE(a->stream, b->stream);
  EXPECT_EQ(leases.count(), 2);
}

TEST(ClientLeaseTest, WrongOrMissingSecretIsRefused) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "victim", kT0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-1").ok());
  std::string wrong = a->secret;
  wrong[0] = wrong[0] == 'A' ? 'B' : 'A';

  for (const std::string& secret : {wrong, std::string()}) {
    absl::Status s = leases.CheckCanAdd(a->lease_id, secret);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "lease_secret")) << s;
    EXPECT_FALSE(absl::StrContains(s.message(), a->secret)) << "the secret is never echoed";
    s = leases.AddSession(a->lease_id, secret, "s-2");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  // A re-attach with a wrong secret neither takes the lease over nor ends it.
  auto stolen = leases.Attach(a->lease_id, wrong, "thief", kT0);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  auto beat = leases.Beat(a->lease_id, a->stream, kT0 + absl::Seconds(1));
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(*beat, 1);
  EXPECT_EQ(leases.sessions(a->lease_id), 1);

  // Unknown lease: NOT_FOUND naming lease_id.
  absl::Status s = leases.CheckCanAdd("l-00000000000000000000000000000000", a->secret);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "lease_id")) << s;
  EXPECT_EQ(leases.Attach("", a->secret, "x", kT0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClientLeaseTest, ReattachWithinGraceKeepsTheSessions) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "c", kT0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-1").ok());
  leases.Detach(a->lease_id, a->stream, /*clean=*/false, kT0 + absl::Seconds(1));
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(5)).empty());  // within the grace
  auto again = leases.Attach(a->lease_id, a->secret, "c", kT0 + absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->secret.empty()) << "a re-attach is not told the secret again";
  EXPECT_EQ(again->sessions, 1);
  // Beats on the new stream keep it; the old stream is superseded and its end changes nothing.
  for (int t = 6; t <= 20; ++t) {
    ASSERT_TRUE(leases.Beat(a->lease_id, again->stream, kT0 + absl::Seconds(t)).ok());
    EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(t)).empty()) << t;
  }
  EXPECT_EQ(leases.Beat(a->lease_id, a->stream, kT0 + absl::Seconds(20)).status().code(),
            absl::StatusCode::kAborted);
  leases.Detach(a->lease_id, a->stream, /*clean=*/false, kT0 + absl::Seconds(20));
  // Without beats on the new stream the lease is lost after timeout + grace (23 s + 5 s).
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(27)).empty());
  std::vector<ClientLeases::Expired> gone = tick.Until(kT0 + absl::Seconds(28));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].session_ids, std::vector<std::string>{"s-1"});
}

TEST(ClientLeaseTest, LostLeaseHandsBackItsSessionsAfterTheGrace) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "crashed", kT0);
  auto b = leases.Attach("", "", "alive", kT0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-a1").ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-a2").ok());
  ASSERT_TRUE(leases.AddSession(b->lease_id, b->secret, "s-b").ok());
  leases.ForgetSession(a->lease_id, "s-a2");  // released by its client meanwhile
  leases.Detach(a->lease_id, a->stream, /*clean=*/false, kT0 + absl::Seconds(2));
  ASSERT_TRUE(leases.Beat(b->lease_id, b->stream, kT0 + absl::Seconds(6)).ok());
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(6)).empty());
  std::vector<ClientLeases::Expired> gone = tick.Until(kT0 + absl::Seconds(7));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].lease_id, a->lease_id);
  EXPECT_EQ(gone[0].client_id, "crashed");
  EXPECT_EQ(gone[0].session_ids, std::vector<std::string>{"s-a1"});
  EXPECT_TRUE(absl::StrContains(gone[0].why, "stream ended")) << gone[0].why;
  EXPECT_EQ(leases.count(), 1);
  // Gone for good: a late re-attach is NOT_FOUND (the client opens a new lease).
  EXPECT_EQ(
      leases.Attach(a->lease_id, a->secret, "crashed", kT0 + absl::Seconds(8)).status().code(),
      absl::StatusCode::kNotFound);
}

TEST(ClientLeaseTest, NoBeatForTheTimeoutLosesTheLease) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "silent", kT0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-1").ok());
  // Lost at kT0 + 3 s (timeout), released at kT0 + 8 s (grace 5 s).
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(4)).empty());
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(7)).empty());
  std::vector<ClientLeases::Expired> gone = tick.Until(kT0 + absl::Seconds(8));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_TRUE(absl::StrContains(gone[0].why, "no beat")) << gone[0].why;
}

TEST(ClientLeaseTest, LateBeatWithinTheGraceRevivesTheLease) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "slow", kT0);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(4)).empty());  // lost, within its grace
  ASSERT_TRUE(leases.Beat(a->lease_id, a->stream, kT0 + absl::Seconds(6)).ok());
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(9)).empty());
  EXPECT_EQ(leases.count(), 1);
}

TEST(ClientLeaseTest, AStallOfTheCoordinatorRestartsTheLeasesClocks) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto beating = leases.Attach("", "", "beating", kT0);
  auto cut = leases.Attach("", "", "cut", kT0);
  ASSERT_TRUE(beating.ok() && cut.ok());
  ASSERT_TRUE(leases.AddSession(beating->lease_id, beating->secret, "s-b").ok());
  ASSERT_TRUE(leases.AddSession(cut->lease_id, cut->secret, "s-c").ok());
  leases.Detach(cut->lease_id, cut->stream, /*clean=*/false, kT0 + absl::Seconds(1));
  EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(2)).empty());
  // The coordinator is stopped for 30 s (SIGSTOP): past every timeout and grace.
  EXPECT_TRUE(tick.JumpTo(kT0 + absl::Seconds(32)).empty());
  EXPECT_EQ(leases.stalls(), 1);
  // The beating client's beats resume; the cut one's grace runs again from the stall.
  for (int t = 33; t <= 36; ++t) {
    ASSERT_TRUE(leases.Beat(beating->lease_id, beating->stream, kT0 + absl::Seconds(t)).ok());
    EXPECT_TRUE(tick.Until(kT0 + absl::Seconds(t)).empty()) << t;
  }
  std::vector<ClientLeases::Expired> gone = tick.Until(kT0 + absl::Seconds(37));  // 32 s + 5 s
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].lease_id, cut->lease_id);
  EXPECT_EQ(leases.count(), 1);
}

TEST(ClientLeaseTest, CleanCloseEndsTheLeaseAndHandsBackNothing) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  auto a = leases.Attach("", "", "done", kT0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(leases.AddSession(a->lease_id, a->secret, "s-kept").ok());
  leases.Detach(a->lease_id, a->stream, /*clean=*/true, kT0 + absl::Seconds(1));
  EXPECT_EQ(leases.count(), 0);
  EXPECT_TRUE(tick.Until(kT0 + absl::Hours(1)).empty())
      << "the sessions of a clean close keep their time-to-live";
}

TEST(ClientLeaseTest, LimitsAnswerResourceExhaustedNamingTheFlag) {
  ClientLeases leases(Options(), kTick);
  Ticker tick(&leases);
  std::vector<ClientLeases::Attachment> held;
  for (int i = 0; i < 3; ++i) {
    auto a = leases.Attach("", "", "c", kT0);
    ASSERT_TRUE(a.ok()) << a.status();
    held.push_back(*a);
  }
  auto over = leases.Attach("", "", "c", kT0);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "--max_client_leases")) << over.status();
  const ClientLeases::Attachment& a = held[0];
  ASSERT_TRUE(leases.AddSession(a.lease_id, a.secret, "s-1").ok());
  ASSERT_TRUE(leases.AddSession(a.lease_id, a.secret, "s-2").ok());
  absl::Status s = leases.CheckCanAdd(a.lease_id, a.secret);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_sessions_per_lease")) << s;
  EXPECT_EQ(leases.AddSession(a.lease_id, a.secret, "s-3").code(),
            absl::StatusCode::kResourceExhausted);
  leases.ForgetSession(a.lease_id, "s-1");
  EXPECT_TRUE(leases.CheckCanAdd(a.lease_id, a.secret).ok());
}

TEST(ClientLeaseTest, OptionsAreValidatedNamingTheFlag) {
  ClientLeaseOptions o = Options();
  EXPECT_TRUE(ValidateClientLeaseOptions(o).ok());
  o.timeout = o.beat_interval;
  absl::Status s = ValidateClientLeaseOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--client_lease_timeout_ms")) << s;
  o = Options();
  o.grace = absl::Seconds(-1);
  EXPECT_TRUE(
      absl::StrContains(ValidateClientLeaseOptions(o).message(), "--client_lease_grace_ms"));
  o = Options();
  o.max_sessions_per_lease = 0;
  EXPECT_TRUE(
      absl::StrContains(ValidateClientLeaseOptions(o).message(), "--max_sessions_per_lease"));
}

}  // namespace
}  // namespace dfa
