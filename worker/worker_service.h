// The Worker gRPC service (proto/dfa/v1/worker.proto): session control for the coordinator and
// the client data plane (chunked upload/download with CRC32C, shared memory, synthetic inputs).
// absl::Status inside; converted to grpc::Status by AnswerRpc (worker/rpc_outcome.h), which
// counts every non-OK answer in dfa_grpc_errors_total{component="worker"}.
// Upload and Download are callback methods on raw grpc::ByteBuffers (the generated
// WithRawCallbackMethod_*; reactors in worker/data_plane_reactors.h); the other rpcs are
// synchronous. Nothing depends on the order of the rpcs in the proto.
// Session access: every rpc about an open session passes the capability the call presented
// (metadata "x-dfa-session-capability", core/session_capability.h) to the SessionRegistry's
// FindForClient (data plane) or FindForCoordinator (RunJob, CloseSession) before it does
// anything; OpenSession is how the session learns it. CancelJob names a job, not a session, and
// is not checked (job ids are unguessable; a stray cancel only ends a job CANCELLED).
// Threads: gRPC's sync server calls the synchronous handlers on its thread pool and runs the
// reactors on its callback threads; all state is in the thread-safe SessionRegistry and
// JobRunner. Nothing here owns them.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "dfa/v1/worker.grpc.pb.h"
#include "core/trace.h"
#include "worker/client_groups.h"
#include "worker/data_plane_reactors.h"
#include "worker/job_runner.h"
#include "worker/memory_budget.h"
#include "worker/session_registry.h"
#include "worker/worker_metrics.h"

namespace dfa {

// The generated service with Upload and Download replaced by their raw callback versions.
using WorkerServiceBase = v1::Worker::WithRawCallbackMethod_Upload<
    v1::Worker::WithRawCallbackMethod_Download<v1::Worker::Service>>;

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  WorkerServiceImpl(SessionRegistry* sessions, JobRunner* jobs, MemoryBudget* budget,
                    WorkerMetrics* metrics);

  // Refreshes the sessions / memory gauges (thread-safe).
  void UpdateGauges();
  // Attaches metrics (before the service is reachable; see worker_daemon.cc).
  void set_metrics(WorkerMetrics* m) { metrics_ = m; }
  // Bounds Upload and Download streams (worker/stream_limits.h; null: unbounded). Set before
  // the service is reachable.
  void set_stream_limits(StreamLimits* limits) { streams_ = limits; }

  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status RunJob(grpc::ServerContext* ctx, const v1::RunJobRequest* req,
                      v1::WorkerJobStats* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelWorkerJobRequest* req,
                         v1::CancelWorkerJobResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  // Upload (stream of UploadRequest -> UploadResponse) and Download (DownloadRequest -> stream
  // of TensorChunk), serialized messages in and out: worker/data_plane_reactors.h.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* ctx,
                                                    grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::Status GenerateInputs(grpc::ServerContext* ctx, const v1::GenerateInputsRequest* req,
                              v1::GenerateInputsResponse* resp) override;
  // Same-host segments, made by the worker (worker/shm_mappings.h).
  grpc::Status CreateSharedMemory(grpc::ServerContext* ctx,
                                  const v1::CreateSharedMemoryRequest* req,
                                  v1::CreateSharedMemoryResponse* resp) override;
  grpc::Status SharedMemoryTransfer(grpc::ServerContext* ctx,
                                    const v1::SharedMemoryTransferRequest* req,
                                    v1::SharedMemoryTransferResponse* resp) override;
  // Same-host CUDA IPC (worker/gpu/device_transfer.h); FAILED_PRECONDITION when built without
  // CUDA.
  grpc::Status DeviceTransfer(grpc::ServerContext* ctx, const v1::DeviceTransferRequest* req,
                              v1::DeviceTransferResponse* resp) override;
  // Standing CUDA IPC transfers of a session's jobs (worker/gpu/device_transfer.h); RunJob does
  // them around the job. FAILED_PRECONDITION when built without CUDA.
  grpc::Status BindDeviceTensors(grpc::ServerContext* ctx,
                                 const v1::BindDeviceTensorsRequest* req,
                                 v1::BindDeviceTensorsResponse* resp) override;
  // The NCCL path of a client on another host (worker/client_groups.h).
  grpc::Status JoinClientGroup(grpc::ServerContext* ctx,
                               const v1::WorkerJoinClientGroupRequest* req,
                               v1::WorkerJoinClientGroupResponse* resp) override;
  grpc::Status ClientGroupTransfer(grpc::ServerContext* ctx,
                                   const v1::ClientGroupTransferRequest* req,
                                   v1::ClientGroupTransferResponse* resp) override;

 private:
  grpc::Status Finish(const char* method, const absl::Status& st);
  // `gone`: the caller went away (a download awaiting a job's rows stops waiting).
  absl::Status DoShm(const v1::SharedMemoryTransferRequest& req, const std::string& capability,
                     const std::function<bool()>& gone, int64_t* bytes);

  SessionRegistry* sessions_;
  StreamLimits* streams_ = nullptr;
  JobRunner* jobs_;
  MemoryBudget* budget_;
  std::atomic<WorkerMetrics*> metrics_;
  const bool trace_ = TraceOpsEnabled();  // DFA_TRACE_OPS=1 (core/trace.h): RunJob's own steps
  ClientGroups client_groups_;
};

}  // namespace dfa
