#include "client/worker_data_client.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_util.h"
#include "client/raw_stream.h"
#include "core/session_capability.h"
#include "core/wire/chunk_wire.h"
#include "core/wire/crc32c.h"

namespace dfa::client {
namespace {

const absl::Duration kGenerateInputsTimeout = absl::Minutes(10);

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// The raw streams' methods (proto/dfa/v1/worker.proto).
constexpr char kUploadMethod[] = "/dfa.v1.Worker/Upload";
constexpr char kDownloadMethod[] = "/dfa.v1.Worker/Download";

grpc::ByteBuffer Serialized(const google::protobuf::MessageLite& m) {
  const grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseInto(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* m) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return m->ParseFromString(bytes);
}

// Counts the slices gRPC still holds that point into a caller's tensor: an upload returns only
// once gRPC has let go of all of them, so the tensor may be freed right after the call.
class BorrowedSlices {
 public:
  grpc::Slice Borrow(const uint8_t* data, size_t n) {
    std::lock_guard<std::mutex> l(mu_);
    ++live_;
    return grpc::Slice(const_cast<uint8_t*>(data), n, &BorrowedSlices::Release, this);
  }
  void WaitAllReleased() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return live_ == 0; });
  }

 private:
  static void Release(void* self) {
    auto* b = static_cast<BorrowedSlices*>(self);
    std::lock_guard<std::mutex> l(b->mu_);  // notify under the lock: the waiter may free *b next
    --b->live_;
    b->cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t live_ = 0;
};

// One SharedMemoryTransfer call in flight on gRPC's callback API.
struct ShmCall {
  grpc::ClientContext ctx;
  v1::SharedMemoryTransferRequest request;
  v1::SharedMemoryTransferResponse response;
  int64_t bytes = 0;  // what the worker must report
  uint8_t* segment = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;

  void Start(v1::Worker::Stub* stub) {
    stub->async()->SharedMemoryTransfer(&ctx, &request, &response, [this](grpc::Status st) {
      std::lock_guard<std::mutex> l(mu);  // notify under the lock: the waiter frees *this next
      status = std::move(st);
      done = true;
      cv.notify_all();
    });
  }
  grpc::Status Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
    return status;
  }
};

}  // namespace

WorkerDataClient::WorkerDataClient(std::shared_ptr<grpc::Channel> channel, std::string address,
                                   std::string session_id, std::string client_id,
                                   std::string capability, absl::Duration timeout)
    : channel_(channel),
      stub_(v1::Worker::NewStub(channel)),
      raw_stub_(channel),
      address_(std::move(address)),
      session_id_(std::move(session_id)),
      client_id_(std::move(client_id)),
      capability_(std::move(capability)),
      timeout_(timeout) {}

void WorkerDataClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  SetDeadline(ctx, timeout);
  AttachCapability(ctx, capability_);
}

absl::StatusOr<TransferStats> WorkerDataClient::UploadGrpc(v1::TensorKind kind, const HostTensor& t,
                                                           std::span<const v1::RowRange> ranges,
                                                           int64_t chunk_bytes,
                                                           const ProgressFn& progress) {
  const absl::Time start = absl::Now();
  const std::string context = absl::StrCat("worker ", address_, " Upload ", TensorKindName(kind));
  TransferStats stats;
  BorrowedSlices borrowed;  // declared first: outlives the call that holds the slices
  absl::Status emit_status, finish_status;
  v1::UploadResponse response;
  bool have_response = false;
  {
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout_);
    RawStream writer(&raw_stub_, &ctx, kUploadMethod);
    bool stream_broken = false;
    const HeadSlice hs = heads(kind);
    const int64_t row_bytes = TransitRowBytes(t, hs);
    emit_status = ForEachChunkSpan(
        t, ranges, chunk_bytes,
        [&](const ChunkSpan& span) {
          const int64_t n = (span.row_end - span.row_begin) * row_bytes;
          grpc::Slice data;
          uint32_t crc;
          if (const uint8_t* rows = ContiguousRows(t, span, hs)) {
            crc = Crc32c(rows, static_cast<size_t>(n));  // the rows as they are sent
            data = borrowed.Borrow(rows, static_cast<size_t>(n));
          } else {
            uint8_t* buf;
            data = NewDataSlice(static_cast<size_t>(n), &buf);
            GatherRows(t, span, buf, hs);
            crc = Crc32c(buf, static_cast<size_t>(n));
          }
          const bool first = stats.chunks == 0;
          const std::string prefix =
              EncodeUploadPrefix(first ? session_id_ : "", first ? client_id_ : "", kind,
                                 span.row_begin, span.row_end, span.batch, crc, n);
          if (!writer.Write(FrameBuffer(prefix, std::move(data)))) {
            stream_broken = true;  // the worker closed the stream: Finish() says why
            return absl::AbortedError("stream closed");
          }
          stats.bytes += n;
          ++stats.chunks;
          if (progress) progress(n);
          return absl::OkStatus();
        },
        hs);
    if (!emit_status.ok() && !stream_broken) {
      ctx.TryCancel();
    } else {
      emit_status = absl::OkStatus();
      writer.WritesDone();
      grpc::ByteBuffer reply;  // the one UploadResponse (none when the worker refused)
      if (writer.Read(&reply)) have_response = ParseInto(reply, &response);
    }
    finish_status = FromGrpc(writer.Finish(), context);
  }
  borrowed.WaitAllReleased();
  RETURN_IF_ERROR(emit_status);
  RETURN_IF_ERROR(finish_status);
  if (!have_response) {
    return absl::InternalError(
        absl::StrCat(context, ": the worker answered OK without an UploadResponse"));
  }
  if (response.bytes_received() != stats.bytes) {
    return absl::InternalError(absl::StrCat(context, ": acknowledged ", response.bytes_received(),
                                            " bytes of ", stats.bytes, " sent"));
  }
  stats.seconds = SecondsSince(start);
  return stats;
}

