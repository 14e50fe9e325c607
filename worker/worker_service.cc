#include "worker/worker_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/method_handler.h"
#include "worker/chunk_wire.h"
#include "worker/crc32c.h"
#include "worker/tensor_io.h"
#ifdef DFA_HAVE_NCCL
#include "worker/gpu/device_transfer.h"
#endif

namespace dfa {
namespace {

constexpr int64_t kDefaultChunkBytes = 4 << 20;
constexpr int64_t kMaxChunkBytes = 32 << 20;
constexpr int kUploadMethodIndex = 4;    // rpc order in proto/dfa/v1/worker.proto
constexpr int kDownloadMethodIndex = 5;

const char* CodeName(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kCancelled: return "CANCELLED";
    case absl::StatusCode::kUnknown: return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted: return "ABORTED";
    case absl::StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal: return "INTERNAL";
    case absl::StatusCode::kUnavailable: return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss: return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    default: return "OK";
  }
}

// A session's data may not change under a running job.
absl::Status CheckIdle(const WorkerSession& s) {
  if (!s.job_running) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "session_id = '", s.id, "' is running job '", s.running_job_id, "'; try again after it"));
}

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(SessionRegistry* sessions, JobRunner* jobs,
                                     MemoryBudget* budget, WorkerMetrics* metrics)
    : sessions_(sessions), jobs_(jobs), budget_(budget), metrics_(metrics) {
  // Method indices follow the rpc order in worker.proto (Upload is the 5th, Download the 6th).
  // Download becomes a bidi handler that reads its one request itself: on the wire a
  // server-streaming call and a bidi call with one request are the same.
  MarkMethodStreamed(
      kUploadMethodIndex,
      new grpc::internal::ClientStreamingHandler<WorkerServiceImpl, grpc::ByteBuffer,
                                                 v1::UploadResponse>(
          [](WorkerServiceImpl* self, grpc::ServerContext* ctx,
             grpc::ServerReader<grpc::ByteBuffer>* reader, v1::UploadResponse* resp) {
            return self->RawUpload(ctx, reader, resp);
          },
          this));
  MarkMethodStreamed(
      kDownloadMethodIndex,
      new grpc::internal::BidiStreamingHandler<WorkerServiceImpl, v1::DownloadRequest,
                                               grpc::ByteBuffer>(
          [](WorkerServiceImpl* self, grpc::ServerContext* ctx,
             grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownloadRequest>* stream) {
            return self->RawDownload(ctx, stream);
          },
          this));
}

grpc::Status WorkerServiceImpl::Finish(const char* method, const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  if (WorkerMetrics* m = metrics_.load()) m->CountGrpcError(method, CodeName(st.code()));
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

void WorkerServiceImpl::UpdateGauges() {
  WorkerMetrics* m = metrics_.load();
  if (!m) return;
  m->SetSessions(sessions_->count());
  m->SetMemory(static_cast<double>(budget_->used()), static_cast<double>(budget_->limit()));
}

grpc::Status WorkerServiceImpl::OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest* req,
                                            v1::OpenSessionResponse* resp) {
  absl::StatusOr<v1::OpenSessionResponse> r = sessions_->Open(*req);
  if (r.ok()) *resp = *std::move(r);
  UpdateGauges();
  return Finish("OpenSession", r.status());
}

grpc::Status WorkerServiceImpl::RunJob(grpc::ServerContext* ctx, const v1::RunJobRequest* req,
                                       v1::WorkerJobStats* resp) {
  absl::StatusOr<v1::WorkerJobStats> r = jobs_->Run(*req, [ctx] { return ctx->IsCancelled(); });
  if (r.ok()) *resp = *std::move(r);
  return Finish("RunJob", r.status());
}

grpc::Status WorkerServiceImpl::CancelJob(grpc::ServerContext*,
                                          const v1::CancelWorkerJobRequest* req,
                                          v1::CancelWorkerJobResponse*) {
  return Finish("CancelJob", jobs_->Cancel(req->job_id()));
}

grpc::Status WorkerServiceImpl::CloseSession(grpc::ServerContext*,
                                             const v1::CloseSessionRequest* req,
                                             v1::CloseSessionResponse*) {
  absl::Status st = sessions_->Close(req->session_id());
  UpdateGauges();
  return Finish("CloseSession", st);
}

