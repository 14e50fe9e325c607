// ClientGroups (worker/client_groups.h) without a GPU: the group checks a transfer passes
// before NCCL — unknown or expired groups NOT_FOUND, another client's group or a wrong secret
// PERMISSION_DENIED, duplicate ids ALREADY_EXISTS, the cap RESOURCE_EXHAUSTED — on groups
// recorded without a communicator (Register), and the join request's own checks.
#include "worker/client_groups.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "absl/time/clock.h"

namespace dfa {
namespace {

v1::WorkerJoinClientGroupRequest Join(const std::string& id, const std::string& client = "c1") {
  v1::WorkerJoinClientGroupRequest r;
  r.set_group_id(id);
  r.set_session_id("s-1");
  r.set_client_id(client);
  r.set_rank(0);
  r.set_size(2);
  r.set_nccl_unique_id(std::string(128, 'u'));
  r.set_init_timeout_ms(500);
  r.set_group_secret("secret-" + id);
  r.set_expires_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Minutes(1)));
  return r;
}

TEST(ClientGroupsTest, OwnerAndSecretAreChecked) {
  ClientGroups groups;
  ASSERT_TRUE(groups.Register(Join("g-a")).ok());
  auto next = groups.NextSequence("g-a", "c1", "secret-g-a");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 0);
  auto st = groups.NextSequence("g-a", "c2", "secret-g-a").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("belongs to another client than 'c2'"), std::string::npos) << st;
  st = groups.NextSequence("g-a", "c1", "secret-g-b").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("x-dfa-client-group-secret"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("secret-g-a"), std::string::npos) << "never echo the secret";
  st = groups.NextSequence("g-a", "c1", "").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  st = groups.NextSequence("g-zzz", "c1", "secret-g-a").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("group_id = 'g-zzz'"), std::string::npos) << st;
}

TEST(ClientGroupsTest, DuplicatesCapAndExpiry) {
  ClientGroups::Options o;
  o.max_groups = 2;
  ClientGroups groups(o);
  ASSERT_TRUE(groups.Register(Join("g-1")).ok());
  auto st = groups.Register(Join("g-1"));
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  v1::WorkerJoinClientGroupRequest brief = Join("g-2");
  brief.set_expires_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Milliseconds(300)));
  ASSERT_TRUE(groups.Register(brief).ok());
  st = groups.Register(Join("g-3"));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(groups.count(), 2);
  absl::SleepFor(absl::Milliseconds(450));
  st = groups.NextSequence("g-2", "c1", "secret-g-2").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;  // expired: room again
  EXPECT_TRUE(groups.Register(Join("g-3")).ok());
}

TEST(ClientGroupsTest, JoinRequestsNameTheField) {
  struct Case {
    const char* field;
    std::function<void(v1::WorkerJoinClientGroupRequest*)> mutate;
  };
  const Case cases[] = {
      {"group_id has 0", [](v1::WorkerJoinClientGroupRequest* r) { r->clear_group_id(); }},
      {"group_id has 129",
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_group_id(std::string(129, 'g')); }},
      {"size = 1", [](v1::WorkerJoinClientGroupRequest* r) { r->set_size(1); }},
      {"rank = 1 is not a worker rank", [](v1::WorkerJoinClientGroupRequest* r) { r->set_rank(1); }},
      {"rank = -1", [](v1::WorkerJoinClientGroupRequest* r) { r->set_rank(-1); }},
      {"nccl_unique_id has 127",
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_nccl_unique_id(std::string(127, 'u')); }},
      {"init_timeout_ms = 700000",
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_init_timeout_ms(700000); }},
      {"group_secret has 257",
       [](v1::WorkerJoinClientGroupRequest* r) { r->set_group_secret(std::string(257, 's')); }},
      {"expires_unix_ms = 5", [](v1::WorkerJoinClientGroupRequest* r) { r->set_expires_unix_ms(5); }},
  };
  for (const Case& c : cases) {
    v1::WorkerJoinClientGroupRequest r = Join("g-x");
    c.mutate(&r);
    const absl::Status st = ValidateJoinClientGroup(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.field << ": " << st;
  }
  v1::WorkerJoinClientGroupRequest def = Join("g-y");
  def.set_init_timeout_ms(0);  // the default
  EXPECT_TRUE(ValidateJoinClientGroup(def).ok());
}

}  // namespace
}  // namespace dfa
