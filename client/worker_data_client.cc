#include "client/worker_data_client.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_util.h"

namespace dfa::client {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

}  // namespace

WorkerDataClient::WorkerDataClient(std::shared_ptr<grpc::Channel> channel, std::string address,
                                   std::string session_id, std::string client_id,
                                   absl::Duration timeout)
    : stub_(v1::Worker::NewStub(channel)),
      address_(std::move(address)),
      session_id_(std::move(session_id)),
      client_id_(std::move(client_id)),
      timeout_(timeout) {}

absl::StatusOr<TransferStats> WorkerDataClient::UploadGrpc(v1::TensorKind kind, const HostTensor& t,
                                                           std::span<const v1::RowRange> ranges,
                                                           int64_t chunk_bytes,
                                                           const ProgressFn& progress) {
  const absl::Time start = absl::Now();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_);
  v1::UploadResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer(stub_->Upload(&ctx, &response));
  TransferStats stats;
  v1::UploadRequest request;
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  bool stream_broken = false;
  absl::Status emit_status = ForEachChunk(t, kind, ranges, chunk_bytes, [&](v1::TensorChunk& c) {
    request.mutable_chunk()->Swap(&c);
    const int64_t n = static_cast<int64_t>(request.chunk().data().size());
    if (!writer->Write(request)) {
      stream_broken = true;  // the worker closed the stream: Finish() says why
      return absl::AbortedError("stream closed");
    }
    request.clear_session_id();
    request.clear_client_id();
    stats.bytes += n;
    ++stats.chunks;
    if (progress) progress(n);
    return absl::OkStatus();
  });
  if (!emit_status.ok() && !stream_broken) {
    ctx.TryCancel();
    return emit_status;
  }
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), absl::StrCat("worker ", address_, " Upload ",
                                                          TensorKindName(kind))));
  if (response.bytes_received() != stats.bytes) {
    return absl::InternalError(absl::StrCat("worker ", address_, " Upload ", TensorKindName(kind),
                                            ": acknowledged ", response.bytes_received(),
                                            " bytes of ", stats.bytes, " sent"));
  }
  stats.seconds = SecondsSince(start);
  return stats;
}

absl::StatusOr<TransferStats> WorkerDataClient::DownloadGrpc(v1::TensorKind kind,
                                                             std::span<const v1::RowRange> ranges,
                                                             int64_t chunk_bytes, HostTensor* t,
                                                             const ProgressFn& progress) {
  const absl::Time start = absl::Now();
  TransferStats stats;
  const std::string context = absl::StrCat("worker ", address_, " Download ", TensorKindName(kind));
  for (const v1::RowRange& range : ranges) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout_);
    v1::DownloadRequest request;
    request.set_session_id(session_id_);
    request.set_client_id(client_id_);
    request.set_kind(kind);
    *request.mutable_rows() = range;
    request.set_chunk_bytes(static_cast<int32_t>(std::min<int64_t>(chunk_bytes, 32 << 20)));
    std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader(stub_->Download(&ctx, request));
    // Every (batch, row) of the range must arrive exactly once.
    const int64_t n = range.end() - range.begin();
    std::vector<bool> seen(static_cast<size_t>(n * t->batch), false);
    int64_t rows_seen = 0;
    v1::TensorChunk chunk;
    absl::Status apply_status;
    while (reader->Read(&chunk)) {
      auto applied = ApplyChunk(chunk, kind, std::span<const v1::RowRange>(&range, 1), t);
      if (!applied.ok()) {
        apply_status = absl::Status(applied.status().code(),
                                    absl::StrCat(context, ": ", applied.status().message()));
        ctx.TryCancel();
        break;
      }
      for (int64_t r = chunk.rows().begin(); r < chunk.rows().end(); ++r) {
        const size_t idx = static_cast<size_t>(chunk.batch_index() * n + (r - range.begin()));
        if (seen[idx]) {
          apply_status = absl::DataLossError(
              absl::StrCat(context, ": row ", r, " of batch ", chunk.batch_index(), " sent twice"));
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
    const grpc::Status finish = reader->Finish();
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

absl::StatusOr<TransferStats> WorkerDataClient::ShmTransfer(v1::TensorKind kind,
                                                            std::span<const v1::RowRange> ranges,
                                                            int64_t segment_bytes, bool upload,
                                                            HostTensor* t,
                                                            const ProgressFn& progress) {
  const absl::Time start = absl::Now();
  const int64_t per_row = int64_t{t->batch} * TransitRowBytes(*t);
  const int64_t max_rows = std::max<int64_t>(1, segment_bytes / per_row);
  const std::vector<v1::RowRange> pieces = SplitRanges(ranges, max_rows);
  int64_t largest = 0;
  for (const auto& p : pieces) largest = std::max(largest, BlockBytes(*t, p));
  TransferStats stats;
  if (largest == 0) return stats;
  if (segment_ == nullptr || segment_->size() < largest) {
    segment_.reset();
    ASSIGN_OR_RETURN(segment_, ShmSegment::Create(largest));
  }
  ShmSegment* segment = segment_.get();
  const std::string context = absl::StrCat("worker ", address_, " SharedMemoryTransfer ",
                                           TensorKindName(kind), upload ? " upload" : " download");
  for (const v1::RowRange& piece : pieces) {
    const int64_t bytes = BlockBytes(*t, piece);
    if (upload) PackBlock(*t, piece, segment->data());
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout_);
    v1::SharedMemoryTransferRequest request;
    request.set_session_id(session_id_);
    request.set_client_id(client_id_);
    request.set_kind(kind);
    request.set_shm_name(segment->name());
    *request.mutable_rows() = piece;
    request.set_upload(upload);
    v1::SharedMemoryTransferResponse response;
    RETURN_IF_ERROR(FromGrpc(stub_->SharedMemoryTransfer(&ctx, request, &response), context));
    if (response.bytes() != bytes) {
      return absl::InternalError(absl::StrCat(context, ": worker moved ", response.bytes(),
                                              " bytes, expected ", bytes));
    }
    if (!upload) UnpackBlock(segment->data(), piece, t);
    stats.bytes += bytes;
    ++stats.chunks;
    if (progress) progress(bytes);
  }
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
                                                            const ProgressFn& progress) {
  return ShmTransfer(kind, ranges, segment_bytes, /*upload=*/false, t, progress);
}

absl::Status WorkerDataClient::GenerateInputs(uint64_t seed, bool with_grad_output) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_);
  v1::GenerateInputsRequest request;
  request.set_session_id(session_id_);
  request.set_client_id(client_id_);
  request.set_seed(seed);
  request.set_with_grad_output(with_grad_output);
  v1::GenerateInputsResponse response;
  return FromGrpc(stub_->GenerateInputs(&ctx, request, &response),
                  absl::StrCat("worker ", address_, " GenerateInputs"));
}

absl::StatusOr<v1::UploadResponse> WorkerDataClient::UploadChunks(
    std::span<const v1::TensorChunk> chunks) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_);
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
