// dfa._dfa.LocalCluster: client/local_cluster.h for Python — one dfa-coordinator and N
// dfa-worker daemons on loopback (examples, tests, benchmarks). The Python class
// dfa.LocalCluster (dfa/cluster.py) finds the binaries and wraps this.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <csignal>

#include "absl/strings/str_cat.h"
#include "binding_util.h"
#include "client/local_cluster.h"

namespace dfa::python {
namespace {

using client::LocalCluster;
using client::LocalClusterOptions;

std::unique_ptr<LocalCluster> Start(int workers, const std::string& backend, int threads,
                                    int64_t memory_limit_bytes, const std::string& bin_dir,
                                    const std::string& log_dir, double start_timeout,
                                    const std::vector<std::string>& coordinator_args,
                                    const std::vector<std::string>& worker_args,
                                    const std::string& tls_cert, const std::string& tls_key,
                                    const std::string& tls_ca, const std::string& tls_server_name,
                                    const std::string& token) {
  if (workers < 1) ThrowInvalid(absl::StrCat("workers: must be >= 1, got ", workers));
  if (threads < 0) ThrowInvalid(absl::StrCat("threads_per_worker: must be >= 0, got ", threads));
  LocalClusterOptions o;
  o.workers = workers;
  o.backend = backend;
  o.threads_per_worker = threads;
  o.memory_limit_bytes = memory_limit_bytes;
  o.bin_dir = bin_dir;
  o.log_dir = log_dir;
  o.start_timeout = Seconds(start_timeout, "start_timeout");
  o.coordinator_args = coordinator_args;
  o.worker_args = worker_args;
  o.security.cert_file = tls_cert;
  o.security.key_file = tls_key;
  o.security.ca_file = tls_ca;
  o.security.server_name = tls_server_name;
  o.security.auth_token = token;
  return Value(RunBlocking([&] { return LocalCluster::Start(o); }));
}

client::ChildProcess* Worker(LocalCluster& c, int i) {
  if (i < 0 || i >= static_cast<int>(c.workers().size())) {
    ThrowInvalid(absl::StrCat("worker: index must be in [0, ", c.workers().size(), "), got ", i));
  }
  return c.worker_process(i);
}

}  // namespace

void BindLocalCluster(nb::module_& m) {
  nb::class_<LocalCluster>(m, "LocalCluster")
      // LocalClusterOptions{}: the defaults dfa.LocalCluster shares with `dfa cluster`,
      // `dfa demo` and deploy/local/cluster.sh.
      .def_static("defaults",
                  [] {
                    const LocalClusterOptions o;
                    nb::dict d;
                    d["workers"] = o.workers;
                    d["backend"] = o.backend;
                    d["threads_per_worker"] = o.threads_per_worker;
                    d["memory_limit_bytes"] = o.memory_limit_bytes;
                    d["start_timeout"] = absl::ToDoubleSeconds(o.start_timeout);
                    return d;
                  })
      .def_static("start", &Start, nb::arg("workers"), nb::arg("backend"), nb::arg("threads"),
                  nb::arg("memory_limit_bytes"), nb::arg("bin_dir"), nb::arg("log_dir"),
                  nb::arg("start_timeout"), nb::arg("coordinator_args"),
                  nb::arg("worker_args"), nb::arg("tls_cert") = "", nb::arg("tls_key") = "",
                  nb::arg("tls_ca") = "", nb::arg("tls_server_name") = "",
                  nb::arg("token") = "")
      .def_prop_ro("coordinator_address", &LocalCluster::coordinator_address)
      .def_prop_ro("worker_addresses",
                   [](const LocalCluster& c) {
                     std::vector<std::string> out;
                     for (const auto& w : c.workers()) out.push_back(w.address);
                     return out;
                   })
      .def_prop_ro("log_dir", &LocalCluster::log_dir)
      .def("add_worker", [](LocalCluster& c) { Check(RunBlocking([&] { return c.AddWorker(); })); })
      .def("worker_pid", [](LocalCluster& c, int i) { return static_cast<int>(Worker(c, i)->pid()); })
      .def("worker_running", [](LocalCluster& c, int i) { return Worker(c, i)->Running(); })
      .def("signal_worker", [](LocalCluster& c, int i, int sig) { Worker(c, i)->Signal(sig); },
           nb::arg("index"), nb::arg("signal") = SIGKILL)
      .def("restart_coordinator",
           [](LocalCluster& c) { Check(RunBlocking([&] { return c.RestartCoordinator(); })); })
      .def("stop", [](LocalCluster& c) { Check(RunBlocking([&] { return c.Stop(); })); });
}

}  // namespace dfa::python
