#include "worker/worker_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/session_capability.h"
#include "worker/rpc_outcome.h"
#include "worker/session_output_gate.h"
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
  // DFA_TRACE_OPS=1: the handler's own steps before the job runner (host clock).
  const absl::Time entered = absl::Now();
  absl::Time found = entered, locked = entered, bound = entered;
  absl::StatusOr<v1::WorkerJobStats> r = [&]() -> absl::StatusOr<v1::WorkerJobStats> {
    // An empty id is JobRunner's to refuse (INVALID_ARGUMENT naming it).
    std::shared_ptr<WorkerSession> s;
    if (!req->session_id().empty()) {
      ASSIGN_OR_RETURN(s,
                       sessions_->FindForCoordinator(req->session_id(), PresentedCapability(*ctx)));
    }
    found = locked = bound = absl::Now();
#ifdef DFA_HAVE_NCCL
    // The session's bound CUDA IPC inputs are copied in as the job starts, its bound outputs
    // written out before this reply (Worker.BindDeviceTensors).
    BoundTransferStats in, out;
    if (s != nullptr) {
      std::lock_guard<std::mutex> l(s->mu);
      locked = absl::Now();
      if (!s->job_running) RETURN_IF_ERROR(RunBoundTransfers(s.get(), req->kind(), true, &in));
      bound = absl::Now();
    }
    ASSIGN_OR_RETURN(v1::WorkerJobStats stats,
                     jobs_->Run(*req, [ctx] { return ctx->IsCancelled(); }));
    if (s != nullptr) {
      std::lock_guard<std::mutex> l(s->mu);
      RETURN_IF_ERROR(RunBoundTransfers(s.get(), req->kind(), false, &out));
    }
    if (in.bytes + out.bytes > 0) {
      stats.set_device_transfer_seconds(in.seconds + out.seconds);
      stats.set_device_transfer_bytes(in.bytes + out.bytes);
      if (WorkerMetrics* m = metrics_.load()) {
        m->AddClientBytes("upload", "cuda_ipc", static_cast<double>(in.bytes));
        m->AddClientBytes("download", "cuda_ipc", static_cast<double>(out.bytes));
      }
    }
    return stats;
#else
    return jobs_->Run(*req, [ctx] { return ctx->IsCancelled(); });
#endif
  }();
  if (trace_) {
    absl::FPrintF(stderr,
                  "rpc trace %s: handler at %d us, find %.3f ms, session lock %.3f ms, bound "
                  "inputs %.3f ms, whole rpc %.3f ms\n",
                  req->job_id(), absl::ToUnixMicros(entered),
                  absl::ToDoubleMilliseconds(found - entered),
                  absl::ToDoubleMilliseconds(locked - found),
                  absl::ToDoubleMilliseconds(bound - locked),
                  absl::ToDoubleMilliseconds(absl::Now() - entered));
  }
  // A session closed while this job ran frees its memory only now, when the job lets go of it.
  UpdateGauges();
  if (r.ok()) *resp = *std::move(r);
  return Finish("RunJob", r.status());
}

grpc::Status WorkerServiceImpl::CancelJob(grpc::ServerContext*,
                                          const v1::CancelWorkerJobRequest* req,
                                          v1::CancelWorkerJobResponse*) {
  return Finish("CancelJob", jobs_->Cancel(req->job_id()));
}

