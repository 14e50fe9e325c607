// Sessions are owned through their capability, against real daemons (a coordinator and two CPU
// workers as processes on loopback): a client that knows a session's id — with the owner's
// client id, which is predictable ("dfa-client-<host>-<pid>-<n>"), or another — cannot read,
// overwrite, run, cancel, release or close the session, at the coordinator or at a worker,
// without the capability CreateSession returned; a forged or altered capability fares no
// better; every refusal is PERMISSION_DENIED naming the session and leaves the session as it
// was. Ids and capabilities look random.
//
// Against daemons that predate capabilities (DFA_BIN_DIR pointing at them) the refusals do not
// happen and these tests fail.
#include "core/session_capability.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "client/grpc_util.h"
#include "core/random_id.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

constexpr int64_t kChunk = 1 << 20;

// Who calls: a client id and the capability it presents ("" for none).
struct Caller {
  std::string name;  // for messages
  std::string client_id;
  std::string capability;
};

class SessionCapabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartClusterOrSkip(2);
    ASSERT_FALSE(HasFailure()) << "the cluster did not start";  // fatal: no body on nulls
    if (!cluster_) GTEST_SKIP() << "dfa-coordinator / dfa-worker not built";
    owner_ = Connect("");  // the default, predictable client id
    ASSERT_NE(owner_, nullptr);
    spec_ = MakeSpec(1, 64, 2, 2, 16, true);
    in_ = RandomInputs(spec_, 11);
    client::SessionOptions o;
    o.spec = spec_;
    o.num_workers = 2;
    auto s = owner_->CreateSession(o);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    for (auto [kind, t] : {std::pair{v1::TENSOR_Q, &in_.q}, std::pair{v1::TENSOR_K, &in_.k},
                           std::pair{v1::TENSOR_V, &in_.v}}) {
      ASSERT_TRUE(session_->Upload(kind, *t).ok());
    }
    auto job = session_->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->job_id();
    ASSERT_TRUE(session_->Download(v1::TENSOR_O, &o_before_).ok());
  }

  void TearDown() override {
    if (!cluster_) return;
    session_.reset();
    EXPECT_TRUE(cluster_->Stop().ok()) << "a daemon crashed or did not stop cleanly";
  }

  std::unique_ptr<client::Client> Connect(const std::string& client_id) {
    client::ClientOptions o;
    o.coordinator = cluster_->coordinator_address();
    o.client_id = client_id;
    o.rpc_timeout = absl::Seconds(10);
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const Caller& who) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    client::SetDeadline(ctx.get(), absl::Seconds(10));
    AttachCapability(ctx.get(), who.capability);
    return ctx;
  }

  // The callers that must be refused: the owner's own (guessable) client id and a stranger's,
  // each with no capability, a forged one, and the real one altered.
  std::vector<Caller> Intruders() const {
    const std::string real = session_->capability();
    std::string flipped = real;
    if (!flipped.empty()) flipped.back() = flipped.back() == 'A' ? 'B' : 'A';
    const std::string truncated = real.substr(0, real.empty() ? 0 : real.size() - 1);
    std::vector<Caller> out;
    for (const std::string& id : {owner_->client_id(), std::string("someone-else")}) {
      const std::string who = id == owner_->client_id() ? "owner's client id" : "stranger";
      out.push_back({who + ", no capability", id, ""});
      out.push_back({who + ", forged capability", id, NewCapability()});
      out.push_back({who + ", one character changed", id, flipped});
      out.push_back({who + ", truncated", id, truncated});
    }
    return out;
  }

  // PERMISSION_DENIED, naming the session and the capability (the first thing checked).
  void ExpectDenied(const absl::Status& s, const Caller& who, const std::string& rpc) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied)
        << rpc << " by " << who.name << ": " << s;
    EXPECT_NE(s.message().find(session_->id()), std::string::npos)
        << rpc << " by " << who.name << " should name the session: " << s;
    EXPECT_NE(s.message().find("session_capability"), std::string::npos)
        << rpc << " by " << who.name << " should name the capability: " << s;
  }

  client::WorkerDataClient Data(const Caller& who, int rank) {
    const auto& shard = session_->info().shards(rank);
    client::WorkerDataClient d(owner_->WorkerChannel(shard.address()), shard.address(),
                               session_->id(), who.client_id, who.capability, absl::Seconds(10));
    return d;
  }

  std::vector<v1::RowRange> Owned(int rank) const {
    const auto& shard = session_->info().shards(rank);
    return {shard.owned().begin(), shard.owned().end()};
  }

  // The session is as the owner left it: still open at the coordinator and on both workers,
  // its inputs unchanged (a new forward gives the same O), its O readable.
  void ExpectSessionUntouched() {
    client::HostTensor o;
    ASSERT_TRUE(session_->Download(v1::TENSOR_O, &o).ok());
    EXPECT_EQ(o.bytes, o_before_.bytes) << "O changed";
    auto job = session_->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << "the owner's session no longer works: " << job.status();
    ASSERT_TRUE(session_->Download(v1::TENSOR_O, &o).ok());
    EXPECT_EQ(o.bytes, o_before_.bytes) << "Q, K or V were overwritten";
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<client::Client> owner_;
  std::unique_ptr<client::Session> session_;
  v1::AttentionSpec spec_;
  TrainingInputs in_;
  std::string job_id_;
  client::HostTensor o_before_;
};

