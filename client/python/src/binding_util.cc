#include "binding_util.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/host_tensor.h"
#include "core/spec_validation.h"

namespace dfa::python {

// ---------------------------------------------------------------- Ctrl-C without a thread

namespace {

// SIGINTs seen by OnSigint (ever); the interrupt thread is woken by g_sigint_sem.
std::atomic<uint64_t> g_sigints{0};
sem_t g_sigint_sem;
// While armed: the action OnSigint chains to (Python's), read before ours is installed.
struct sigaction g_prev_action;

// The armed call (main thread only, one at a time), under g_arm_mu.
std::mutex g_arm_mu;
bool g_armed = false;
const std::function<void()>* g_on_interrupt = nullptr;
uint64_t g_armed_at = 0;
bool g_fired = false;

void OnSigint(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  g_sigints.fetch_add(1);
  sem_post(&g_sigint_sem);  // async-signal-safe
  errno = saved_errno;
  const struct sigaction& prev = g_prev_action;
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
}

void InterruptLoop() {
  while (true) {
    if (sem_wait(&g_sigint_sem) != 0) continue;  // EINTR
    std::lock_guard<std::mutex> lock(g_arm_mu);
    if (!g_armed || g_fired || g_sigints.load() <= g_armed_at) continue;
    g_fired = true;
    if (g_on_interrupt != nullptr && *g_on_interrupt) (*g_on_interrupt)();
  }
}

// Once per process (a forked child starts its own: threads do not survive fork). Main thread
// only, so no race.
void StartInterruptThread() {
  static pid_t started_in = 0;
  if (started_in == getpid()) return;
  started_in = getpid();
  sem_init(&g_sigint_sem, 0, 0);
  std::thread(InterruptLoop).detach();  // lives with the process, blocked in sem_wait
}

}  // namespace

bool OnMainThread() {
  static const unsigned long main_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  return PyThread_get_thread_ident() == main_ident;
}

bool SigintArm::Usable() {
  {
    std::lock_guard<std::mutex> lock(g_arm_mu);
    if (g_armed) return false;
  }
  nb::module_ signal = nb::module_::import_("signal");
  if (!signal.attr("getsignal")(signal.attr("SIGINT")).is(signal.attr("default_int_handler"))) {
    return false;
  }
  struct sigaction current;
  if (sigaction(SIGINT, nullptr, &current) != 0) return false;
  // Python's C handler must be the one installed (something else may have replaced it).
  return (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler != SIG_DFL &&
         current.sa_handler != SIG_IGN;
}

SigintArm::SigintArm(const std::function<void()>* on_interrupt) {
  StartInterruptThread();
  std::lock_guard<std::mutex> lock(g_arm_mu);
  if (g_armed || sigaction(SIGINT, nullptr, &g_prev_action) != 0) return;
  g_armed = true;
  g_on_interrupt = on_interrupt;
  g_fired = false;
  g_armed_at = armed_at_ = g_sigints.load();
  struct sigaction ours;
  memset(&ours, 0, sizeof(ours));
  ours.sa_sigaction = OnSigint;
  ours.sa_mask = g_prev_action.sa_mask;
  ours.sa_flags = (g_prev_action.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
  if (sigaction(SIGINT, &ours, nullptr) != 0) {
    g_armed = false;
    g_on_interrupt = nullptr;
    return;
  }
  armed_ = true;
}

SigintArm::~SigintArm() {
  if (!armed_) return;
  std::lock_guard<std::mutex> lock(g_arm_mu);  // waits for an on_interrupt in progress
  (void)sigaction(SIGINT, &g_prev_action, nullptr);
  g_armed = false;
  g_on_interrupt = nullptr;
}

bool SigintArm::fired() const { return armed_ && g_sigints.load() > armed_at_; }

// ----------------------------------------------------------------

void ThrowInvalid(const std::string& message) {
  throw StatusError(absl::InvalidArgumentError(message));
}

void RegisterStatusTranslator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const absl::Status& s = e.status();
      nb::object err = nb::module_::import_("dfa.errors")
                           .attr("from_status")(static_cast<int>(s.code()),
                                                absl::StatusCodeToString(s.code()),
                                                std::string(s.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });
}

nb::dict JobToDict(const v1::Job& job) {
  nb::dict d;
  d["job_id"] = job.job_id();
  d["session_id"] = job.session_id();
  d["kind"] = v1::JobKind_Name(job.kind());
  d["state"] = v1::JobState_Name(job.state());
  d["steps_done"] = job.steps_done();
  d["steps_total"] = job.steps_total();
  d["error_code"] = job.error_code();
  d["error_message"] = job.error_message();
  d["wall_seconds"] = job.wall_seconds();
  d["flops"] = job.flops();
  nb::list workers;
  for (const auto& w : job.workers()) {
    nb::dict wd;
    wd["rank"] = w.rank();
    wd["busy_seconds"] = w.busy_seconds();
    wd["idle_seconds"] = w.idle_seconds();
    wd["bytes_sent"] = w.bytes_sent();
    wd["bytes_received"] = w.bytes_received();
    wd["kernel_launches"] = w.kernel_launches();
    workers.append(wd);
  }
  d["workers"] = workers;
  return d;
}

nb::dict WorkerToDict(const v1::WorkerInfo& w) {
  nb::dict d;
  d["worker_id"] = w.worker_id();
  d["address"] = w.address();
  d["host"] = w.host();
  d["backend"] = w.backend();
  d["device"] = w.device();
  d["memory_limit_bytes"] = w.memory_limit_bytes();
  d["memory_used_bytes"] = w.memory_used_bytes();
  d["speed"] = w.speed();
  d["last_seen_seconds"] = w.last_seen_seconds();
  d["alive"] = w.alive();
  d["incarnation"] = w.incarnation();
  return d;
}

nb::dict StatusToDict(const v1::ClusterStatus& s) {
  nb::dict d;
  d["live_workers"] = s.live_workers();
  d["sessions"] = s.sessions();
  d["jobs_running"] = s.jobs_running();
  d["jobs_queued"] = s.jobs_queued();
  d["client_leases"] = s.client_leases();
  d["memory_used_bytes"] = s.memory_used_bytes();
  d["memory_limit_bytes"] = s.memory_limit_bytes();
  return d;
}

nb::dict ShardToDict(const v1::ShardPlacement& s) {
  nb::dict d;
  d["rank"] = s.rank();
  d["worker_id"] = s.worker_id();
  d["address"] = s.address();
  d["host"] = s.host();
  nb::list owned;
  for (const auto& r : s.owned()) owned.append(nb::make_tuple(r.begin(), r.end()));
  d["owned"] = owned;
  d["q_heads"] = nb::make_tuple(s.q_heads().begin(), s.q_heads().end());
  d["kv_heads"] = nb::make_tuple(s.kv_heads().begin(), s.kv_heads().end());
  return d;
}

nb::dict SpecToDict(const v1::AttentionSpec& spec) {
  nb::dict d;
  d["batch"] = spec.batch();
  d["seq_len"] = spec.seq_len();
  d["q_heads"] = spec.q_heads();
  d["kv_heads"] = spec.kv_heads();
  d["head_dim"] = spec.head_dim();
  d["causal"] = spec.causal();
  d["dtype"] = spec.dtype() == v1::DTYPE_BF16 ? "bf16" : spec.dtype() == v1::DTYPE_F16 ? "f16" : "f32";
  d["softmax_scale"] = spec.softmax_scale();
  nb::list docs;
  for (const v1::DocOffsets& row : spec.doc_offsets()) {
    const std::vector<int64_t> offsets(row.offsets().begin(), row.offsets().end());
    docs.append(nb::cast(offsets));  // a list of ints per row
  }
  d["doc_offsets"] = docs;
  d["window_left"] = spec.has_window_left() ? spec.window_left() : int64_t{-1};
  d["window_right"] = spec.has_window_right() ? spec.window_right() : int64_t{-1};
  return d;
}

v1::AttentionSpec MakeSpec(int batch, int64_t seq_len, int q_heads, int kv_heads, int head_dim,
                           bool causal, const std::string& dtype, double softmax_scale,
                           const std::vector<std::vector<int64_t>>& doc_offsets,
                           int64_t window_left, int64_t window_right) {
  v1::AttentionSpec spec;
  spec.set_batch(batch);
  spec.set_seq_len(seq_len);
  spec.set_q_heads(q_heads);
  spec.set_kv_heads(kv_heads == 0 ? q_heads : kv_heads);
  spec.set_head_dim(head_dim);
  spec.set_causal(causal);
  const std::string d = absl::AsciiStrToLower(dtype);
  if (d == "bf16" || d == "bfloat16") {
    spec.set_dtype(v1::DTYPE_BF16);
  } else if (d == "f16" || d == "fp16" || d == "float16") {
    spec.set_dtype(v1::DTYPE_F16);
  } else if (d == "f32" || d == "fp32" || d == "float32") {
    spec.set_dtype(v1::DTYPE_F32);
  } else {
    ThrowInvalid(absl::StrCat("spec.dtype: must be bf16, f16 or f32, got '", dtype, "'"));
  }
  spec.set_softmax_scale(static_cast<float>(softmax_scale));
  MaskSpec mask;
  mask.doc_offsets = doc_offsets;
  mask.window_left = window_left;
  mask.window_right = window_right;
  SetSpecMask(mask, &spec);
  Check(client::ValidateSpec(spec));
  return spec;
}

v1::AttentionSpec SpecFromDict(const nb::dict& spec) {
  std::vector<std::vector<int64_t>> docs;
  if (spec.contains("doc_offsets")) {
    docs = nb::cast<std::vector<std::vector<int64_t>>>(spec["doc_offsets"]);
  }
  const int64_t left = spec.contains("window_left") ? nb::cast<int64_t>(spec["window_left"]) : -1;
  const int64_t right =
      spec.contains("window_right") ? nb::cast<int64_t>(spec["window_right"]) : -1;
  return MakeSpec(nb::cast<int>(spec["batch"]), nb::cast<int64_t>(spec["seq_len"]),
                  nb::cast<int>(spec["q_heads"]), nb::cast<int>(spec["kv_heads"]),
                  nb::cast<int>(spec["head_dim"]), nb::cast<bool>(spec["causal"]),
                  nb::cast<std::string>(spec["dtype"]), nb::cast<double>(spec["softmax_scale"]),
                  docs, left, right);
}

v1::JobKind ParseJobKind(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "forward") return v1::JOB_FORWARD;
  if (n == "backward") return v1::JOB_BACKWARD;
  ThrowInvalid(absl::StrCat("kind: must be 'forward' or 'backward', got '", name, "'"));
}

DType ParseTensorDType(const std::string& name, const char* what) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  if (name == "f32") return DType::kF32;
  ThrowInvalid(absl::StrCat(what, ".dtype: must be bf16, f16 or f32, got '", name, "'"));
}

