// One session as a worker holds it: the spec, this worker's rank and plan, the tensors
// (SessionStorage from worker/executor), the session's backend and transport, and what has
// been uploaded and computed so far.
//
// Ownership: the session owns its backend, storage and transport (destroyed in the reverse
// order: transport, storage, backend). Sessions are shared_ptrs in the SessionRegistry, so an
// RPC that found one keeps it alive even if CloseSession races it.
// Threads: `mu` guards everything below it. Data-plane RPCs and RunJob take it; a job holds
// `job_running` (not the mutex) while it computes, so CancelJob and status queries never wait
// for a job, and data RPCs on a session with a running job get FAILED_PRECONDITION — except
// uploads of the rows a streaming job (RunJobRequest.inputs_streaming) still waits for, which
// notify `rows_arrived` (worker/session_input_gate.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/planner/plan.h"
#include "dfa/v1/worker.pb.h"
#include "kernels/attention_backend.h"
#include "worker/executor/session_storage.h"
#include "worker/session_admission.h"
#include "worker/session_mask.h"
#include "worker/shm_mappings.h"
#include "worker/transport/session_transport.h"

namespace dfa {

class CudaIpcImporter;  // core/gpu/cuda_ipc.h (built with CUDA only)

// Which (batch, local row) pairs of an input tensor have been written, so a job can refuse to
// run on inputs that were never (fully) uploaded; and which of them arrived since the last job
// that read the tensor ended (ClearArrivals), the rows a streaming job waits for.
class RowCoverage {
 public:
  void Reset(int64_t pairs) {
    covered_.assign(static_cast<size_t>(pairs), 0);
    arrived_.assign(static_cast<size_t>(pairs), 0);
    count_ = 0;
  }
  void Mark(int64_t first, int64_t n) {
    for (int64_t i = first; i < first + n; ++i) {
      arrived_[static_cast<size_t>(i)] = 1;
      if (!covered_[static_cast<size_t>(i)]) {
        covered_[static_cast<size_t>(i)] = 1;
        ++count_;
      }
    }
  }
  void MarkAll() { Mark(0, static_cast<int64_t>(covered_.size())); }
  void Clear() { Reset(static_cast<int64_t>(covered_.size())); }
  // Whether pairs [first, first + n) have all arrived since ClearArrivals.
  bool ArrivedAll(int64_t first, int64_t n) const {
    for (int64_t i = first; i < first + n; ++i) {
      if (!arrived_[static_cast<size_t>(i)]) return false;
    }
    return true;
  }
  // A job that read the tensor ended: the next streaming job waits for rows written after now.
  void ClearArrivals() { std::fill(arrived_.begin(), arrived_.end(), 0); }
  bool complete() const { return count_ == static_cast<int64_t>(covered_.size()); }
  int64_t count() const { return count_; }
  int64_t total() const { return static_cast<int64_t>(covered_.size()); }

 private:
  std::vector<uint8_t> covered_;
  std::vector<uint8_t> arrived_;
  int64_t count_ = 0;
};

// The outputs of a session's running job as their rows become final, and how its last jobs
// ended: what a download that awaits a job (DownloadRequest.await_job_id) waits on
// (worker/session_output_gate.h).
struct OutputProgress {
  std::string job_id;  // the running job ("" when none runs)
  v1::JobKind kind = v1::JOB_FORWARD;
  // Per local row: final on the query side (O, LSE; dQ) and the key side (dK, dV).
  std::vector<uint8_t> queries, keys;
  // The last jobs that ended here (at most a few, oldest first): id and outcome.
  std::deque<std::pair<std::string, absl::Status>> ended;
};

struct WorkerSession {
  // Immutable after OpenSession.
  std::string id;
  std::string client_id;
  // The session's capability (OpenSessionRequest.session_capability; empty for sessions opened
  // without one): a secret, never logged. SessionRegistry's lookups check it.
  std::string capability;
  v1::AttentionSpec spec;
  int rank = 0;
  Plan plan;
  // The heads this worker holds, as global indices: all of the spec's unless the plan splits
  // heads (WorkerPlan::kv_heads; q_heads are those kv heads' query groups). Storage, transit
  // chunks, shared-memory blocks and CUDA IPC refs cover exactly these heads; local head h is
  // global head begin + h.
  HeadRange q_heads;
  HeadRange kv_heads;
  int64_t bytes_reserved = 0;
  // Key rows per chunk of a chunked backward (the storage was sized for it).
  int64_t step_tokens = 0;
  // The session's share of the worker's sessions and file descriptors
  // (worker/session_admission.h); declared before what uses them, so it is released after the
  // transport, storage and backend are gone.
  std::unique_ptr<SessionAdmission::Ticket> admission;
  std::unique_ptr<AttentionBackend> backend;
  // The session's streams (nullptr on cpu). Its jobs compute on `compute_stream`; the data
  // plane's copies run on `io_stream` and wait for it alone, so rows move while a job computes
  // (neither stream is ordered with the other or with the default stream: what crosses them is
  // ordered on the host, by the input and output gates).
  OwnedStream compute_stream;
  OwnedStream io_stream;
  std::unique_ptr<SessionStorage> storage;
  std::unique_ptr<SessionTransport> transport;
  // The spec's mask; its interval arrays (non-dense masks) live in the backend's memory.
  std::unique_ptr<SessionMask> mask;

  std::mutex mu;
  bool job_running = false;        // guarded by mu
  std::string running_job_id;      // guarded by mu
  v1::JobKind running_kind = v1::JOB_FORWARD;  // guarded by mu; the running job's kind
  // The running job streams its inputs (RunJobRequest.inputs_streaming): uploads of its input
  // kinds' missing rows are accepted while it runs. Guarded by mu.
  bool inputs_streaming = false;
  // Notified (with mu held or not) after every upload marks rows and when the job is cancelled;
  // a streaming job's executor waits on it (with mu).
  std::condition_variable rows_arrived;
  OutputProgress outputs;  // guarded by mu
  // Notified when output rows become final, when a job starts or ends, and when a download
  // awaiting outputs loses its client; such downloads wait on it (with mu).
  std::condition_variable outputs_changed;
  bool forward_done = false;       // O and LSE hold the forward of the current Q, K, V
  bool backward_done = false;      // dQ, dK, dV hold the backward of the current dO
  // A backward has run since Q, K, V were last complete: it wrote the gradients into their
  // memory (and over O), so Q, K, V, O are gone until Q, K, V are uploaded again.
  bool inputs_consumed = false;
  RowCoverage q_rows, k_rows, v_rows, dout_rows;  // guarded by mu
  std::atomic<bool> cancel{false};  // set by CancelJob for the running job
  ShmMappings shm_mappings;  // shared-memory segments made for the session; thread-safe itself
  // Client CUDA allocations opened by Worker.DeviceTransfer (worker/gpu/device_transfer.h);
  // made on first use, guarded by mu; closed when the session is destroyed.
  std::shared_ptr<CudaIpcImporter> cuda_ipc;
  // Standing CUDA IPC transfers done inside every job of a kind (Worker.BindDeviceTensors,
  // worker/gpu/device_transfer.h), guarded by mu.
  std::vector<v1::DeviceTransferRequest> bound_forward, bound_backward;
};

}  // namespace dfa
