#include "worker/data_plane_reactors.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/wire/chunk_wire.h"
#include "core/wire/crc32c.h"
#include "dfa/v1/worker.pb.h"
#include "worker/rpc_outcome.h"
#include "worker/session_output_gate.h"
#include "worker/tensor_io.h"

namespace dfa {
namespace {

constexpr int64_t kDefaultChunkBytes = 4 << 20;
constexpr int64_t kMaxChunkBytes = 32 << 20;

WorkerMetrics* Metrics(const DataPlaneState& state) {
  return state.metrics ? state.metrics->load() : nullptr;
}

class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadReactor(const DataPlaneState& state, std::string capability, grpc::ByteBuffer* response,
                std::unique_ptr<StreamLimits::Ticket> ticket)
      : state_(state),
        capability_(std::move(capability)),
        response_(response),
        ticket_(std::move(ticket)) {
    StartRead(&message_);
  }

  // One message in: apply it, then ask for the next. !ok: the client half-closed (or the call
  // ended; then the answer goes nowhere).
  void OnReadDone(bool ok) override {
    if (!ok) {
      End(Summary());
      return;
    }
    if (ticket_) ticket_->Touch();
    const absl::Status st = Apply();
    message_.Clear();
    if (!st.ok()) {
      End(st);
      return;
    }
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  // Checks and stores the message just read.
  absl::Status Apply() {
    ChunkFrame frame;  // refers to message_'s slices; released with it
    RETURN_IF_ERROR(frame.ParseUploadRequest(message_));
    if (session_ == nullptr) {
      if (frame.session_id().empty()) {
        return absl::InvalidArgumentError("session_id must be set on the first message");
      }
      if (ticket_) RETURN_IF_ERROR(ticket_->SetClient(frame.client_id()));
      ASSIGN_OR_RETURN(session_, state_.sessions->FindForClient(frame.session_id(),
                                                                frame.client_id(), capability_));
    } else if (!frame.session_id().empty() && frame.session_id() != session_->id) {
      return absl::InvalidArgumentError(absl::StrCat("session_id = '", frame.session_id(),
                                                     "' differs from the stream's '", session_->id,
                                                     "'"));
    }
    if (!frame.has_chunk()) {
      if (chunks_ == 0) return absl::OkStatus();  // a header-only first message is fine
      return absl::InvalidArgumentError(absl::StrCat("chunk is missing in message ", chunks_));
    }
    const WireChunk& c = frame.chunk();
    const uint32_t crc = c.DataCrc32c();
    if (crc != c.crc32c) {
      return absl::DataLossError(
          absl::StrCat("chunk.crc32c = ", c.crc32c, " does not match the data (", crc,
                       ") of chunk ", chunks_, " (", v1::TensorKind_Name(c.kind), " rows [",
                       c.row_begin, ", ", c.row_end, ") batch ", c.batch_index, ")"));
    }
    {
      std::lock_guard<std::mutex> l(session_->mu);
      RETURN_IF_ERROR(session_tensors::CheckUploadable(*session_, c.kind));
      RETURN_IF_ERROR(WriteWireChunk(session_.get(), c));
    }
    bytes_ += c.data_size;
    ++chunks_;
    if (WorkerMetrics* m = Metrics(state_)) {
      m->AddClientBytes("upload", "grpc", static_cast<double>(c.data_size));
    }
    return absl::OkStatus();
  }

  // The answer at the end of the stream, written into *response_ when OK.
  absl::Status Summary() {
    if (session_ == nullptr) {
      return absl::InvalidArgumentError("empty upload stream (no session_id)");
    }
    v1::UploadResponse resp;
    resp.set_bytes_received(bytes_);
    resp.set_chunks_received(chunks_);
    const grpc::Slice slice(resp.SerializeAsString());
    *response_ = grpc::ByteBuffer(&slice, 1);
    return absl::OkStatus();
  }

  void End(const absl::Status& st) { Finish(AnswerRpc(Metrics(state_), "Upload", st)); }

  const DataPlaneState state_;
  const std::string capability_;
  grpc::ByteBuffer* const response_;
  const std::unique_ptr<StreamLimits::Ticket> ticket_;  // null: not limited
  grpc::ByteBuffer message_;
  std::shared_ptr<WorkerSession> session_;
  int64_t bytes_ = 0;
  int32_t chunks_ = 0;
};

class DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(const DataPlaneState& state, const std::string& capability,
                  const grpc::ByteBuffer& request, std::unique_ptr<StreamLimits::Ticket> ticket)
      : state_(state), ticket_(std::move(ticket)) {
    const absl::Status st = Begin(request, capability);
    if (!st.ok()) {
      End(st);
      return;
    }
    WriteNext();
  }

