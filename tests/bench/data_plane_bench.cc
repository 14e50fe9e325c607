// dfa-data-plane-bench: the worker's client data plane on loopback, best of N repeats, beside
// this machine's memcpy rate. One in-process WorkerDaemon, one session of a 1-worker plan,
// bf16 rows of 8 KiB (32 heads x 128). Prints, per path, GB/s of wall time and the CPU
// seconds per GB the whole process (client + worker) spent.
//
// Paths: "proto" = the generated stubs (the client copies rows into a TensorChunk string, which
// gRPC serialises); "raw" = core/wire/chunk_wire.h on the client too, over gRPC's generic stub
// (client/raw_stream.h; rows copied once into the slice gRPC sends; received chunks copied once
// into the tensor);
// "shm" = Worker.SharedMemoryTransfer through one reused, pre-faulted segment.
//
// usage: dfa-data-plane-bench [mib=64] [repeats=5] [chunk_mib=4]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/raw_stream.h"
#include "core/planner/plan_proto.h"
#include "core/planner/planner.h"
#include "dfa/v1/worker.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "core/wire/chunk_wire.h"
#include "core/wire/crc32c.h"
#include "worker/worker_daemon.h"

namespace dfa {
namespace {

constexpr int kHeads = 32, kDim = 128;
constexpr int64_t kRowBytes = int64_t{kHeads} * kDim * 2;
const char kClient[] = "bench";
const char kSession[] = "bench-session";

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Result {
  double best_gbps = 0;
  double cpu_per_gb = 0;
};

// Best wall rate of `repeats` runs of fn (each moving `bytes`), and mean CPU s per GB.
Result Measure(int repeats, int64_t bytes, const std::function<bool()>& fn) {
  Result r;
  double cpu = 0;
  for (int i = 0; i < repeats; ++i) {
    const double c0 = CpuSeconds();
    const absl::Time t0 = absl::Now();
    if (!fn()) {
      std::fprintf(stderr, "transfer failed\n");
      std::exit(1);
    }
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    cpu += CpuSeconds() - c0;
    r.best_gbps = std::max(r.best_gbps, bytes / s / 1e9);
  }
  r.cpu_per_gb = cpu / repeats / (bytes / 1e9);
  return r;
}

void Print(const char* what, const Result& r, double memcpy_gbps) {
  std::printf("%-34s %6.2f GB/s  (%4.0f%% of memcpy)  %5.2f CPU s/GB\n", what, r.best_gbps,
              100 * r.best_gbps / memcpy_gbps, r.cpu_per_gb);
}

int Main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t chunk_bytes = (argc > 3 ? std::atoll(argv[3]) : 4) << 20;
  const int64_t rows = std::max<int64_t>(64, (mib << 20) / kRowBytes);
  const int64_t bytes = rows * kRowBytes;

  std::vector<uint8_t> tensor(static_cast<size_t>(bytes)), back(static_cast<size_t>(bytes));
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<uint8_t>(i * 131 + 7);
  std::fill(back.begin(), back.end(), 1);
  const Result mc = Measure(repeats, bytes, [&] {
    std::memcpy(back.data(), tensor.data(), tensor.size());
    return back[17] == tensor[17];
  });
  std::printf("data plane, %lld MiB per transfer, %lld KiB chunks, best of %d (this machine)\n",
              static_cast<long long>(bytes >> 20), static_cast<long long>(chunk_bytes >> 10),
              repeats);
  Print("memcpy (1 thread)", mc, mc.best_gbps);