TEST_F(SessionCapabilityTest, CoordinatorRpcsNeedTheCapability) {
  auto stub = owner_->coordinator();
  for (const Caller& who : Intruders()) {
    SCOPED_TRACE(who.name);
    {
      v1::SubmitJobRequest req;
      req.set_session_id(session_->id());
      req.set_client_id(who.client_id);
      req.set_kind(v1::JOB_FORWARD);
      v1::Job job;
      ExpectDenied(client::FromGrpc(stub->SubmitJob(Ctx(who).get(), req, &job), "SubmitJob"), who,
                   "SubmitJob");
    }
    v1::GetJobRequest get;
    get.set_job_id(job_id_);
    get.set_client_id(who.client_id);
    v1::Job job;
    ExpectDenied(client::FromGrpc(stub->GetJob(Ctx(who).get(), get, &job), "GetJob"), who,
                 "GetJob");
    ExpectDenied(client::FromGrpc(stub->CancelJob(Ctx(who).get(), get, &job), "CancelJob"), who,
                 "CancelJob");
    {
      auto ctx = Ctx(who);
      auto reader = stub->WatchJob(ctx.get(), get);
      EXPECT_FALSE(reader->Read(&job)) << "WatchJob streamed the owner's job";
      ExpectDenied(client::FromGrpc(reader->Finish(), "WatchJob"), who, "WatchJob");
    }
    v1::ReleaseSessionRequest rel;
    rel.set_session_id(session_->id());
    rel.set_client_id(who.client_id);
    v1::ReleaseSessionResponse rel_resp;
    ExpectDenied(
        client::FromGrpc(stub->ReleaseSession(Ctx(who).get(), rel, &rel_resp), "ReleaseSession"),
        who, "ReleaseSession");
  }
  ExpectSessionUntouched();
  auto owner_job = owner_->GetJob(job_id_);  // the owner's Client sends the capability itself
  ASSERT_TRUE(owner_job.ok()) << owner_job.status();
  EXPECT_EQ(owner_job->state(), v1::JOB_SUCCEEDED);

  // Released: the coordinator closed it on both workers (its CloseSession carries the
  // capability), and a repeated release is OK for the owner only.
  ASSERT_TRUE(session_->Release().ok());
  const Caller owner{"owner", owner_->client_id(), session_->capability()};
  for (int rank = 0; rank < session_->num_workers(); ++rank) {
    client::HostTensor out = *client::MakeTensor(spec_, v1::TENSOR_O);
    const absl::Status gone =
        Data(owner, rank).DownloadGrpc(v1::TENSOR_O, Owned(rank), kChunk, &out, nullptr).status();
    EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << "rank " << rank << ": " << gone;
  }
  for (const Caller& who : Intruders()) {
    v1::ReleaseSessionRequest rel;
    rel.set_session_id(session_->id());
    rel.set_client_id(who.client_id);
    v1::ReleaseSessionResponse rel_resp;
    ExpectDenied(
        client::FromGrpc(stub->ReleaseSession(Ctx(who).get(), rel, &rel_resp), "ReleaseSession"),
        who, "ReleaseSession after release");
  }
  v1::ReleaseSessionRequest rel;
  rel.set_session_id(session_->id());
  rel.set_client_id(owner.client_id);
  v1::ReleaseSessionResponse rel_resp;
  EXPECT_TRUE(stub->ReleaseSession(Ctx(owner).get(), rel, &rel_resp).ok());
}

