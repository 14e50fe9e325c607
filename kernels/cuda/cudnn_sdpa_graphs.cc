// cuDNN frontend graphs for SDPA forward/backward (see cudnn_sdpa_graphs.h). The frontend is
// used in its dynamic-loading mode (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set by CMake), and
// reports errors both as error_t values and as C++ exceptions: both become absl::Status here.
#include "kernels/cuda/cudnn_sdpa_graphs.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cudnn_frontend.h"
#include "kernels/cuda/cudnn_scratch.h"

namespace cudnn_frontend {
// The frontend's dynamic-loading mode resolves every cuDNN symbol through this handle.
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace dfa::cudnn {
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

// Bounds the cache (every entry holds built execution plans); cleared when full.
constexpr size_t kMaxCachedGraphs = 256;

absl::Status FromFe(fe::error_t e, absl::string_view what) {  // get_message() is not const
  if (e.is_good()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("cudnn backend: ", what, ": ", e.get_message()));
}

std::vector<int64_t> KeyOf(const SdpaProblem& p) {
  int32_t scale_bits;
  static_assert(sizeof(scale_bits) == sizeof(p.scale));
  std::memcpy(&scale_bits, &p.scale, sizeof(scale_bits));
  std::vector<int64_t> k = {p.backward, p.dtype, p.batch, p.q_heads, p.kv_heads, p.head_dim,
                            p.q_rows,   p.kv_rows, p.right_bound, scale_bits};
  for (const int64_t* s : {p.q_s, p.k_s, p.v_s, p.o_s, p.lse_s}) k.insert(k.end(), s, s + 2);
  if (p.backward) {
    for (const int64_t* s : {p.do_s, p.dq_s, p.dk_s, p.dv_s}) k.insert(k.end(), s, s + 2);
  }
  return k;
}

// BSHD rows in cuDNN's [B, H, S, D] dim order.
fe::graph::Tensor_attributes Bshd(const char* name, int64_t uid, int64_t b, int64_t h, int64_t s, int64_t d,
                                  const int64_t st[2]) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, s, d}).set_stride(
      {st[0], d, st[1], 1});
}

std::vector<int64_t> StatsDim(const SdpaProblem& p) { return {p.batch, p.q_heads, p.q_rows, 1}; }
std::vector<int64_t> StatsStride(const SdpaProblem& p) { return {p.lse_s[0], p.lse_s[1], 1, 1}; }

template <typename Attrs>
void SetMask(Attrs& a, const SdpaProblem& p) {
  if (p.right_bound < 0) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(static_cast<int>(p.right_bound));
}

// Defines the graph's operations for `p` (no plans yet).
std::shared_ptr<fe::graph::Graph> Define(const SdpaProblem& p) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(p.dtype == 2 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = g->tensor(Bshd("Q", kQ, p.batch, p.q_heads, p.q_rows, p.head_dim, p.q_s));
  auto k = g->tensor(Bshd("K", kK, p.batch, p.kv_heads, p.kv_rows, p.head_dim, p.k_s));
  auto v = g->tensor(Bshd("V", kV, p.batch, p.kv_heads, p.kv_rows, p.head_dim, p.v_s));
  if (!p.backward) {
    auto attrs = fe::graph::SDPA_attributes().set_name("sdpa_fwd").set_generate_stats(true).set_attn_scale(p.scale);
    SetMask(attrs, p);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    o->set_output(true).set_uid(kO).set_dim({p.batch, p.q_heads, p.q_rows, p.head_dim}).set_stride(
        {p.o_s[0], p.head_dim, p.o_s[1], 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(StatsDim(p)).set_stride(
        StatsStride(p));
    return g;
  }
  auto o = g->tensor(Bshd("O", kO, p.batch, p.q_heads, p.q_rows, p.head_dim, p.o_s));
  auto dout = g->tensor(Bshd("dO", kDout, p.batch, p.q_heads, p.q_rows, p.head_dim, p.do_s));
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(StatsDim(p))
                             .set_stride(StatsStride(p)));
  auto attrs = fe::graph::SDPA_backward_attributes().set_name("sdpa_bwd").set_attn_scale(p.scale);
  SetMask(attrs, p);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
  dq->set_output(true).set_uid(kDq).set_dim({p.batch, p.q_heads, p.q_rows, p.head_dim}).set_stride(
      {p.dq_s[0], p.head_dim, p.dq_s[1], 1});
  dk->set_output(true).set_uid(kDk).set_dim({p.batch, p.kv_heads, p.kv_rows, p.head_dim}).set_stride(
      {p.dk_s[0], p.head_dim, p.dk_s[1], 1});
  dv->set_output(true).set_uid(kDv).set_dim({p.batch, p.kv_heads, p.kv_rows, p.head_dim}).set_stride(
      {p.dv_s[0], p.head_dim, p.dv_s[1], 1});
  return g;
}

}  // namespace