grpc::Status WorkerServiceImpl::CloseSession(grpc::ServerContext* ctx,
                                             const v1::CloseSessionRequest* req,
                                             v1::CloseSessionResponse*) {
  absl::Status st =
      sessions_->FindForCoordinator(req->session_id(), PresentedCapability(*ctx)).status();
  if (st.ok()) st = sessions_->Close(req->session_id());
  UpdateGauges();
  return Finish("CloseSession", st);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* WorkerServiceImpl::Upload(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  std::unique_ptr<StreamLimits::Ticket> ticket;
  if (streams_ != nullptr) {
    auto t = streams_->Open(ctx, "Upload");
    if (!t.ok()) {
      return new RefusedStream<grpc::ServerReadReactor<grpc::ByteBuffer>>(
          Finish("Upload", t.status()));
    }
    ticket = *std::move(t);
  }
  return NewUploadReactor(DataPlaneState{sessions_, &metrics_, jobs_->step_timeout()},
                          PresentedCapability(*ctx), response, std::move(ticket));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerServiceImpl::Download(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  std::unique_ptr<StreamLimits::Ticket> ticket;
  if (streams_ != nullptr) {
    auto t = streams_->Open(ctx, "Download");
    if (!t.ok()) {
      return new RefusedStream<grpc::ServerWriteReactor<grpc::ByteBuffer>>(
          Finish("Download", t.status()));
    }
    ticket = *std::move(t);
  }
  return NewDownloadReactor(DataPlaneState{sessions_, &metrics_, jobs_->step_timeout()},
                            PresentedCapability(*ctx), *request, std::move(ticket));
}

grpc::Status WorkerServiceImpl::GenerateInputs(grpc::ServerContext* ctx,
                                               const v1::GenerateInputsRequest* req,
                                               v1::GenerateInputsResponse*) {
  const absl::Time entered = absl::Now();
  absl::Status st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForClient(req->session_id(), req->client_id(),
                                              PresentedCapability(*ctx)));
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckIdle(*s));
    return GenerateSynthetic(s.get(), req->seed(), req->with_grad_output());
  }();
  if (trace_) {
    absl::FPrintF(stderr, "rpc trace GenerateInputs: handler at %d us, whole rpc %.3f ms\n",
                  absl::ToUnixMicros(entered), absl::ToDoubleMilliseconds(absl::Now() - entered));
  }
  return Finish("GenerateInputs", st);
}

absl::Status WorkerServiceImpl::DoShm(const v1::SharedMemoryTransferRequest& req,
                                      const std::string& capability,
                                      const std::function<bool()>& gone, int64_t* bytes) {
  ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                   sessions_->FindForClient(req.session_id(), req.client_id(), capability));
  const std::string& name = req.shm_name();
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "shm_name must be set: a segment of the session (CreateSharedMemoryResponse.shm_name)");
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
  const std::string& await = req.upload() ? std::string() : req.await_job_id();
  ASSIGN_OR_RETURN(const absl::Duration await_timeout,
                   AwaitTimeout(req.await_timeout_ms(), jobs_->step_timeout()));
  if (!req.upload() && await.empty()) {
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckReadable(*s, req.kind()));
  } else if (!req.upload()) {
    // The rows of a job that may still run: wait until they are final (or its error).
    RETURN_IF_ERROR(AwaitOutputRows(s.get(), await, req.kind(), rows, await_timeout, gone));
  } else {
    RETURN_IF_ERROR(session_tensors::CheckKnownKind(req.kind()));
  }
  const int64_t need = rows.size() > 0 ? BlockBytes(*s, req.kind(), rows) : 0;
  // Only segments this worker made for the session (worker/shm_mappings.h), size checked.
  std::shared_ptr<ShmMapping> m;
  if (need > 0) {
    ASSIGN_OR_RETURN(m, s->shm_mappings.Find(name, need));
  }
  std::lock_guard<std::mutex> l(s->mu);
  if (req.upload()) {
    RETURN_IF_ERROR(session_tensors::CheckUploadable(*s, req.kind()));
  } else {
    ASSIGN_OR_RETURN(const bool ready, OutputRowsReady(*s, await, req.kind(), rows));
    if (!ready) {
      return absl::InternalError(absl::StrCat("rows [", rows.begin, ", ", rows.end,
                                              ") of await_job_id = '", await,
                                              "' were final and are not any more"));
    }
  }
  if (req.upload()) {
    RETURN_IF_ERROR(WriteBlock(s.get(), req.kind(), rows, m ? m->addr : nullptr));
  } else {
    RETURN_IF_ERROR(ReadBlock(s.get(), req.kind(), rows, m ? m->addr : nullptr));
  }
  *bytes = need;
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::CreateSharedMemory(grpc::ServerContext* ctx,
                                                   const v1::CreateSharedMemoryRequest* req,
                                                   v1::CreateSharedMemoryResponse* resp) {
  absl::Status st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForClient(req->session_id(), req->client_id(),
                                              PresentedCapability(*ctx)));
    ASSIGN_OR_RETURN(ShmMappings::Created c, s->shm_mappings.Create(req->bytes(), budget_));
    resp->set_shm_name(c.name);
    resp->set_path(c.path);
    resp->set_bytes(c.bytes);
    return absl::OkStatus();
  }();
  UpdateGauges();
  return Finish("CreateSharedMemory", st);
}