TEST_F(SessionCapabilityTest, WorkerDataPlaneNeedsTheCapability) {
  client::HostTensor garbage = *client::MakeTensor(spec_, v1::TENSOR_Q);
  client::FillRandom(99, &garbage);
  for (const Caller& who : Intruders()) {
    SCOPED_TRACE(who.name);
    for (int rank = 0; rank < session_->num_workers(); ++rank) {
      client::WorkerDataClient data = Data(who, rank);
      const std::vector<v1::RowRange> owned = Owned(rank);
      client::HostTensor out;
      out = *client::MakeTensor(spec_, v1::TENSOR_O);
      // Read.
      ExpectDenied(data.DownloadGrpc(v1::TENSOR_O, owned, kChunk, &out, nullptr).status(), who,
                   "Download");
      ExpectDenied(data.DownloadShm(v1::TENSOR_O, owned, 1 << 20, &out, nullptr).status(), who,
                   "SharedMemoryTransfer download");
      // Overwrite.
      ExpectDenied(data.UploadGrpc(v1::TENSOR_Q, garbage, owned, kChunk, nullptr).status(), who,
                   "Upload");
      ExpectDenied(data.UploadShm(v1::TENSOR_K, garbage, owned, 1 << 20, nullptr).status(), who,
                   "SharedMemoryTransfer upload");
      ExpectDenied(data.GenerateInputs(5, true), who, "GenerateInputs");
      // Raw chunks (the generated Upload stub) and CUDA IPC: refused before any check of the
      // payload.
      v1::TensorChunk chunk;
      chunk.set_kind(v1::TENSOR_V);
      chunk.mutable_rows()->set_begin(owned[0].begin());
      chunk.mutable_rows()->set_end(owned[0].begin() + 1);
      ExpectDenied(data.UploadChunks(std::vector<v1::TensorChunk>{chunk}).status(), who,
                   "Upload (chunks)");
      v1::DeviceTransferRequest dt;
      dt.set_kind(v1::TENSOR_O);
      *dt.mutable_rows() = owned[0];
      ExpectDenied(data.DeviceTransfer(dt).status(), who, "DeviceTransfer");
      v1::BindDeviceTensorsRequest bind;
      bind.set_job(v1::JOB_FORWARD);  // no transfers: would clear the session's bindings
      ExpectDenied(data.BindDeviceTensors(bind).status(), who, "BindDeviceTensors");
    }
  }
  ExpectSessionUntouched();
  // The owner's own request passes the capability check and meets the payload's (a cpu worker
  // does no CUDA IPC; the request names no tensor).
  const Caller owner{"owner", owner_->client_id(), session_->capability()};
  client::WorkerDataClient data = Data(owner, 0);
  v1::DeviceTransferRequest dt;
  dt.set_kind(v1::TENSOR_O);
  *dt.mutable_rows() = Owned(0)[0];
  const absl::Status st = data.DeviceTransfer(dt).status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), absl::StatusCode::kPermissionDenied) << st;
}

TEST_F(SessionCapabilityTest, WorkerSessionControlNeedsTheCapability) {
  // CloseSession and RunJob straight to a worker, as the coordinator would send them.
  for (const Caller& who : Intruders()) {
    SCOPED_TRACE(who.name);
    for (int rank = 0; rank < session_->num_workers(); ++rank) {
      const auto& shard = session_->info().shards(rank);
      auto stub = v1::Worker::NewStub(owner_->WorkerChannel(shard.address()));
      v1::CloseSessionRequest close;
      close.set_session_id(session_->id());
      v1::CloseSessionResponse close_resp;
      ExpectDenied(
          client::FromGrpc(stub->CloseSession(Ctx(who).get(), close, &close_resp), "CloseSession"),
          who, "CloseSession");
      v1::RunJobRequest run;
      run.set_session_id(session_->id());
      run.set_job_id("j-intruder");
      run.set_kind(v1::JOB_FORWARD);
      v1::WorkerJobStats stats;
      ExpectDenied(client::FromGrpc(stub->RunJob(Ctx(who).get(), run, &stats), "RunJob"), who,
                   "RunJob");
    }
  }
  ExpectSessionUntouched();
}