absl::StatusOr<TransferStats> WorkerDataClient::DownloadGrpc(v1::TensorKind kind,
                                                             std::span<const v1::RowRange> ranges,
                                                             int64_t chunk_bytes, HostTensor* t,
                                                             const ProgressFn& progress,
                                                             const OutputAwait& await) {
  const absl::Time start = absl::Now();
  TransferStats stats;
  const std::string context = absl::StrCat("worker ", address_, " Download ", TensorKindName(kind));
  for (const v1::RowRange& range : ranges) {
    grpc::ClientContext ctx;
    v1::DownloadRequest request;
    if (await.job_id.empty()) {
      Prepare(&ctx, timeout_);
    } else {
      // Each chunk may wait up to the await timeout for its rows.
      const int64_t chunks = std::max<int64_t>(
          1, CountChunks(*t, std::span<const v1::RowRange>(&range, 1), chunk_bytes, heads(kind)));
      Prepare(&ctx, timeout_ + await.timeout * chunks);
      request.set_await_job_id(await.job_id);
      request.set_await_timeout_ms(absl::ToInt64Milliseconds(await.timeout));
    }
    request.set_session_id(session_id_);
    request.set_client_id(client_id_);
    request.set_kind(kind);
    *request.mutable_rows() = range;
    request.set_chunk_bytes(static_cast<int32_t>(std::min<int64_t>(chunk_bytes, 32 << 20)));
    // Metadata, request and half-close leave together (as a generated server-streaming call).
    RawStream reader(&raw_stub_, &ctx, kDownloadMethod, /*cork_metadata=*/true);
    (void)reader.WriteLast(Serialized(request));  // a failed call ends the reads; Finish says why
    // Every (batch, row) of the range must arrive exactly once.
    const int64_t n = range.end() - range.begin();
    std::vector<bool> seen(static_cast<size_t>(n * t->batch), false);
    int64_t rows_seen = 0;
    grpc::ByteBuffer message;
    ChunkFrame frame;  // chunk data parsed in place: copied once, into `t`
    absl::Status apply_status;
    while (reader.Read(&message)) {
      if (absl::Status st = frame.ParseTensorChunk(message); !st.ok()) {
        apply_status = absl::Status(st.code(), absl::StrCat(context, ": ", st.message()));
        ctx.TryCancel();
        break;
      }
      const WireChunk& chunk = frame.chunk();
      auto applied =
          ApplyWireChunk(chunk, kind, std::span<const v1::RowRange>(&range, 1), t, heads(kind));
      if (!applied.ok()) {
        apply_status = absl::Status(applied.status().code(),
                                    absl::StrCat(context, ": ", applied.status().message()));
        ctx.TryCancel();
        break;
      }
      for (int64_t r = chunk.row_begin; r < chunk.row_end; ++r) {
        const size_t idx = static_cast<size_t>(chunk.batch_index * n + (r - range.begin()));
        if (seen[idx]) {
          apply_status = absl::DataLossError(
              absl::StrCat(context, ": row ", r, " of batch ", chunk.batch_index, " sent twice"));
          break;
        }
        seen[idx] = true;
        ++rows_seen;
      }
      if (!apply_status.ok()) {
        ctx.TryCancel();
        break;
      }
      stats.bytes += *applied;
      ++stats.chunks;
      if (progress) progress(*applied);
    }
    const grpc::Status finish = reader.Finish();
    RETURN_IF_ERROR(apply_status);
    RETURN_IF_ERROR(FromGrpc(finish, context));
    if (rows_seen != n * t->batch) {
      return absl::DataLossError(absl::StrCat(context, ": received ", rows_seen, " of ",
                                              n * t->batch, " (batch, row) pairs of rows [",
                                              range.begin(), ", ", range.end(), ")"));
    }
  }
  stats.seconds = SecondsSince(start);
  return stats;
}