struct SdpaGraphs::Impl {
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;  // null when unsupported
    int64_t workspace = 0;
    absl::Status status;
  };

  int device = 0;
  cudnnHandle_t handle = nullptr;
  std::map<std::vector<int64_t>, Entry> cache;
  ScratchAllocator scratch;  // empty: cudaMalloc / cudaFree
  ScratchBuffer workspace{&scratch, "workspace"};

  absl::StatusOr<Entry*> Get(const SdpaProblem& p) {
    std::vector<int64_t> key = KeyOf(p);
    auto it = cache.find(key);
    if (it != cache.end()) return &it->second;
    if (cache.size() >= kMaxCachedGraphs) cache.clear();
    Entry e;
    e.status = Build(p, &e);
    if (!e.status.ok()) e.graph.reset();
    return &cache.emplace(std::move(key), std::move(e)).first->second;
  }

  absl::Status Build(const SdpaProblem& p, Entry* e) {
    try {
      auto g = Define(p);
      RETURN_IF_ERROR(FromFe(g->validate(), "validate"));
      RETURN_IF_ERROR(FromFe(g->build_operation_graph(handle), "build_operation_graph"));
      RETURN_IF_ERROR(FromFe(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
      RETURN_IF_ERROR(FromFe(g->check_support(), "check_support"));
      RETURN_IF_ERROR(FromFe(g->build_plans(), "build_plans"));
      RETURN_IF_ERROR(FromFe(g->get_workspace_size(e->workspace), "get_workspace_size"));
      e->graph = std::move(g);
      return absl::OkStatus();
    } catch (const std::exception& ex) {
      return absl::UnimplementedError(absl::StrCat("cudnn backend: graph build threw: ", ex.what()));
    }
  }

};

SdpaGraphs::SdpaGraphs(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SdpaGraphs::~SdpaGraphs() {
  impl_->cache.clear();
  if (impl_->handle != nullptr) {
    try {
      fe::detail::destroy_handle(impl_->handle);
    } catch (const std::exception&) {
    }
  }
}

absl::StatusOr<std::unique_ptr<SdpaGraphs>> SdpaGraphs::Create(int device, const ScratchAllocator* scratch) {
  if (fe::cudnn_dlhandle == nullptr) {
    const char* env = std::getenv("DFA_CUDNN_LIBRARY");
    const char* name = env != nullptr && env[0] != '\0' ? env : "libcudnn.so.9";
    fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (fe::cudnn_dlhandle == nullptr) {
      const char* why = dlerror();
      return absl::UnavailableError(absl::StrCat("cudnn backend: cannot load ", name, ": ",
                                                 why != nullptr ? why : "unknown error",
                                                 " (set DFA_CUDNN_LIBRARY or LD_LIBRARY_PATH)"));
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  if (scratch != nullptr) impl->scratch = *scratch;
  try {
    if (fe::detail::get_backend_version() < 90000) {
      return absl::UnavailableError(
          absl::StrCat("cudnn backend: cuDNN ", fe::detail::get_backend_version(), " is older than 9.0"));
    }
    if (cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("cudnn backend: cannot use device ", device));
    }
    const cudnnStatus_t st = fe::detail::create_handle(&impl->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      impl->handle = nullptr;
      return absl::UnavailableError(absl::StrCat("cudnn backend: cudnnCreate failed with status ", static_cast<int>(st)));
    }
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("cudnn backend: ", ex.what()));
  }
  return std::unique_ptr<SdpaGraphs>(new SdpaGraphs(std::move(impl)));
}

absl::Status SdpaGraphs::Run(const SdpaProblem& p, const SdpaPointers& ptrs, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Impl::Entry * e, impl_->Get(p));
  RETURN_IF_ERROR(e->status);
  ASSIGN_OR_RETURN(void* workspace, impl_->workspace.Get(static_cast<size_t>(e->workspace)));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(ptrs.q)},
                                             {kK, const_cast<void*>(ptrs.k)},
                                             {kV, const_cast<void*>(ptrs.v)},
                                             {kO, ptrs.o},
                                             {kStats, ptrs.lse}};
  if (p.backward) {
    pack[kDout] = const_cast<void*>(ptrs.dout);
    pack[kDq] = ptrs.dq;
    pack[kDk] = ptrs.dk;
    pack[kDv] = ptrs.dv;
  }
  try {
    if (fe::detail::set_stream(impl_->handle, stream) != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError("cudnn backend: cudnnSetStream failed");
    }
    fe::error_t err = e->graph->execute(impl_->handle, pack, workspace);
    if (!err.is_good()) return absl::InternalError(absl::StrCat("cudnn backend: execute: ", err.get_message()));
  } catch (const std::exception& ex) {
    return absl::InternalError(absl::StrCat("cudnn backend: execute threw: ", ex.what()));
  }
  return absl::OkStatus();
}

std::string SdpaGraphs::LibraryVersion() const {
  try {
    const size_t v = fe::detail::get_backend_version();
    return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
  } catch (const std::exception&) {
    return "unknown";
  }
}

int64_t SdpaGraphs::cached_graphs() const { return static_cast<int64_t>(impl_->cache.size()); }

}  // namespace dfa::cudnn