TEST_F(SessionCapabilityTest, TheCapabilityWorksFromAnotherProcessWithTheOwnersClientId) {
  // Handing the session to another process: the capability with the owner's client id works
  // (for data and jobs); the owner's client id alone does not; with another client id the
  // capability is refused naming the client id.
  auto helper = Connect(owner_->client_id());
  ASSERT_NE(helper, nullptr);
  const Caller delegate{"delegate", owner_->client_id(), session_->capability()};
  const Caller id_only{"the owner's client id alone", owner_->client_id(), ""};
  const auto& shard = session_->info().shards(1);
  {
    client::WorkerDataClient plain(helper->WorkerChannel(shard.address()), shard.address(),
                                   session_->id(), id_only.client_id, id_only.capability,
                                   absl::Seconds(10));
    client::HostTensor o = *client::MakeTensor(spec_, v1::TENSOR_O);
    ExpectDenied(plain.DownloadGrpc(v1::TENSOR_O, Owned(1), kChunk, &o, nullptr).status(), id_only,
                 "Download");
    v1::SubmitJobRequest req;
    req.set_session_id(session_->id());
    req.set_client_id(id_only.client_id);
    req.set_kind(v1::JOB_FORWARD);
    v1::Job job;
    ExpectDenied(client::FromGrpc(helper->coordinator()->SubmitJob(Ctx(id_only).get(), req, &job),
                                  "SubmitJob"),
                 id_only, "SubmitJob");
  }
  client::WorkerDataClient data(helper->WorkerChannel(shard.address()), shard.address(),
                                session_->id(), delegate.client_id, delegate.capability,
                                absl::Seconds(10));
  client::HostTensor o = *client::MakeTensor(spec_, v1::TENSOR_O);
  ASSERT_TRUE(data.DownloadGrpc(v1::TENSOR_O, Owned(1), kChunk, &o, nullptr).ok());
  v1::SubmitJobRequest req;
  req.set_session_id(session_->id());
  req.set_client_id(delegate.client_id);
  req.set_kind(v1::JOB_FORWARD);
  v1::Job job;
  grpc::Status st = helper->coordinator()->SubmitJob(Ctx(delegate).get(), req, &job);
  ASSERT_TRUE(st.ok()) << st.error_message();

  const Caller other{"other client id with the capability", "someone-else", session_->capability()};
  req.set_client_id(other.client_id);
  v1::Job refused;
  absl::Status s = client::FromGrpc(
      helper->coordinator()->SubmitJob(Ctx(other).get(), req, &refused), "SubmitJob");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("client_id"), std::string::npos) << s;
  client::WorkerDataClient other_data(helper->WorkerChannel(shard.address()), shard.address(),
                                      session_->id(), other.client_id, other.capability,
                                      absl::Seconds(10));
  s = other_data.DownloadGrpc(v1::TENSOR_O, Owned(1), kChunk, &o, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("client_id"), std::string::npos) << s;
}

TEST_F(SessionCapabilityTest, IdsAndCapabilitiesLookRandom) {
  const std::regex session_id("s-[0-9a-f]{32}");
  const std::regex job_id("j-[0-9a-f]{32}");
  const std::regex capability("[A-Za-z0-9_-]{43}");
  std::set<std::string> seen;
  auto fresh = [&](const std::string& v) {
    EXPECT_TRUE(seen.insert(v).second) << "repeated: " << v;
  };
  EXPECT_TRUE(std::regex_match(session_->id(), session_id)) << session_->id();
  EXPECT_TRUE(std::regex_match(session_->capability(), capability)) << session_->capability();
  EXPECT_TRUE(std::regex_match(job_id_, job_id)) << job_id_;
  fresh(session_->id());
  fresh(session_->capability());
  fresh(job_id_);
  for (int i = 0; i < 8; ++i) {
    client::SessionOptions o;
    o.spec = spec_;
    o.num_workers = 1;
    auto s = owner_->CreateSession(o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(std::regex_match((*s)->id(), session_id)) << (*s)->id();
    EXPECT_TRUE(std::regex_match((*s)->capability(), capability)) << (*s)->capability();
    fresh((*s)->id());
    fresh((*s)->capability());
    ASSERT_TRUE((*s)->GenerateInputs(i, false).ok());
    auto job = (*s)->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(std::regex_match(job->job_id(), job_id)) << job->job_id();
    fresh(job->job_id());
    // One session's capability opens no other session.
    const Caller cross{"another session's capability", owner_->client_id(), (*s)->capability()};
    client::WorkerDataClient data = Data(cross, 0);
    client::HostTensor out = *client::MakeTensor(spec_, v1::TENSOR_O);
    ExpectDenied(data.DownloadGrpc(v1::TENSOR_O, Owned(0), kChunk, &out, nullptr).status(), cross,
                 "Download with another session's capability");
  }
}

}  // namespace
}  // namespace dfa::testing
