// The extension module dfa._dfa: the C++ client library of the DistFlashAttn Service bound for
// Python (client/client.h, client/attention_job.h, client/local_cluster.h). The package `dfa`
// (client/python/dfa) is its public face; see docs/python.md.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/string.h>

#include <unistd.h>

#include "binding_util.h"
#include "core/spec_validation.h"

namespace dfa::python {
void BindClient(nb::module_& m);
void BindAttentionJob(nb::module_& m);
void BindLocalCluster(nb::module_& m);
void BindCuda(nb::module_& m);
void BindDeviceAttentionJob(nb::module_& m);
void BindNccl(nb::module_& m);
}  // namespace dfa::python

NB_MODULE(_dfa, m) {
  namespace nb = nanobind;
  using namespace dfa::python;
  m.doc() = "C++ client library of the DistFlashAttn Service (sessions, data planes, retries, "
            "mTLS and token, local clusters)";
  RegisterStatusTranslator();
  BindClient(m);
  BindAttentionJob(m);
  BindLocalCluster(m);
  BindCuda(m);
  BindDeviceAttentionJob(m);
  BindNccl(m);
  m.def("validate_spec",
        [](int batch, int64_t seq_len, int q_heads, int kv_heads, int head_dim, bool causal,
           const std::string& dtype, double softmax_scale,
           const std::vector<std::vector<int64_t>>& doc_offsets, int64_t window_left,
           int64_t window_right) {
          (void)MakeSpec(batch, seq_len, q_heads, kv_heads, head_dim, causal, dtype,
                         softmax_scale, doc_offsets, window_left, window_right);
        },
        nb::arg("batch"), nb::arg("seq_len"), nb::arg("q_heads"), nb::arg("kv_heads"),
        nb::arg("head_dim"), nb::arg("causal"), nb::arg("dtype"), nb::arg("softmax_scale"),
        nb::arg("doc_offsets") = std::vector<std::vector<int64_t>>{},
        nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        "Raises dfa.InvalidArgumentError with the service's message when the spec is invalid.");
  m.def("spec_forward_flops",
        [](const nb::dict& spec) { return dfa::SpecForwardFlops(SpecFromDict(spec)); },
        nb::arg("spec"),
        "SpecForwardFlops (core/spec_validation.h) of a dict of AttentionSpec fields: the FLOPs "
        "of the whole forward, visible pairs under the mask only.");
  m.def("host_name", [] { return dfa::client::LocalHostName(); });
}