  WorkerOptions o;
  o.threads = 1;
  o.memory_limit_bytes = 8 * bytes + (int64_t{256} << 20);
  auto daemon = WorkerDaemon::Start(o);
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel =
      grpc::CreateCustomChannel((*daemon)->address(), grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Worker::NewStub(channel);

  PlanRequest pr;
  pr.schedule = "ring";
  pr.workers = 1;
  pr.seq_len = rows;
  pr.causal = true;
  auto plan = MakePlan(pr);
  if (!plan.ok()) return 1;
  v1::OpenSessionRequest open;
  open.set_session_id(kSession);
  open.set_client_id(kClient);
  open.set_rank(0);
  open.set_transport("ucx");
  v1::AttentionSpec* spec = open.mutable_spec();
  spec->set_batch(1);
  spec->set_q_heads(kHeads);
  spec->set_kv_heads(kHeads);
  spec->set_head_dim(kDim);
  spec->set_seq_len(rows);
  spec->set_causal(true);
  spec->set_dtype(v1::DTYPE_BF16);
  PlanToProto(*plan, open.mutable_plan());
  {
    grpc::ClientContext ctx;
    v1::OpenSessionResponse resp;
    const grpc::Status st = stub->OpenSession(&ctx, open, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "OpenSession: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / kRowBytes);

  auto upload_proto = [&] {
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto w = stub->Upload(&ctx, &resp);
    v1::UploadRequest m;
    m.set_session_id(kSession);
    m.set_client_id(kClient);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
      v1::TensorChunk* c = m.mutable_chunk();
      c->set_kind(v1::TENSOR_Q);
      c->mutable_rows()->set_begin(r0);
      c->mutable_rows()->set_end(r1);
      std::string* d = c->mutable_data();
      d->assign(reinterpret_cast<const char*>(tensor.data() + r0 * kRowBytes),
                static_cast<size_t>((r1 - r0) * kRowBytes));
      c->set_crc32c(Crc32c(d->data(), d->size()));
      if (!w->Write(m)) break;
      m.clear_session_id();
      m.clear_client_id();
    }
    w->WritesDone();
    return w->Finish().ok() && resp.bytes_received() == bytes;
  };
  grpc::GenericStub raw_stub(channel);
  auto upload_raw = [&] {
    grpc::ClientContext ctx;
    client::RawStream w(&raw_stub, &ctx, "/dfa.v1.Worker/Upload");
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
      const int64_t n = (r1 - r0) * kRowBytes;
      uint8_t* data;
      grpc::Slice slice = NewDataSlice(static_cast<size_t>(n), &data);
      std::memcpy(data, tensor.data() + r0 * kRowBytes, static_cast<size_t>(n));
      const uint32_t crc = Crc32c(data, static_cast<size_t>(n));
      const std::string prefix = EncodeUploadPrefix(r0 == 0 ? kSession : "", r0 == 0 ? kClient : "",
                                                    v1::TENSOR_Q, r0, r1, 0, crc, n);
      if (!w.Write(FrameBuffer(prefix, std::move(slice)))) break;
    }
    w.WritesDone();
    grpc::ByteBuffer reply;
    std::vector<grpc::Slice> slices;
    std::string reply_bytes;
    if (w.Read(&reply) && reply.Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices) {
        reply_bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
    }
    v1::UploadResponse resp;
    return w.Finish().ok() && resp.ParseFromString(reply_bytes) && resp.bytes_received() == bytes;
  };
  v1::DownloadRequest dreq;
  dreq.set_session_id(kSession);
  dreq.set_client_id(kClient);
  dreq.set_kind(v1::TENSOR_Q);
  dreq.set_chunk_bytes(static_cast<int32_t>(chunk_bytes));
  auto download_proto = [&] {
    grpc::ClientContext ctx;
    auto r = stub->Download(&ctx, dreq);
    v1::TensorChunk c;
    int64_t got = 0;
    while (r->Read(&c)) {
      if (Crc32c(c.data().data(), c.data().size()) != c.crc32c()) return false;
      std::memcpy(back.data() + c.rows().begin() * kRowBytes, c.data().data(), c.data().size());
      got += static_cast<int64_t>(c.data().size());
    }
    return r->Finish().ok() && got == bytes;
  };
  const grpc::Slice dreq_slice(dreq.SerializeAsString());
  const grpc::ByteBuffer dreq_buffer(&dreq_slice, 1);
  auto download_raw = [&] {
    grpc::ClientContext ctx;
    client::RawStream r(&raw_stub, &ctx, "/dfa.v1.Worker/Download", /*cork_metadata=*/true);
    (void)r.WriteLast(dreq_buffer);
    grpc::ByteBuffer b;
    ChunkFrame f;
    int64_t got = 0;
    while (r.Read(&b)) {
      if (!f.ParseTensorChunk(b).ok()) return false;
      const WireChunk& c = f.chunk();
      if (c.DataCrc32c() != c.crc32c) return false;
      c.CopyDataTo(back.data() + c.row_begin * kRowBytes);
      got += c.data_size;
    }
    return r.Finish().ok() && got == bytes;
  };
  // One segment for every shm transfer (as a client keeps it), made by the worker
  // (CreateSharedMemory) and mapped here through its path, pre-faulted.
  v1::CreateSharedMemoryResponse segment;
  {
    grpc::ClientContext ctx;
    v1::CreateSharedMemoryRequest c;
    c.set_session_id(kSession);
    c.set_client_id(kClient);
    c.set_bytes(bytes);
    if (!stub->CreateSharedMemory(&ctx, c, &segment).ok()) return 1;
  }
  const std::string shm_name = segment.shm_name();
  const int fd = ::open(segment.path().c_str(), O_RDWR);
  if (fd < 0) return 1;
  auto* seg = static_cast<uint8_t*>(mmap(nullptr, static_cast<size_t>(bytes),
                                         PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0));
  close(fd);
  auto shm = [&](bool upload) {
    if (upload) std::memcpy(seg, tensor.data(), tensor.size());
    grpc::ClientContext ctx;
    v1::SharedMemoryTransferRequest q;
    q.set_session_id(kSession);
    q.set_client_id(kClient);
    q.set_kind(v1::TENSOR_Q);
    q.set_shm_name(shm_name);
    q.mutable_rows()->set_begin(0);
    q.mutable_rows()->set_end(rows);
    q.set_upload(upload);
    v1::SharedMemoryTransferResponse resp;
    if (!stub->SharedMemoryTransfer(&ctx, q, &resp).ok()) return false;
    if (!upload) std::memcpy(back.data(), seg, back.size());
    return resp.bytes() == bytes;
  };

  Print("upload   gRPC proto, 1 stream", Measure(repeats, bytes, upload_proto), mc.best_gbps);
  Print("upload   gRPC raw, 1 stream", Measure(repeats, bytes, upload_raw), mc.best_gbps);
  Print("upload   shm (client copy + worker copy)",
        Measure(repeats, bytes, [&] { return shm(true); }), mc.best_gbps);
  Print("download gRPC proto, 1 stream", Measure(repeats, bytes, download_proto), mc.best_gbps);
  std::fill(back.begin(), back.end(), 0);
  Print("download gRPC raw, 1 stream", Measure(repeats, bytes, download_raw), mc.best_gbps);
  const bool same = std::memcmp(back.data(), tensor.data(), back.size()) == 0;
  Print("download shm (worker copy + client copy)",
        Measure(repeats, bytes, [&] { return shm(false); }), mc.best_gbps);
  munmap(seg, static_cast<size_t>(bytes));
  std::printf("round trip %s\n", same ? "exact" : "DIFFERS");
  (*daemon)->Shutdown();
  return same ? 0 : 1;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) { return dfa::Main(argc, argv); }
