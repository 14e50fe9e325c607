#include "worker/worker_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/rpc_outcome.h"
#include "worker/tensor_io.h"
#ifdef DFA_HAVE_NCCL
#include "worker/gpu/device_transfer.h"
#endif

namespace dfa {

WorkerServiceImpl::WorkerServiceImpl(SessionRegistry* sessions, JobRunner* jobs,
                                     MemoryBudget* budget, WorkerMetrics* metrics)
    : sessions_(sessions), jobs_(jobs), budget_(budget), metrics_(metrics) {}

grpc::Status WorkerServiceImpl::Finish(const char* method, const absl::Status& st) {
  return AnswerRpc(metrics_.load(), method, st);
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

grpc::ServerReadReactor<grpc::ByteBuffer>* WorkerServiceImpl::Upload(grpc::CallbackServerContext*,
                                                                     grpc::ByteBuffer* response) {
  return NewUploadReactor(DataPlaneState{sessions_, &metrics_}, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerServiceImpl::Download(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* request) {
  return NewDownloadReactor(DataPlaneState{sessions_, &metrics_}, *request);
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
      m->AddClientBytes(req->upload() ? "upload" : "download", "shm", static_cast<double>(bytes));
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
