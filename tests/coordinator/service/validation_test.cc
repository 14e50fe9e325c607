// CreateSession / SubmitJob / ReleaseSession input checks over a real loopback channel: every
// bad field answers INVALID_ARGUMENT naming it; memory, ownership and ordering errors answer
// their own codes.
#include <cmath>
#include <functional>
#include <limits>

#include "coordinator_test_util.h"

namespace dfa::testing {
namespace {

struct BadSpecCase {
  const char* name;
  std::function<void(v1::CreateSessionRequest&)> mutate;
  const char* field;  // must appear in the message
};

class SpecValidationTest : public CoordinatorFixture,
                           public ::testing::WithParamInterface<BadSpecCase> {};

TEST_P(SpecValidationTest, AnswersInvalidArgumentNamingTheField) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionRequest req;
  *req.mutable_spec() = GoodSpec();
  req.set_client_id("alice");
  GetParam().mutate(req);
  v1::CreateSessionResponse resp;
  grpc::Status s = Create(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find(GetParam().field), std::string::npos) << s.error_message();
  EXPECT_EQ(workers_[0]->opened(), 0);
}

using Req = v1::CreateSessionRequest;
INSTANTIATE_TEST_SUITE_P(
    BadFields, SpecValidationTest,
    ::testing::Values(
        BadSpecCase{"ZeroBatch", [](Req& r) { r.mutable_spec()->set_batch(0); }, "batch"},
        BadSpecCase{"NegativeBatch", [](Req& r) { r.mutable_spec()->set_batch(-3); }, "batch"},
        BadSpecCase{"ZeroQHeads", [](Req& r) { r.mutable_spec()->set_q_heads(0); }, "q_heads"},
        BadSpecCase{"ZeroKvHeads", [](Req& r) { r.mutable_spec()->set_kv_heads(0); }, "kv_heads"},
        BadSpecCase{"HeadsNotDivisible", [](Req& r) { r.mutable_spec()->set_kv_heads(3); },
                    "kv_heads"},
        BadSpecCase{"ZeroHeadDim", [](Req& r) { r.mutable_spec()->set_head_dim(0); }, "head_dim"},
        BadSpecCase{"HugeHeadDim", [](Req& r) { r.mutable_spec()->set_head_dim(513); }, "head_dim"},
        BadSpecCase{"ZeroSeqLen", [](Req& r) { r.mutable_spec()->set_seq_len(0); }, "seq_len"},
        BadSpecCase{"SeqLenOverLimit", [](Req& r) { r.mutable_spec()->set_seq_len((1 << 20) + 1); },
                    "seq_len"},
        BadSpecCase{"SeqLenBelowWorkers", [](Req& r) { r.mutable_spec()->set_seq_len(1); },
                    "seq_len"},
        BadSpecCase{"NoDtype", [](Req& r) { r.mutable_spec()->set_dtype(v1::DTYPE_UNSPECIFIED); },
                    "dtype"},
        BadSpecCase{"UnknownDtype",
                    [](Req& r) { r.mutable_spec()->set_dtype(static_cast<v1::DType>(42)); },
                    "dtype"},
        BadSpecCase{"NegativeScale", [](Req& r) { r.mutable_spec()->set_softmax_scale(-1.f); },
                    "softmax_scale"},
        BadSpecCase{"NanScale",
                    [](Req& r) {
                      r.mutable_spec()->set_softmax_scale(std::numeric_limits<float>::quiet_NaN());
                    },
                    "softmax_scale"},
        BadSpecCase{"UnknownSchedule", [](Req& r) { r.set_schedule("fastest"); }, "schedule"},
        BadSpecCase{"DistflashOddWorkers",
                    [](Req& r) {
                      r.set_schedule("distflash");
                      r.set_num_workers(1);
                    },
                    "schedule"},
        BadSpecCase{"NegativeWorkers", [](Req& r) { r.set_num_workers(-1); }, "num_workers"},
        BadSpecCase{"NegativeTtl", [](Req& r) { r.set_ttl_seconds(-5); }, "ttl_seconds"}),
    [](const ::testing::TestParamInfo<BadSpecCase>& info) { return info.param.name; });

using CoordinatorValidationTest = CoordinatorFixture;

TEST_F(CoordinatorValidationTest, CudaWorkersTakeHeadDim64Or128Only) {
  StartCoordinator();
  FakeWorkerOptions o;
  o.id = "gpu0";
  o.backend = "cuda";
  AddWorker(o);
  v1::AttentionSpec spec = GoodSpec();
  spec.set_head_dim(96);
  v1::CreateSessionResponse resp;
  grpc::Status s = CreateWithSpec(spec, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("head_dim"), std::string::npos) << s.error_message();
  spec.set_head_dim(128);
  ASSERT_TRUE(CreateWithSpec(spec, &resp).ok());
  EXPECT_EQ(workers_[0]->last_open().transport(), "nccl");
}

// Two cuda workers on one GPU (the same device_uuid) never share a session: NCCL refuses two
// ranks of one communicator on one device. A session of both is refused naming the workers and
// the GPU; sessions of one worker each run; a worker on another GPU makes a pair possible.
TEST_F(CoordinatorValidationTest, WorkersOnOneGpuAreNotPlacedInOneSession) {
  StartCoordinator();
  const std::string gpu = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
  for (const char* id : {"gpu0", "gpu0-again"}) {
    FakeWorkerOptions o;
    o.id = id;
    o.backend = "cuda";
    o.device_uuid = gpu;
    AddWorker(o);
  }
  v1::AttentionSpec spec = GoodSpec();
  spec.set_head_dim(128);
  v1::CreateSessionResponse resp;
  grpc::Status s = CreateWithSpec(spec, &resp, /*num_workers=*/2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("1 distinct GPUs"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find(gpu), std::string::npos) << s.error_message();
  EXPECT_EQ(workers_[0]->opened() + workers_[1]->opened(), 0);
  // All workers (num_workers 0): one per GPU.
  ASSERT_TRUE(CreateWithSpec(spec, &resp, /*num_workers=*/0).ok());
  EXPECT_EQ(resp.shards_size(), 1);
  ASSERT_TRUE(CreateWithSpec(spec, &resp, /*num_workers=*/1).ok());
  FakeWorkerOptions other;
  other.id = "gpu1";
  other.backend = "cuda";
  other.device_uuid = "GPU-11111111-2222-3333-4444-555555555555";
  AddWorker(other);
  ASSERT_TRUE(CreateWithSpec(spec, &resp, /*num_workers=*/2).ok());
  ASSERT_EQ(resp.shards_size(), 2);
  EXPECT_NE(resp.shards(0).worker_id(), resp.shards(1).worker_id());
  EXPECT_TRUE(resp.shards(0).worker_id() == "gpu1" || resp.shards(1).worker_id() == "gpu1");
}

TEST_F(CoordinatorValidationTest, NoWorkersIsUnavailable) {
  StartCoordinator();
  v1::CreateSessionResponse resp;
  EXPECT_EQ(CreateWithSpec(GoodSpec(), &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(CoordinatorValidationTest, MoreWorkersThanLiveIsResourceExhausted) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse resp;
  grpc::Status s = CreateWithSpec(GoodSpec(), &resp, /*num_workers=*/3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("num_workers"), std::string::npos) << s.error_message();
}

TEST_F(CoordinatorValidationTest, SessionThatDoesNotFitIsResourceExhausted) {
  StartCoordinator();
  AddCpuWorkers(2, /*memory=*/64 << 20);
  v1::AttentionSpec spec = GoodSpec();
  spec.set_seq_len(1 << 20);  // ~1 GiB of tensors per worker
  v1::CreateSessionResponse resp;
  grpc::Status s = CreateWithSpec(spec, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("memory"), std::string::npos) << s.error_message();
  EXPECT_EQ(workers_[0]->opened() + workers_[1]->opened(), 0);

  // Admission counts the memory other sessions hold: a session that fits alone fills the
  // workers, a second one no longer fits, and after a release it fits again.
  spec.set_seq_len(4096);
  ASSERT_TRUE(CreateWithSpec(spec, &resp).ok());
  ASSERT_GT(resp.bytes_per_worker(), 0);
  std::vector<std::string> ids = {resp.session_id()};
  grpc::Status more;
  while ((more = CreateWithSpec(spec, &resp)).ok() && ids.size() < 100) {
    ids.push_back(resp.session_id());
  }
  EXPECT_EQ(more.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << more.error_message();
  v1::ClusterStatus status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.sessions(), static_cast<int>(ids.size()));
  EXPECT_LE(status.memory_used_bytes(), status.memory_limit_bytes());
  EXPECT_GT(status.memory_used_bytes(), status.memory_limit_bytes() / 2);
  v1::ReleaseSessionRequest rel;
  rel.set_session_id(ids.back());
  rel.set_client_id("alice");
  v1::ReleaseSessionResponse rel_resp;
  ASSERT_TRUE(stub_->ReleaseSession(SessionCtx(ids.back()).get(), rel, &rel_resp).ok());
  EXPECT_TRUE(CreateWithSpec(spec, &resp).ok());
}

TEST_F(CoordinatorValidationTest, SizesAtTheLimitsDoNotOverflowTheAccounting) {
  CoordinatorOptions o = TestOptions();
  o.limits.max_seq_len = int64_t{1} << 40;
  StartCoordinator(o);
  AddCpuWorkers(2, /*memory=*/0);  // no declared limit: only the overflow guard can refuse
  v1::AttentionSpec spec = GoodSpec();
  spec.set_batch(1024);
  spec.set_q_heads(1024);
  spec.set_kv_heads(1024);
  spec.set_head_dim(512);
  spec.set_seq_len(int64_t{1} << 40);
  v1::CreateSessionResponse resp;
  grpc::Status s = CreateWithSpec(spec, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("memory"), std::string::npos) << s.error_message();
  v1::ClusterStatus status;
  ASSERT_TRUE(stub_->GetStatus(Ctx().get(), v1::GetStatusRequest(), &status).ok());
  EXPECT_EQ(status.memory_used_bytes(), 0);
}

TEST_F(CoordinatorValidationTest, UnknownAndForeignSessions) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created, 0, "alice").ok());
  v1::Job job;
  EXPECT_EQ(Submit("s-nope", v1::JOB_FORWARD, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::Status foreign = Submit(created.session_id(), v1::JOB_FORWARD, &job, "mallory");
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(foreign.error_message().find("client_id"), std::string::npos);

  v1::ReleaseSessionRequest rel;
  v1::ReleaseSessionResponse rel_resp;
  rel.set_session_id("s-nope");
  rel.set_client_id("alice");
  EXPECT_EQ(stub_->ReleaseSession(Ctx().get(), rel, &rel_resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  rel.set_session_id(created.session_id());
  rel.set_client_id("mallory");
  EXPECT_EQ(stub_->ReleaseSession(SessionCtx(created.session_id()).get(), rel, &rel_resp)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(workers_[0]->closed(), 0);

  // The owner may release, twice (idempotent); the workers close it once.
  rel.set_client_id("alice");
  EXPECT_TRUE(stub_->ReleaseSession(SessionCtx(created.session_id()).get(), rel, &rel_resp).ok());
  EXPECT_TRUE(stub_->ReleaseSession(SessionCtx(created.session_id()).get(), rel, &rel_resp).ok());
  EXPECT_EQ(workers_[0]->closed() + workers_[1]->closed(), 2);
  EXPECT_EQ(Submit(created.session_id(), v1::JOB_FORWARD, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);

  v1::GetJobRequest get;
  get.set_job_id("j-nope");
  EXPECT_EQ(stub_->GetJob(Ctx().get(), get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorValidationTest, BackwardBeforeForwardIsFailedPrecondition) {
  StartCoordinator();
  AddCpuWorkers(2);
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CreateWithSpec(GoodSpec(), &created).ok());
  v1::Job job;
  grpc::Status s = Submit(created.session_id(), v1::JOB_BACKWARD, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("forward"), std::string::npos) << s.error_message();
  EXPECT_EQ(Submit(created.session_id(), static_cast<v1::JobKind>(7), &job).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(workers_[0]->runs_started(), 0);
}

TEST_F(CoordinatorValidationTest, WorkerRegistrationIsValidated) {
  StartCoordinator();
  v1::RegisterWorkerRequest req;
  req.set_worker_id("w");
  req.set_address("127.0.0.1:1");
  req.set_backend("tpu");
  v1::RegisterWorkerResponse resp;
  grpc::Status s = stub_->RegisterWorker(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("backend"), std::string::npos);
  req.set_backend("cpu");
  req.set_address("");
  EXPECT_EQ(stub_->RegisterWorker(Ctx().get(), req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  req.set_address("127.0.0.1:1");
  for (const char* uuid : {"GPU-\n-injected", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}) {
    req.set_device_uuid(uuid);  // a control character; a GPU on a cpu worker
    s = stub_->RegisterWorker(Ctx().get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << uuid;
    EXPECT_NE(s.error_message().find("device_uuid"), std::string::npos) << s.error_message();
  }
  req.set_backend("cuda");
  req.set_device_uuid(std::string(65, 'a'));
  s = stub_->RegisterWorker(Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("device_uuid"), std::string::npos) << s.error_message();
  v1::HeartbeatRequest hb;
  hb.set_worker_id("never-registered");
  v1::HeartbeatResponse hb_resp;
  EXPECT_EQ(stub_->Heartbeat(Ctx().get(), hb, &hb_resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorValidationTest, AuthTokenIsRequiredWhenConfigured) {
  CoordinatorOptions o = TestOptions();
  o.auth_token = "s3cret";
  StartCoordinator(o);
  v1::ClusterStatus status;
  EXPECT_EQ(stub_->GetStatus(Ctx().get(), v1::GetStatusRequest(), &status).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto wrong = Ctx();
  wrong->AddMetadata("authorization", "Bearer guess");
  EXPECT_EQ(stub_->GetStatus(wrong.get(), v1::GetStatusRequest(), &status).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto right = Ctx();
  right->AddMetadata("authorization", "Bearer s3cret");
  EXPECT_TRUE(stub_->GetStatus(right.get(), v1::GetStatusRequest(), &status).ok());
}

}  // namespace
}  // namespace dfa::testing