absl::Status WorkerServiceImpl::DoUpload(grpc::ServerReader<grpc::ByteBuffer>* reader,
                                         v1::UploadResponse* resp) {
  grpc::ByteBuffer buffer;
  ChunkFrame frame;
  std::shared_ptr<WorkerSession> s;
  int64_t bytes = 0;
  int32_t chunks = 0;
  while (reader->Read(&buffer)) {
    RETURN_IF_ERROR(frame.ParseUploadRequest(buffer));
    if (s == nullptr) {
      if (frame.session_id().empty()) {
        return absl::InvalidArgumentError("session_id must be set on the first message");
      }
      ASSIGN_OR_RETURN(s, sessions_->Find(frame.session_id(), frame.client_id(), true));
    } else if (!frame.session_id().empty() && frame.session_id() != s->id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session_id = '", frame.session_id(), "' differs from the stream's '", s->id, "'"));
    }
    if (!frame.has_chunk()) {
      if (chunks == 0) continue;  // a header-only first message is fine
      return absl::InvalidArgumentError(absl::StrCat("chunk is missing in message ", chunks));
    }
    const WireChunk& c = frame.chunk();
    const uint32_t crc = c.DataCrc32c();
    if (crc != c.crc32c) {
      return absl::DataLossError(absl::StrCat(
          "chunk.crc32c = ", c.crc32c, " does not match the data (", crc, ") of chunk ", chunks,
          " (", v1::TensorKind_Name(c.kind), " rows [", c.row_begin, ", ", c.row_end,
          ") batch ", c.batch_index, ")"));
    }
    {
      std::lock_guard<std::mutex> l(s->mu);
      RETURN_IF_ERROR(CheckIdle(*s));
      RETURN_IF_ERROR(WriteWireChunk(s.get(), c));
    }
    bytes += c.data_size;
    ++chunks;
    if (WorkerMetrics* m = metrics_.load()) {
      m->AddClientBytes("upload", "grpc", static_cast<double>(c.data_size));
    }
  }
  if (s == nullptr) return absl::InvalidArgumentError("empty upload stream (no session_id)");
  resp->set_bytes_received(bytes);
  resp->set_chunks_received(chunks);
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::RawUpload(grpc::ServerContext*,
                                          grpc::ServerReader<grpc::ByteBuffer>* reader,
                                          v1::UploadResponse* resp) {
  return Finish("Upload", DoUpload(reader, resp));
}

absl::Status WorkerServiceImpl::DoDownload(
    grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownloadRequest>* stream) {
  v1::DownloadRequest req;
  if (!stream->Read(&req)) return absl::InvalidArgumentError("no DownloadRequest was sent");
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                   sessions_->Find(req.session_id(), req.client_id(), true));
  if (req.chunk_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes = ", req.chunk_bytes(), " must be >= 0 (0: default)"));
  }
  std::vector<RowRange> pieces;
  {
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckIdle(*s));
    RETURN_IF_ERROR(CheckReadable(*s, req.kind()));
    ASSIGN_OR_RETURN(pieces, ResolveRows(*s, req.rows(), "rows"));
  }
  const int64_t chunk_bytes =
      std::min(kMaxChunkBytes, req.chunk_bytes() > 0 ? int64_t{req.chunk_bytes()}
                                                     : kDefaultChunkBytes);
  const int64_t row_bytes = TransitRowBytes(*s, req.kind());
  if (row_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind = ", v1::TensorKind_Name(req.kind()), ": one row is ", row_bytes,
        " bytes, more than a chunk may carry (", kMaxChunkBytes, "); use shared memory"));
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / row_bytes);
  for (const RowRange& piece : pieces) {
    for (int b = 0; b < s->spec.batch(); ++b) {
      for (int64_t r0 = piece.begin; r0 < piece.end; r0 += rows_per_chunk) {
        const RowRange r{r0, std::min(piece.end, r0 + rows_per_chunk)};
        const int64_t n = r.size() * row_bytes;
        // Storage -> the slice gRPC sends, in one pass (converting fp32 gradients).
        uint8_t* data = nullptr;
        grpc::Slice slice = NewDataSlice(static_cast<size_t>(n), &data);
        {
          std::lock_guard<std::mutex> l(s->mu);
          RETURN_IF_ERROR(CheckIdle(*s));
          RETURN_IF_ERROR(CheckReadable(*s, req.kind()));
          RETURN_IF_ERROR(ReadRowsTo(s.get(), req.kind(), b, r, data));
        }
        const uint32_t crc = Crc32c(data, static_cast<size_t>(n));
        const grpc::ByteBuffer message = FrameBuffer(
            EncodeChunkPrefix(req.kind(), r.begin, r.end, b, crc, n), std::move(slice));
        if (!stream->Write(message)) {
          return absl::CancelledError("client went away during Download");
        }
        if (WorkerMetrics* m = metrics_.load()) {
          m->AddClientBytes("download", "grpc", static_cast<double>(n));
        }
      }
    }
  }
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::RawDownload(
    grpc::ServerContext*, grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownloadRequest>* stream) {
  return Finish("Download", DoDownload(stream));
}