  // The previous chunk is with gRPC: count it and send the next. !ok: the call ended.
  void OnWriteDone(bool ok) override {
    message_.Clear();
    if (!ok) {
      End(absl::CancelledError("client went away during Download"));
      return;
    }
    if (ticket_) ticket_->Touch();
    if (WorkerMetrics* m = Metrics(state_)) {
      m->AddClientBytes("download", "grpc", static_cast<double>(in_flight_bytes_));
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  // Parses and checks the request; resolves the rows to send.
  absl::Status Begin(const grpc::ByteBuffer& request, const std::string& capability) {
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (request.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    if (!req_.ParseFromString(bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request (", bytes.size(), " bytes) is not a dfa.v1.DownloadRequest"));
    }
    if (ticket_) RETURN_IF_ERROR(ticket_->SetClient(req_.client_id()));
    ASSIGN_OR_RETURN(session_, state_.sessions->FindForClient(req_.session_id(),
                                                              req_.client_id(), capability));
    if (req_.chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes = ", req_.chunk_bytes(), " must be >= 0 (0: default)"));
    }
    ASSIGN_OR_RETURN(await_timeout_, AwaitTimeout(req_.await_timeout_ms(), state_.await_timeout));
    {
      std::lock_guard<std::mutex> l(session_->mu);
      if (req_.await_job_id().empty()) {
        RETURN_IF_ERROR(CheckIdle(*session_));
        RETURN_IF_ERROR(CheckReadable(*session_, req_.kind()));
      } else {
        RETURN_IF_ERROR(session_tensors::CheckKnownKind(req_.kind()));
      }
      ASSIGN_OR_RETURN(pieces_, ResolveRows(*session_, req_.rows(), "rows"));
    }
    const int64_t chunk_bytes = std::min(
        kMaxChunkBytes, req_.chunk_bytes() > 0 ? int64_t{req_.chunk_bytes()} : kDefaultChunkBytes);
    row_bytes_ = TransitRowBytes(*session_, req_.kind());
    if (row_bytes_ > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kind = ", v1::TensorKind_Name(req_.kind()), ": one row is ", row_bytes_,
          " bytes, more than a chunk may carry (", kMaxChunkBytes, "); use shared memory"));
    }
    rows_per_chunk_ = std::max<int64_t>(1, chunk_bytes / row_bytes_);
    batches_ = session_->spec.batch();
    if (!pieces_.empty()) row_ = pieces_[0].begin;
    return absl::OkStatus();
  }

  // The next chunk's batch and rows, in the order pieces, then batches, then rows; false after
  // the last.
  bool NextChunk(int* b, RowRange* r) {
    while (piece_ < pieces_.size()) {
      const RowRange& p = pieces_[piece_];
      if (batch_ < batches_ && row_ < p.end) {
        *b = batch_;
        *r = RowRange{row_, std::min(p.end, row_ + rows_per_chunk_)};
        row_ = r->end;
        return true;
      }
      if (++batch_ < batches_) {
        row_ = p.begin;
        continue;
      }
      batch_ = 0;
      if (++piece_ < pieces_.size()) row_ = pieces_[piece_].begin;
    }
    return false;
  }

  // Fills the next chunk (storage -> the slice gRPC sends, in one pass, converting fp32
  // gradients) and starts its write; finishes OK after the last.
  void WriteNext() {
    int b = 0;
    RowRange r;
    if (!NextChunk(&b, &r)) {
      End(absl::OkStatus());
      return;
    }
    Send(b, r);
  }

  // Sends rows r of batch b, or (await_job_id: rows not final yet) waits for them first.
  void Send(int b, const RowRange& r) {
    const int64_t n = r.size() * row_bytes_;
    uint8_t* data = nullptr;
    grpc::Slice slice = NewDataSlice(static_cast<size_t>(n), &data);
    bool ready = false;
    absl::Status st = [&]() -> absl::Status {
      std::lock_guard<std::mutex> l(session_->mu);
      ASSIGN_OR_RETURN(ready, OutputRowsReady(*session_, req_.await_job_id(), req_.kind(), r));
      if (!ready) return absl::OkStatus();
      return ReadRowsTo(session_.get(), req_.kind(), b, r, data);
    }();
    if (!st.ok()) {
      End(st);
      return;
    }
    if (!ready) {
      Await(b, r);
      return;
    }
    const uint32_t crc = Crc32c(data, static_cast<size_t>(n));
    message_ =
        FrameBuffer(EncodeChunkPrefix(req_.kind(), r.begin, r.end, b, crc, n), std::move(slice));
    in_flight_bytes_ = n;
    StartWrite(&message_);
  }

  // The rows are not final yet: a thread of this call waits for them (a reaction never
  // blocks), then sends them or ends the call. No other reaction runs meanwhile: no write is in
  // flight, and the call cannot be done before Finish, which only that thread calls.
  void Await(int b, const RowRange& r) {
    std::thread([this, b, r] {
      auto gone = [this] {
        if (ticket_) ticket_->Touch();  // waiting is not idle
        return gone_.load();
      };
      const absl::Status st = AwaitOutputRows(session_.get(), req_.await_job_id(), req_.kind(), r,
                                              await_timeout_, gone);
      if (!st.ok()) {
        End(st);
        return;
      }
      Send(b, r);
    }).detach();
  }

  void OnCancel() override {
    gone_ = true;
    if (session_ != nullptr) session_->outputs_changed.notify_all();
  }

  void End(const absl::Status& st) { Finish(AnswerRpc(Metrics(state_), "Download", st)); }

  const DataPlaneState state_;
  v1::DownloadRequest req_;
  absl::Duration await_timeout_;
  std::atomic<bool> gone_{false};  // the call was cancelled (the client went away)
  std::shared_ptr<WorkerSession> session_;
  std::vector<RowRange> pieces_;
  int64_t row_bytes_ = 0;
  int64_t rows_per_chunk_ = 1;
  int batches_ = 0;
  // Where the next chunk starts.
  size_t piece_ = 0;
  int batch_ = 0;
  int64_t row_ = 0;
  grpc::ByteBuffer message_;  // the chunk being written
  int64_t in_flight_bytes_ = 0;
  const std::unique_ptr<StreamLimits::Ticket> ticket_;  // null: not limited
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadReactor(
    const DataPlaneState& state, std::string capability, grpc::ByteBuffer* response,
    std::unique_ptr<StreamLimits::Ticket> ticket) {
  return new UploadReactor(state, std::move(capability), response, std::move(ticket));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDownloadReactor(
    const DataPlaneState& state, std::string capability, const grpc::ByteBuffer& request,
    std::unique_ptr<StreamLimits::Ticket> ticket) {
  return new DownloadReactor(state, capability, request, std::move(ticket));
}

}  // namespace dfa