absl::Status WorkerDataClient::EnsureSegments(bool upload, int n, int64_t bytes) {
  std::unique_ptr<ShmSegment>* segments = segments_[upload ? 1 : 0];
  for (int i = 0; i < n; ++i) {
    if (segments[i] == nullptr || segments[i]->size() < bytes) {
      segments[i].reset();
      // The worker makes and owns the segment (a sealed memfd); this process maps it.
      grpc::ClientContext ctx;
      Prepare(&ctx, timeout_);
      v1::CreateSharedMemoryRequest req;
      req.set_session_id(session_id_);
      req.set_client_id(client_id_);
      req.set_bytes(bytes);
      ASSIGN_OR_RETURN(segments[i], ShmSegment::Create(stub_.get(), &ctx, req));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferStats> WorkerDataClient::ShmTransfer(
    v1::TensorKind kind, std::span<const v1::RowRange> ranges, int64_t segment_bytes, bool upload,
    HostTensor* t, const ProgressFn& progress, const OutputAwait& await) {
  const absl::Time start = absl::Now();
  const HeadSlice hs = heads(kind);
  const int64_t per_row = int64_t{t->batch} * TransitRowBytes(*t, hs);
  const int64_t piece_bytes = std::min(kMaxShmPieceBytes, segment_bytes / 2);
  const int64_t max_rows = std::max<int64_t>(1, piece_bytes / per_row);
  const std::vector<v1::RowRange> pieces = SplitRanges(ranges, max_rows);
  int64_t largest = 0;
  for (const auto& p : pieces) largest = std::max(largest, BlockBytes(*t, p, hs));
  TransferStats stats;
  if (largest == 0) return stats;
  const int depth = pieces.size() > 1 ? 2 : 1;  // calls in flight = segments in use
  RETURN_IF_ERROR(EnsureSegments(upload, depth, largest));
  const std::string context = absl::StrCat("worker ", address_, " SharedMemoryTransfer ",
                                           TensorKindName(kind), upload ? " upload" : " download");
  std::deque<std::unique_ptr<ShmCall>> in_flight;  // oldest first
  size_t next = 0;                                 // next piece to start
  auto start_next = [&] {
    const v1::RowRange& piece = pieces[next];
    ShmSegment* segment = segments_[upload ? 1 : 0][next % depth].get();
    auto call = std::make_unique<ShmCall>();
    call->bytes = BlockBytes(*t, piece, hs);
    call->segment = segment->data();
    if (upload) PackBlock(*t, piece, segment->data(), hs);
    v1::SharedMemoryTransferRequest& r = call->request;
    if (!upload && !await.job_id.empty()) {
      Prepare(&call->ctx, timeout_ + await.timeout);
      r.set_await_job_id(await.job_id);
      r.set_await_timeout_ms(absl::ToInt64Milliseconds(await.timeout));
    } else {
      Prepare(&call->ctx, timeout_);
    }
    r.set_session_id(session_id_);
    r.set_client_id(client_id_);
    r.set_kind(kind);
    r.set_shm_name(segment->name());
    *r.mutable_rows() = piece;
    r.set_upload(upload);
    r.set_keep_mapping(true);  // the segments live as long as this object (the session)
    call->Start(stub_.get());
    in_flight.push_back(std::move(call));
    ++next;
  };
  // Completes the oldest call (and unpacks its piece on download).
  auto finish_oldest = [&]() -> absl::Status {
    std::unique_ptr<ShmCall> call = std::move(in_flight.front());
    in_flight.pop_front();
    RETURN_IF_ERROR(FromGrpc(call->Wait(), context));
    if (call->response.bytes() != call->bytes) {
      return absl::InternalError(absl::StrCat(context, ": worker moved ", call->response.bytes(),
                                              " bytes, expected ", call->bytes));
    }
    if (!upload) UnpackBlock(call->segment, call->request.rows(), t, hs);
    stats.bytes += call->bytes;
    ++stats.chunks;
    if (progress) progress(call->bytes);
    return absl::OkStatus();
  };
  absl::Status status;
  // Upload: pack i+1 while the worker copies i. Download: unpack i while the worker writes i+1.
  while (status.ok() && (next < pieces.size() || !in_flight.empty())) {
    if (next < pieces.size() && in_flight.size() < static_cast<size_t>(depth)) {
      start_next();
    } else {
      status = finish_oldest();
    }
  }
  for (auto& call : in_flight) (void)call->Wait();  // after an error: let the calls end
  RETURN_IF_ERROR(status);
  stats.seconds = SecondsSince(start);
  return stats;
}

absl::StatusOr<TransferStats> WorkerDataClient::UploadShm(v1::TensorKind kind, const HostTensor& t,
                                                          std::span<const v1::RowRange> ranges,
                                                          int64_t segment_bytes,
                                                          const ProgressFn& progress) {
  // Upload only reads `t` (PackBlock).
  return ShmTransfer(kind, ranges, segment_bytes, /*upload=*/true, const_cast<HostTensor*>(&t),
                     progress);
}

absl::StatusOr<TransferStats> WorkerDataClient::DownloadShm(v1::TensorKind kind,
                                                            std::span<const v1::RowRange> ranges,
                                                            int64_t segment_bytes, HostTensor* t,
                                                            const ProgressFn& progress,
                                                            const OutputAwait& await) {
  return ShmTransfer(kind, ranges, segment_bytes, /*upload=*/false, t, progress, await);
}

absl::Status WorkerDataClient::GenerateInputs(uint64_t seed, bool with_grad_output) {
  grpc::ClientContext ctx;
  // The worker fills its whole shard (GiBs for long sequences): longer than a control call.
  Prepare(&ctx, std::max(timeout_, kGenerateInputsTimeout));
  v1::GenerateInputsRequest request;
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  request.set_seed(seed);
  request.set_with_grad_output(with_grad_output);
  v1::GenerateInputsResponse response;
  return FromGrpc(stub_->GenerateInputs(&ctx, request, &response),
                  absl::StrCat("worker ", address_, " GenerateInputs"));
}

absl::StatusOr<int64_t> WorkerDataClient::DeviceTransfer(v1::DeviceTransferRequest request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_);
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  v1::DeviceTransferResponse response;
  RETURN_IF_ERROR(FromGrpc(stub_->DeviceTransfer(&ctx, request, &response),
                           absl::StrCat("worker ", address_, " DeviceTransfer")));
  return response.bytes();
}

absl::StatusOr<int64_t> WorkerDataClient::ClientGroupTransfer(
    v1::ClientGroupTransferRequest request, const std::string& group_secret) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_ + absl::Milliseconds(request.timeout_ms()));
  ctx.AddMetadata(kClientGroupSecretMetadata, group_secret);
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  v1::ClientGroupTransferResponse response;
  RETURN_IF_ERROR(FromGrpc(stub_->ClientGroupTransfer(&ctx, request, &response),
                           absl::StrCat("worker ", address_, " ClientGroupTransfer")));
  return response.bytes();
}

absl::StatusOr<int64_t> WorkerDataClient::BindDeviceTensors(
    v1::BindDeviceTensorsRequest request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_);
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  v1::BindDeviceTensorsResponse response;
  RETURN_IF_ERROR(FromGrpc(stub_->BindDeviceTensors(&ctx, request, &response),
                           absl::StrCat("worker ", address_, " BindDeviceTensors")));
  return response.bytes_per_job();
}

absl::StatusOr<v1::UploadResponse> WorkerDataClient::UploadChunks(
    std::span<const v1::TensorChunk> chunks) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_);
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer(stub_->Upload(&ctx, &response));
  bool first = true;
  for (const auto& c : chunks) {
    v1::UploadRequest request;
    if (first) {
      request.set_session_id(session_id_);
      request.set_client_id(client_id_);
      first = false;
    }
    *request.mutable_chunk() = c;
    if (!writer->Write(request)) break;
  }
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), absl::StrCat("worker ", address_, " Upload")));
  return response;
}

}  // namespace dfa::client
