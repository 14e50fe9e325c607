// Fuzzing both services on real daemons (a coordinator and two cpu workers on loopback): a
// fixed-seed stream of mutated messages to every rpc of dfa.v1.Coordinator and dfa.v1.Worker,
// taken from the service descriptors, so a new rpc is fuzzed without editing this file. Seeds
// are valid requests about a real session (ids, capability, plan, transport addresses, a
// chunk); each call mutates its seed field by field (protobuf reflection: boundary and random
// numbers, junk and truncated strings, bytes, unknown enum values, cleared or added
// sub-messages and repeated entries) or byte by byte (flips, insertions, deletions,
// truncation of the serialized message), or sends it as it is, with or without the session's
// capability, through grpc::GenericStub (streams too: Upload gets several messages, Download
// and WatchJob are read to their end).
// Asserted: every call ends with a status within its deadline (no hang), no daemon dies (checked
// every 100 calls and at the end), every rpc was called, and afterwards the cluster still runs
// a correct forward and backward job. The whole run is bounded (a time budget, < 60 s here).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "core/session_capability.h"
#include "core/wire/crc32c.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/fault/hostile_util.h"
#include "tests/integration/cluster_fixture.h"

namespace dfa::testing {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;
using google::protobuf::Reflection;

constexpr uint64_t kSeed = 0x18f022;
constexpr int kCalls = 3000;
constexpr absl::Duration kBudget = absl::Seconds(50);
constexpr absl::Duration kCallDeadline = absl::Milliseconds(400);

using Rng = std::mt19937_64;

std::string RandomBytes(Rng& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string MutateStringOrBytes(Rng& rng, const std::string& s, bool bytes);

// Junk for a `string` field stays UTF-8 (else the server's protobuf parser refuses the whole
// message before any handler sees it); `bytes` fields get any bytes.
std::string MutateString(Rng& rng, const std::string& s, bool bytes) {
  std::string t = MutateStringOrBytes(rng, s, bytes);
  if (!bytes) {
    for (char& c : t) {
      if (static_cast<unsigned char>(c) >= 0x80) c = static_cast<char>(0x20 + (c & 0x3f));
    }
  }
  return t;
}

std::string MutateStringOrBytes(Rng& rng, const std::string& s, bool bytes) {
  switch (rng() % 7) {
    case 0:
      return "";
    case 1:
      return std::string(1 + rng() % 2000, static_cast<char>('a' + rng() % 26));
    case 2:
      return RandomBytes(rng, rng() % 64);
    case 3:
      return s.substr(0, s.empty() ? 0 : rng() % s.size());
    case 4: {
      std::string t = s.empty() ? std::string("x") : s;
      t[rng() % t.size()] ^= static_cast<char>(1 + rng() % 255);
      return t;
    }
    case 5:
      return bytes ? s + RandomBytes(rng, 1 + rng() % 32) : "../../etc/passwd";
    default:
      return s + s;
  }
}

int64_t BoundaryInt(Rng& rng) {
  static const int64_t kValues[] = {0, 1, -1, 2, 7, 64, 1 << 20, INT32_MAX, INT32_MIN,
                                    INT64_MAX, INT64_MIN, 1LL << 40};
  return rng() % 3 == 0 ? static_cast<int64_t>(rng()) : kValues[rng() % std::size(kValues)];
}

// One field-wise mutation somewhere in `m` (descending into set sub-messages).
void MutateOneField(Rng& rng, Message* m, int depth = 0) {
  const auto* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  if (d->field_count() == 0) return;
  const FieldDescriptor* f = d->field(static_cast<int>(rng() % d->field_count()));
  // Blobs (bytes fields: transport addresses, ids, handles, tensor data) half of the time.
  std::vector<const FieldDescriptor*> blobs;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->type() == FieldDescriptor::TYPE_BYTES) blobs.push_back(d->field(i));
  }
  if (!blobs.empty() && rng() % 2) f = blobs[rng() % blobs.size()];
  if (f->is_repeated()) {
    const int n = r->FieldSize(*m, f);
    // 0: clear, 1: remove the last, 2: add one, 3: change one (half of the time).
    const int op = static_cast<int>(rng() % 2 ? 3 : rng() % 3);
    if (op == 0) {
      r->ClearField(m, f);
      return;
    }
    if (op == 1 && n > 0) {
      r->RemoveLast(m, f);
      return;
    }
    if (op == 3 && n > 0 && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      const int i = static_cast<int>(rng() % n);
      r->SetRepeatedString(m, f, i,
                           MutateString(rng, r->GetRepeatedString(*m, f, i),
                                        f->type() == FieldDescriptor::TYPE_BYTES));
      return;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* added = r->AddMessage(m, f);
        if (n > 0 && rng() % 2) added->CopyFrom(r->GetRepeatedMessage(*m, f, 0));
        if (depth < 4) MutateOneField(rng, added, depth + 1);
        return;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f,
                     MutateString(rng, n > 0 ? r->GetRepeatedString(*m, f, 0) : std::string(),
                                  f->type() == FieldDescriptor::TYPE_BYTES));
        return;
      case FieldDescriptor::CPPTYPE_INT32:
        r->AddInt32(m, f, static_cast<int32_t>(BoundaryInt(rng)));
        return;
      case FieldDescriptor::CPPTYPE_INT64:
        r->AddInt64(m, f, BoundaryInt(rng));
        return;
      default:
        r->ClearField(m, f);
        return;
    }
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (rng() % 4 == 0) {
        r->ClearField(m, f);
      } else if (depth < 4) {
        MutateOneField(rng, r->MutableMessage(m, f), depth + 1);
      }
      return;
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, MutateString(rng, r->GetString(*m, f),
                                      f->type() == FieldDescriptor::TYPE_BYTES));
      return;
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(m, f, static_cast<int32_t>(BoundaryInt(rng)));
      return;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(m, f, BoundaryInt(rng));
      return;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(m, f, static_cast<uint32_t>(rng()));
      return;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(m, f, rng());
      return;
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      static const double kValues[] = {0.0, -1.0, 1e308, -1e308, NAN, INFINITY, 1e-310, 3.5};
      r->SetDouble(m, f, kValues[rng() % std::size(kValues)]);
      return;
    }
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(m, f, rng() % 2 ? NAN : -1.0f);
      return;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(m, f, !r->GetBool(*m, f));
      return;
    case FieldDescriptor::CPPTYPE_ENUM:
      r->SetEnumValue(m, f, static_cast<int>(BoundaryInt(rng) % 1000));
      return;
  }
}