grpc::Status WorkerServiceImpl::GenerateInputs(grpc::ServerContext*,
                                               const v1::GenerateInputsRequest* req,
                                               v1::GenerateInputsResponse*) {
  absl::Status st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->Find(req->session_id(), req->client_id(), true));
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckIdle(*s));
    return GenerateSynthetic(s.get(), req->seed(), req->with_grad_output());
  }();
  return Finish("GenerateInputs", st);
}

absl::Status WorkerServiceImpl::DoShm(const v1::SharedMemoryTransferRequest& req, int64_t* bytes) {
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                   sessions_->Find(req.session_id(), req.client_id(), true));
  const std::string& name = req.shm_name();
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_name = '", name, "' must be '/' followed by 1 to 254 characters without '/'"));
  }
  if (req.rows().begin() == 0 && req.rows().end() == 0) {
    return absl::InvalidArgumentError("rows must be set (a range inside one owned range)");
  }
  const RowRange rows{req.rows().begin(), req.rows().end()};
  {
    std::lock_guard<std::mutex> l(s->mu);
    ASSIGN_OR_RETURN(std::vector<RowRange> pieces, ResolveRows(*s, req.rows(), "rows"));
    if (pieces.size() != 1) {
      return absl::OutOfRangeError(absl::StrCat("rows = [", rows.begin, ", ", rows.end,
                                                ") spans several owned ranges; send one each"));
    }
  }
  if (!req.upload()) {
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckReadable(*s, req.kind()));
  } else if (req.kind() < v1::TENSOR_Q || req.kind() > v1::TENSOR_DV) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind = ", static_cast<int>(req.kind()), " is not a tensor kind"));
  }
  const int64_t need = rows.size() > 0 ? BlockBytes(*s, req.kind(), rows) : 0;
  // Kept mappings live in the session (dropped with it); others only for this call.
  std::shared_ptr<ShmMapping> m;
  if (need > 0) {
    ASSIGN_OR_RETURN(m, req.keep_mapping() ? s->shm_mappings.Get(name, need)
                                           : MapForCall(name, need, !req.upload()));
  }
  std::lock_guard<std::mutex> l(s->mu);
  RETURN_IF_ERROR(CheckIdle(*s));
  if (req.upload()) {
    RETURN_IF_ERROR(WriteBlock(s.get(), req.kind(), rows, m ? m->addr : nullptr));
  } else {
    RETURN_IF_ERROR(ReadBlock(s.get(), req.kind(), rows, m ? m->addr : nullptr));
  }
  *bytes = need;
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::SharedMemoryTransfer(grpc::ServerContext*,
                                                     const v1::SharedMemoryTransferRequest* req,
                                                     v1::SharedMemoryTransferResponse* resp) {
  int64_t bytes = 0;
  absl::Status st = DoShm(*req, &bytes);
  if (st.ok()) {
    resp->set_bytes(bytes);
    if (WorkerMetrics* m = metrics_.load()) {
      m->AddClientBytes(req->upload() ? "upload" : "download", "shm",
                               static_cast<double>(bytes));
    }
  }
  return Finish("SharedMemoryTransfer", st);
}

grpc::Status WorkerServiceImpl::DeviceTransfer(grpc::ServerContext*,
                                               const v1::DeviceTransferRequest* req,
                                               v1::DeviceTransferResponse* resp) {
  absl::StatusOr<int64_t> bytes = [&]() -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->Find(req->session_id(), req->client_id(), true));
#ifdef DFA_HAVE_NCCL
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckIdle(*s));
    return RunDeviceTransfer(s.get(), *req);
#else
    return absl::FailedPreconditionError(
        "this worker was built without CUDA: CUDA IPC transfers need a cuda worker; use "
        "SharedMemoryTransfer or Upload/Download");
#endif
  }();
  if (bytes.ok()) {
    resp->set_bytes(*bytes);
    if (WorkerMetrics* m = metrics_.load()) {
      m->AddClientBytes(req->upload() ? "upload" : "download", "cuda_ipc",
                        static_cast<double>(*bytes));
    }
  }
  return Finish("DeviceTransfer", bytes.status());
}

}  // namespace dfa