grpc::Status WorkerServiceImpl::SharedMemoryTransfer(grpc::ServerContext* ctx,
                                                     const v1::SharedMemoryTransferRequest* req,
                                                     v1::SharedMemoryTransferResponse* resp) {
  int64_t bytes = 0;
  absl::Status st =
      DoShm(*req, PresentedCapability(*ctx), [ctx] { return ctx->IsCancelled(); }, &bytes);
  if (st.ok()) {
    resp->set_bytes(bytes);
    if (WorkerMetrics* m = metrics_.load()) {
      m->AddClientBytes(req->upload() ? "upload" : "download", "shm", static_cast<double>(bytes));
    }
  }
  return Finish("SharedMemoryTransfer", st);
}

grpc::Status WorkerServiceImpl::DeviceTransfer(grpc::ServerContext* ctx,
                                               const v1::DeviceTransferRequest* req,
                                               v1::DeviceTransferResponse* resp) {
  absl::StatusOr<int64_t> bytes = [&]() -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForClient(req->session_id(), req->client_id(),
                                              PresentedCapability(*ctx)));
#ifdef DFA_HAVE_NCCL
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(req->upload() ? session_tensors::CheckUploadable(*s, req->kind())
                                  : CheckIdle(*s));
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

grpc::Status WorkerServiceImpl::BindDeviceTensors(grpc::ServerContext* ctx,
                                                  const v1::BindDeviceTensorsRequest* req,
                                                  v1::BindDeviceTensorsResponse* resp) {
  absl::StatusOr<int64_t> bytes = [&]() -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForClient(req->session_id(), req->client_id(),
                                              PresentedCapability(*ctx)));
#ifdef DFA_HAVE_NCCL
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(CheckIdle(*s));
    return ::dfa::BindDeviceTensors(s.get(), *req);
#else
    return absl::FailedPreconditionError(
        "this worker was built without CUDA: CUDA IPC bindings need a cuda worker; use "
        "SharedMemoryTransfer or Upload/Download");
#endif
  }();
  if (bytes.ok()) resp->set_bytes_per_job(*bytes);
  return Finish("BindDeviceTensors", bytes.status());
}

grpc::Status WorkerServiceImpl::JoinClientGroup(grpc::ServerContext* ctx,
                                                const v1::WorkerJoinClientGroupRequest* req,
                                                v1::WorkerJoinClientGroupResponse*) {
  absl::Status st = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForCoordinator(req->session_id(), PresentedCapability(*ctx)));
    return client_groups_.Join(*s, *req);
  }();
  return Finish("JoinClientGroup", st);
}

grpc::Status WorkerServiceImpl::ClientGroupTransfer(grpc::ServerContext* ctx,
                                                    const v1::ClientGroupTransferRequest* req,
                                                    v1::ClientGroupTransferResponse* resp) {
  absl::StatusOr<int64_t> bytes = [&]() -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(std::shared_ptr<WorkerSession> s,
                     sessions_->FindForClient(req->session_id(), req->client_id(),
                                              PresentedCapability(*ctx)));
    std::string secret;
    auto it = ctx->client_metadata().find(kClientGroupSecretMetadata);
    if (it != ctx->client_metadata().end()) secret.assign(it->second.data(), it->second.size());
    std::lock_guard<std::mutex> l(s->mu);
    RETURN_IF_ERROR(req->upload() ? session_tensors::CheckUploadable(*s, req->kind())
                                  : CheckIdle(*s));
    return client_groups_.Transfer(s.get(), *req, secret);
  }();
  if (bytes.ok()) {
    resp->set_bytes(*bytes);
    if (WorkerMetrics* m = metrics_.load()) {
      m->AddClientBytes(req->upload() ? "upload" : "download", "nccl",
                        static_cast<double>(*bytes));
    }
  }
  return Finish("ClientGroupTransfer", bytes.status());
}

}  // namespace dfa