std::string MutateBytes(Rng& rng, std::string s) {
  const int ops = 1 + static_cast<int>(rng() % 8);
  for (int i = 0; i < ops; ++i) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 5) {
      case 0:
        if (!s.empty()) s[at] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:
        s.insert(at, RandomBytes(rng, 1 + rng() % 8));
        break;
      case 2:
        if (!s.empty()) s.erase(at, 1 + rng() % 8);
        break;
      case 3:
        s = s.substr(0, at);
        break;
      default:
        if (!s.empty()) s[at] = static_cast<char>(rng());
    }
  }
  return s;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

bool Wait(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

// Sends `messages` (serialized) to `method` and returns the call's status.
grpc::Status Call(grpc::GenericStub* stub, const MethodDescriptor* method,
                  const std::vector<std::string>& messages, const std::string& capability) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  if (!capability.empty()) AttachCapability(&ctx, capability);
  const std::string name = absl::StrCat("/", method->service()->full_name(), "/", method->name());
  grpc::CompletionQueue cq;
  grpc::Status status;
  if (!method->client_streaming() && !method->server_streaming()) {
    auto call = stub->PrepareUnaryCall(&ctx, name, Buffer(messages.front()), &cq);
    call->StartCall();
    grpc::ByteBuffer response;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    (void)Wait(&cq);
  } else {
    auto call = stub->PrepareCall(&ctx, name, &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    bool ok = Wait(&cq);
    for (size_t i = 0; ok && i < messages.size(); ++i) {
      call->Write(Buffer(messages[i]), reinterpret_cast<void*>(2));
      ok = Wait(&cq);
    }
    if (ok) {
      call->WritesDone(reinterpret_cast<void*>(3));
      ok = Wait(&cq);
    }
    grpc::ByteBuffer response;
    for (int reads = 0; reads < 10000; ++reads) {
      call->Read(&response, reinterpret_cast<void*>(4));
      if (!Wait(&cq)) break;
    }
    call->Finish(&status, reinterpret_cast<void*>(5));
    (void)Wait(&cq);
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class FuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(2, {"--register_check_timeout_ms=200", "--rpc_timeout_ms=2000"});
    ASSERT_NE(cluster_, nullptr);
    auto c = client::Client::Connect(cluster_->client_options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    // A real session through the coordinator, with a finished forward job.
    client::SessionOptions so;
    so.spec = SmallSpec(64);
    so.num_workers = 2;
    auto s = client_->CreateSession(so);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    ASSERT_TRUE(session_->GenerateInputs(1, true).ok());
    auto job = session_->Run(v1::JOB_FORWARD);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    // A session opened directly on both workers (no capability), for RunJob's addresses.
    const v1::Plan plan = ProtoPlan(2, 64, true, "ring");
    const std::vector<std::string> addrs = {cluster_->workers()[0].address,
                                            cluster_->workers()[1].address};
    for (int r = 0; r < 2; ++r) {
      v1::OpenSessionResponse resp;
      ASSERT_TRUE(WorkerStub(addrs[r])
                      ->OpenSession(Ctx().get(),
                                    OpenRequest("fuzz-direct", SmallSpec(64), plan, r, addrs,
                                                "fuzz"),
                                    &resp)
                      .ok());
      transport_.push_back(resp.transport_address());
      v1::GenerateInputsRequest gen;
      gen.set_session_id("fuzz-direct");
      gen.set_client_id("fuzz");
      gen.set_seed(2);
      v1::GenerateInputsResponse gen_resp;
      ASSERT_TRUE(WorkerStub(addrs[r])->GenerateInputs(Ctx().get(), gen, &gen_resp).ok());
    }
    open_seed_ = OpenRequest("fuzz-open", SmallSpec(64), plan, 0, addrs, "fuzz");
  }

  void TearDown() override {
    if (cluster_) {
      EXPECT_TRUE(cluster_->Stop().ok()) << "logs in " << cluster_->log_dir();
    }
  }

  // A valid request of `method` to start mutating from (its type's default when none).
  std::vector<std::unique_ptr<Message>> Seeds(const MethodDescriptor* method) {
    const Message* proto =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type());
    std::unique_ptr<Message> m(proto->New());
    const std::string& name = method->name();
    const bool worker = method->service()->name() == "Worker";
    std::vector<std::unique_ptr<Message>> out;
    auto set = [&](const char* field, const std::string& v) {
      const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(field);
      if (f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        m->GetReflection()->SetString(m.get(), f, v);
      }
    };
    if (name == "OpenSession" && worker) {
      m->CopyFrom(open_seed_);
    } else if (name == "RunJob") {
      v1::RunJobRequest r;
      r.set_session_id("fuzz-direct");
      r.set_job_id("fuzz-job");
      r.set_kind(v1::JOB_FORWARD);
      for (const auto& a : transport_) r.add_peer_transport_addresses(a);
      m->CopyFrom(r);
    } else if (name == "CreateSession") {
      v1::CreateSessionRequest r;
      *r.mutable_spec() = SmallSpec(64);
      r.set_num_workers(2);
      r.set_client_id(client_->client_id());
      m->CopyFrom(r);
    } else if (name == "RegisterWorker") {
      v1::RegisterWorkerRequest r;
      r.set_worker_id("fuzz-w");
      r.set_address("127.0.0.1:1");
      r.set_backend("cpu");
      r.set_memory_limit_bytes(1 << 30);
      r.set_speed(1);
      r.add_transports("ucx");
      m->CopyFrom(r);
    } else if (name == "Upload") {
      // Several messages: a header, a valid chunk of Q rows [0, 8), a chunk with a bad CRC.
      v1::UploadRequest first;
      first.set_session_id(session_->id());
      first.set_client_id(client_->client_id());
      out.push_back(std::make_unique<v1::UploadRequest>(first));
      v1::UploadRequest chunk;
      v1::TensorChunk* c = chunk.mutable_chunk();
      c->set_kind(v1::TENSOR_Q);
      c->mutable_rows()->set_begin(0);
      c->mutable_rows()->set_end(8);
      c->set_data(std::string(8 * 2 * 16 * 4, '\x01'));
      c->set_crc32c(Crc32c(c->data().data(), c->data().size()));
      out.push_back(std::make_unique<v1::UploadRequest>(chunk));
      c->set_crc32c(c->crc32c() ^ 1);
      out.push_back(std::make_unique<v1::UploadRequest>(chunk));
      return out;
    } else {
      // Close and release name sessions of their own, so that the seeds above stay usable.
      set("session_id", name == "CloseSession"     ? "fuzz-close"
                        : name == "ReleaseSession" ? "fuzz-release"
                                                   : session_->id());
      set("client_id", client_->client_id());
      set("job_id", job_.job_id());
      set("worker_id", "fuzz-w");
      if (name == "Download" || name == "SharedMemoryTransfer" || name == "DeviceTransfer") {
        const FieldDescriptor* kind = m->GetDescriptor()->FindFieldByName("kind");
        if (kind != nullptr) m->GetReflection()->SetEnumValue(m.get(), kind, v1::TENSOR_O);
      }
      if (name == "CreateSharedMemory") {
        static_cast<v1::CreateSharedMemoryRequest*>(m.get())->set_bytes(4096);
      }
    }
    out.push_back(std::move(m));
    return out;
  }

  bool AllAlive() {
    bool alive = cluster_->coordinator_process()->Running();
    for (int i = 0; i < 2; ++i) alive = cluster_->worker_process(i)->Running() && alive;
    return alive;
  }

  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Session> session_;
  v1::Job job_;
  std::vector<std::string> transport_;
  v1::OpenSessionRequest open_seed_;
};

TEST_F(FuzzTest, MutatedMessagesToEveryRpcAnswerAStatusAndNoDaemonDies) {
  std::vector<const MethodDescriptor*> methods;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const char* name : {"dfa.v1.Coordinator", "dfa.v1.Worker"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) methods.push_back(service->method(i));
  }
  grpc::GenericStub coordinator(grpc::CreateChannel(cluster_->coordinator_address(),
                                                    grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<grpc::GenericStub>> workers;
  for (const auto& w : cluster_->workers()) {
    workers.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel(w.address, grpc::InsecureChannelCredentials())));
  }
  // Mutated string fields are often not UTF-8; protobuf says so on every serialization.
  google::protobuf::SetLogHandler(nullptr);
  Rng rng(kSeed);
  std::map<std::string, std::map<int, int>> outcomes;  // method -> status code -> calls
  const absl::Time start = absl::Now();
  int calls = 0;
  for (; calls < kCalls && absl::Now() - start < kBudget; ++calls) {
    const MethodDescriptor* method = methods[calls % methods.size()];  // every rpc in turn
    std::vector<std::string> messages;
    const int mode = static_cast<int>(rng() % 10);  // 0-4 fields, 5-8 bytes, 9 as it is
    for (auto& seed : Seeds(method)) {
      if (mode < 5) {
        const int n = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < n; ++i) MutateOneField(rng, seed.get());
      }
      std::string bytes = seed->SerializeAsString();
      if (mode >= 5 && mode < 9) bytes = MutateBytes(rng, bytes);
      messages.push_back(std::move(bytes));
    }
    const int capability = static_cast<int>(rng() % 3);  // the right one, none, a wrong one
    std::string cap = capability == 0 ? session_->capability() : std::string();
    if (capability == 2) {  // a wrong one, still a legal header value
      static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
      cap.resize(1 + rng() % 80);
      for (char& ch : cap) ch = kChars[rng() % (sizeof(kChars) - 1)];
    }
    grpc::GenericStub* stub = method->service()->name() == "Worker"
                                  ? workers[rng() % workers.size()].get()
                                  : &coordinator;
    const absl::Time t0 = absl::Now();
    const grpc::Status status = Call(stub, method, messages, cap);
    const absl::Duration took = absl::Now() - t0;
    ++outcomes[method->full_name()][status.error_code()];
    ASSERT_LT(took, kCallDeadline + absl::Seconds(5))
        << method->full_name() << " call " << calls << " hung: " << status.error_message();
    if (calls % 100 == 99) {
      ASSERT_TRUE(AllAlive()) << "a daemon died by call " << calls << " ("
                              << method->full_name() << "); logs in " << cluster_->log_dir();
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("%d fuzzed calls in %.1f s (seed %#llx)\n", calls, seconds,
              static_cast<unsigned long long>(kSeed));
  for (const auto& [method, codes] : outcomes) {
    std::string line = absl::StrCat(method, ":");
    for (const auto& [code, n] : codes) absl::StrAppend(&line, " ", code, "x", n);
    std::printf("  %s\n", line.c_str());
  }
  ASSERT_TRUE(AllAlive()) << "a daemon died; logs in " << cluster_->log_dir();
  EXPECT_GE(calls, 2000) << "too few calls within the time budget";
  EXPECT_EQ(outcomes.size(), methods.size()) << "not every rpc was called";

  // The cluster still computes correctly (after a heartbeat period: fuzzed heartbeats may have
  // reported odd memory figures for a real worker id).
  absl::SleepFor(absl::Seconds(1.5));
  const v1::AttentionSpec spec = MakeSpec(1, 96, 2, 1, 16, true);
  const TrainingInputs in = RandomInputs(spec, 11);
  RunResult r = RunTraining(client_.get(), spec, 2, "balanced", in);
  ExpectMatchesReference(spec, in, r);
}

}  // namespace
}  // namespace dfa::testing