v1::TensorKind ParseTensorKind(int kind, const char* what) {
  if (kind < v1::TENSOR_Q || kind > v1::TENSOR_DV) {
    ThrowInvalid(absl::StrCat(what, ": not a tensor kind (dfa.Q .. dfa.DV), got ", kind));
  }
  return static_cast<v1::TensorKind>(kind);
}

TransferOptions MakeTransferOptions(const std::string& path, int64_t chunk_bytes,
                                    int64_t segment_bytes) {
  TransferOptions o;
  const std::string p = absl::AsciiStrToLower(path);
  if (p == "auto") {
    o.path = client::TransferPath::kAuto;
  } else if (p == "grpc") {
    o.path = client::TransferPath::kGrpc;
  } else if (p == "shm" || p == "shared_memory") {
    o.path = client::TransferPath::kSharedMemory;
  } else {
    ThrowInvalid(absl::StrCat("path: must be 'auto', 'grpc' or 'shm', got '", path, "'"));
  }
  if (chunk_bytes < 1) ThrowInvalid(absl::StrCat("chunk_bytes: must be >= 1, got ", chunk_bytes));
  if (segment_bytes < 2) {
    ThrowInvalid(absl::StrCat("segment_bytes: must be >= 2, got ", segment_bytes));
  }
  o.chunk_bytes = chunk_bytes;
  o.segment_bytes = segment_bytes;
  return o;
}

absl::Duration Seconds(double s, const char* what) {
  if (!std::isfinite(s) || s <= 0) {
    ThrowInvalid(absl::StrCat(what, ": must be a positive number of seconds, got ", s));
  }
  return absl::Seconds(s);
}

}  // namespace dfa::python
