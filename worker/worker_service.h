// The Worker gRPC service (proto/dfa/v1/worker.proto): session control for the coordinator and
// the client data plane (chunked upload/download with CRC32C, shared memory, synthetic inputs).
// absl::Status inside; converted to grpc::Status only here, and every non-OK answer is counted
// in dfa_grpc_errors_total{component="worker"}.
// Threads: gRPC's sync server calls the handlers on its thread pool; all state is in the
// thread-safe SessionRegistry and JobRunner. Nothing here owns them.
#pragma once

#include <atomic>

#include "dfa/v1/worker.grpc.pb.h"
#include "worker/job_runner.h"
#include "worker/memory_budget.h"
#include "worker/session_registry.h"
#include "worker/worker_metrics.h"

namespace dfa {

class WorkerServiceImpl final : public v1::Worker::Service {
 public:
  // Upload and Download are served from raw grpc::ByteBuffers (worker/chunk_wire.h): chunk
  // data goes from gRPC's receive buffers straight into session storage, and from storage
  // into the slice gRPC sends, one copy each way. The wire format is the proto's.
  WorkerServiceImpl(SessionRegistry* sessions, JobRunner* jobs, MemoryBudget* budget,
                    WorkerMetrics* metrics);

  // Refreshes the sessions / memory gauges (thread-safe).
  void UpdateGauges();
  // Attaches metrics (before the service is reachable; see worker_daemon.cc).
  void set_metrics(WorkerMetrics* m) { metrics_ = m; }

  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status RunJob(grpc::ServerContext* ctx, const v1::RunJobRequest* req,
                      v1::WorkerJobStats* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelWorkerJobRequest* req,
                         v1::CancelWorkerJobResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  // Upload (stream of UploadRequest) and Download (DownloadRequest -> stream of TensorChunk),
  // on raw messages; registered in place of the generated handlers by the constructor.
  grpc::Status RawUpload(grpc::ServerContext* ctx, grpc::ServerReader<grpc::ByteBuffer>* reader,
                         v1::UploadResponse* resp);
  grpc::Status RawDownload(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownloadRequest>* stream);
  grpc::Status GenerateInputs(grpc::ServerContext* ctx, const v1::GenerateInputsRequest* req,
                              v1::GenerateInputsResponse* resp) override;
  grpc::Status SharedMemoryTransfer(grpc::ServerContext* ctx,
                                    const v1::SharedMemoryTransferRequest* req,
                                    v1::SharedMemoryTransferResponse* resp) override;
  // Same-host CUDA IPC (worker/gpu/device_transfer.h); FAILED_PRECONDITION when built without
  // CUDA.
  grpc::Status DeviceTransfer(grpc::ServerContext* ctx, const v1::DeviceTransferRequest* req,
                              v1::DeviceTransferResponse* resp) override;

 private:
  grpc::Status Finish(const char* method, const absl::Status& st);
  absl::Status DoUpload(grpc::ServerReader<grpc::ByteBuffer>* reader, v1::UploadResponse* resp);
  absl::Status DoDownload(grpc::ServerReaderWriter<grpc::ByteBuffer, v1::DownloadRequest>* stream);
  absl::Status DoShm(const v1::SharedMemoryTransferRequest& req, int64_t* bytes);

  SessionRegistry* sessions_;
  JobRunner* jobs_;
  MemoryBudget* budget_;
  std::atomic<WorkerMetrics*> metrics_;
};

}  // namespace dfa
