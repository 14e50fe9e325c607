#!/usr/bin/env python3
"""Renders deploy/k8s/overlays/{cpu,gpu} with `kubectl kustomize` and validates them offline.

Built-in kinds are validated strictly (unknown fields rejected) against the Kubernetes JSON
schemas that the kubernetes-validate package ships, for the oldest Kubernetes we support (1.27)
and the newest the package knows. The PodMonitor (a CRD, no schema shipped) gets a structural
check here. Then the wiring: selectors match pod labels, probes are HTTP /healthz and /readyz on
the metrics port, $(VAR) references resolve, every flag exists in its daemon's main.cc, every
ConfigMap key feeds a flag, threads and memory come from the container's resources (Downward
API), disruption budgets cover the workloads, the network policies let exactly the intended
peers in (evaluated here with Kubernetes' semantics), pods meet the "restricted" security
profile, the gpu overlay runs in secure mode with TLS files and tokens from Secrets, its workers
are kept on one NVLink island, images name a registry and a tag, the dashboard ConfigMap is
byte-identical to deploy/grafana/dashboard.json, GPU limits only in the gpu overlay.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_model as km  # noqa: E402

try:
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils
except ImportError:  # pragma: no cover - reported by the test below
    kubernetes_validate = None

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OVERLAYS = ("cpu", "gpu")
OLDEST_K8S = "1.27.0"


def render(overlay):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise unittest.SkipTest("unreachable")  # test_tools_present reports it
    path = os.path.join(REPO, "deploy", "k8s", "overlays", overlay)
    r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def newest_k8s():
    schemas = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    versions = [re.match(r"v(\d+)\.(\d+)\.(\d+)-local$", d) for d in os.listdir(schemas)]
    best = max(tuple(int(x) for x in m.groups()) for m in versions if m)
    return ".".join(map(str, best))


def by_kind(docs, kind, name=None):
    out = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return out


def workloads(docs):
    return by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")


def daemon_flags():
    """{binary: flags its main.cc defines}, from the ABSL_FLAG definitions."""
    out = {}
    for binary, source in (("dfa-coordinator", "coordinator/main.cc"),
                           ("dfa-worker", "worker/main.cc")):
        with open(os.path.join(REPO, source), encoding="utf-8") as f:
            out[binary] = set(re.findall(r"ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)", f.read()))
    return out


def flag_values(container):
    """{flag name: value} of a container's --flag=value arguments."""
    out = {}
    for arg in container.get("args", []):
        m = re.fullmatch(r"--(\w+)=(.*)", arg)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def env_source(container, name):
    """The env entry `name` of a container (None when it has none)."""
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def var_of(value):
    """"FOO" for a flag value that is exactly "$(FOO)", else None."""
    m = re.fullmatch(r"\$\((\w+)\)", value)
    return m.group(1) if m else None


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = {}
        if shutil.which("kubectl"):
            cls.rendered = {o: render(o) for o in OVERLAYS}

    def test_tools_present(self):
        self.assertIsNotNone(shutil.which("kubectl"), "kubectl missing: run ./dfa.sh setup")
        self.assertIsNotNone(kubernetes_validate, "kubernetes-validate missing: ./dfa.sh setup")

    def test_builtin_kinds_validate_strictly(self):
        self.assertIsNotNone(kubernetes_validate)
        versions = (OLDEST_K8S, newest_k8s())
        for overlay, docs in self.rendered.items():
            builtin = [d for d in docs if "monitoring.coreos.com" not in d["apiVersion"]]
            self.assertGreaterEqual(len(builtin), 7, overlay)
            for version in versions:
                for d in builtin:
                    with self.subTest(overlay=overlay, version=version, kind=d["kind"],
                                      name=d["metadata"]["name"]):
                        try:
                            kubernetes_validate.validate(d, version, strict=True)
                        except kv_utils.ValidationError as e:
                            self.fail(f"{overlay} {d['kind']}/{d['metadata']['name']} @ "
                                      f"{version}: {e.path}: {e.message}")

    def test_validator_rejects_bad_manifest(self):
        # Guards against a validator that silently accepts everything (e.g. missing schemas).
        self.assertIsNotNone(kubernetes_validate)
        sts = dict(by_kind(self.rendered["cpu"], "StatefulSet")[0])
        sts["spec"] = dict(sts["spec"], replicas="two")
        with self.assertRaises(kv_utils.ValidationError):
            kubernetes_validate.validate(sts, newest_k8s(), strict=True)

    def test_expected_objects(self):
        for overlay, docs in self.rendered.items():
            kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
            for want in (("Deployment", "dfa-coordinator"), ("Service", "dfa-coordinator"),
                         ("StatefulSet", "dfa-worker"), ("Service", "dfa-worker"),
                         ("PodMonitor", "dfa"), ("ConfigMap", "dfa-grafana-dashboard"),
                         ("Namespace", "dfa")):
                self.assertIn(want, kinds, overlay)
            for want in (("PodDisruptionBudget", "dfa-coordinator"),
                         ("PodDisruptionBudget", "dfa-worker"),
                         ("NetworkPolicy", "dfa-coordinator"), ("NetworkPolicy", "dfa-worker")):
                self.assertIn(want, kinds, overlay)
            for d in docs:
                if d["kind"] != "Namespace":
                    self.assertEqual(d["metadata"].get("namespace"), "dfa", d["metadata"]["name"])

    def test_services_select_their_pods(self):
        for overlay, docs in self.rendered.items():
            sts = by_kind(docs, "StatefulSet", "dfa-worker")[0]
            dep = by_kind(docs, "Deployment", "dfa-coordinator")[0]
            headless = by_kind(docs, "Service", sts["spec"]["serviceName"])
            self.assertEqual(len(headless), 1, f"{overlay}: StatefulSet serviceName has no Service")
            self.assertEqual(headless[0]["spec"].get("clusterIP"), "None", "worker Service not headless")
            # Workers register through the coordinator's Service before either side is ready
            # (a coordinator is ready once a worker holds a lease): both publish not-ready pods.
            for svc in (headless[0], by_kind(docs, "Service", "dfa-coordinator")[0]):
                self.assertIs(svc["spec"].get("publishNotReadyAddresses"), True,
                              f"{overlay}: Service {svc['metadata']['name']}")
            for svc, wl in ((headless[0], sts), (by_kind(docs, "Service", "dfa-coordinator")[0], dep)):
                labels = wl["spec"]["template"]["metadata"]["labels"]
                for k, v in svc["spec"]["selector"].items():
                    self.assertEqual(labels.get(k), v, f"{overlay}: {svc['metadata']['name']} selector")
                ports = {p["name"] for c in wl["spec"]["template"]["spec"]["containers"]
                         for p in c.get("ports", [])}
                for p in svc["spec"]["ports"]:
                    self.assertIn(p["targetPort"], ports, f"{overlay}: {svc['metadata']['name']}")
                # Workload selector must match its own template.
                for k, v in wl["spec"]["selector"]["matchLabels"].items():
                    self.assertEqual(labels.get(k), v)

    def test_containers_have_http_probes_resources_and_resolved_vars(self):
        for overlay, docs in self.rendered.items():
            configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
            for wl in by_kind(docs, "StatefulSet") + by_kind(docs, "Deployment"):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    where = f"{overlay} {wl['metadata']['name']}/{c['name']}"
                    ports = {p["containerPort"] for p in c["ports"]}
                    metrics = [p for p in c["ports"] if p["name"] == "metrics"][0]
                    # The daemons serve /healthz and /readyz on their metrics port (plain HTTP
                    # also in secure mode, where a kubelet could not pass the gRPC port's mTLS).
                    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                        self.assertEqual(set(c.get(probe, {})) & {"grpc", "tcpSocket", "exec"}, set(),
                                         f"{where}: {probe} is not an HTTP probe")
                        get = c[probe]["httpGet"]
                        self.assertEqual(get["path"], path, f"{where}: {probe}")
                        self.assertIn(get["port"], (metrics["name"], metrics["containerPort"]),
                                      f"{where}: {probe} not on the metrics port")
                        self.assertNotEqual(get.get("scheme", "HTTP"), "HTTPS", where)
                    # Liveness gives a restart more time than readiness gives an endpoint.
                    self.assertGreater(c["livenessProbe"]["periodSeconds"] *
                                       c["livenessProbe"]["failureThreshold"],
                                       c["readinessProbe"]["periodSeconds"] *
                                       c["readinessProbe"]["failureThreshold"], where)
                    for k in ("requests", "limits"):
                        self.assertIn("cpu", c["resources"][k], where)
                        self.assertIn("memory", c["resources"][k], where)
                    env = {e["name"] for e in c.get("env", [])}
                    self.assertIn(f"--metrics_port=$(METRICS_PORT)", c["args"], where)
                    flags = {}
                    for ref in c.get("envFrom", []):
                        name = ref["configMapRef"]["name"]
                        self.assertIn(name, configmaps, f"{where}: ConfigMap {name} not rendered")
                        flags.update(configmaps[name]["data"])
                    for arg in c.get("args", []) + c.get("command", []):
                        for var in re.findall(r"\$\((\w+)\)", arg):
                            self.assertTrue(var in env or var in flags, f"{where}: $({var}) undefined")
                    # Ports in the flags ConfigMap agree with the declared container ports.
                    for key in ("METRICS_PORT", "COORDINATOR_GRPC_PORT", "WORKER_GRPC_PORT"):
                        if f"$({key})" in " ".join(c.get("args", [])):
                            self.assertIn(int(flags[key]), ports, f"{where}: {key}")

    def test_gpu_workers_are_guaranteed_with_whole_cpus(self):
        # Exclusive cores under the static CPU manager need Guaranteed QoS and integer CPUs.
        docs = self.rendered["gpu"]
        for wl in by_kind(docs, "StatefulSet"):
            for c in wl["spec"]["template"]["spec"]["containers"]:
                res = c["resources"]
                if "nvidia.com/gpu" not in res.get("limits", {}):
                    continue
                where = f"gpu {wl['metadata']['name']}/{c['name']}"
                for k in ("cpu", "memory"):
                    self.assertEqual(str(res["requests"][k]), str(res["limits"][k]), f"{where}: {k}")
                self.assertRegex(str(res["limits"]["cpu"]), r"^[0-9]+$", f"{where}: whole CPUs")

    def test_gpu_limits_only_in_gpu_overlay(self):
        for overlay, docs in self.rendered.items():
            sts = by_kind(docs, "StatefulSet", "dfa-worker")[0]
            res = sts["spec"]["template"]["spec"]["containers"][0]["resources"]
            flags = [d for d in by_kind(docs, "ConfigMap") if "WORKER_BACKEND" in d.get("data", {})][0]
            if overlay == "gpu":
                self.assertEqual(str(res["limits"].get("nvidia.com/gpu")), "1")
                self.assertEqual(flags["data"]["WORKER_BACKEND"], "cuda")
            else:
                self.assertNotIn("nvidia.com/gpu", res["limits"])
                self.assertEqual(flags["data"]["WORKER_BACKEND"], "cpu")
            coord = by_kind(docs, "Deployment", "dfa-coordinator")[0]
            self.assertNotIn("nvidia.com/gpu",
                             coord["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"])

    def test_coordinator_address_names_the_service(self):
        for overlay, docs in self.rendered.items():
            flags = [d for d in by_kind(docs, "ConfigMap") if "COORDINATOR_ADDRESS" in d.get("data", {})][0]
            host, port = flags["data"]["COORDINATOR_ADDRESS"].rsplit(":", 1)
            svc = by_kind(docs, "Service", host)
            self.assertEqual(len(svc), 1, f"{overlay}: no Service {host}")
            self.assertIn(int(port), [p["port"] for p in svc[0]["spec"]["ports"]])

    def test_podmonitor_structure(self):
        for overlay, docs in self.rendered.items():
            pm = by_kind(docs, "PodMonitor")[0]
            self.assertEqual(pm["apiVersion"], "monitoring.coreos.com/v1")
            spec = pm["spec"]
            self.assertEqual(set(spec) - {"jobLabel", "selector", "podMetricsEndpoints",
                                          "namespaceSelector", "podTargetLabels"}, set())
            sel = spec["selector"]["matchLabels"]
            self.assertTrue(sel)
            endpoints = spec["podMetricsEndpoints"]
            self.assertTrue(endpoints)
            for wl in by_kind(docs, "StatefulSet") + by_kind(docs, "Deployment"):
                labels = wl["spec"]["template"]["metadata"]["labels"]
                for k, v in sel.items():
                    self.assertEqual(labels.get(k), v, f"{overlay}: PodMonitor misses {wl['metadata']['name']}")
                self.assertIn(spec["jobLabel"], labels)
                self.assertTrue(labels[spec["jobLabel"]].startswith("dfa-"))
                ports = {p["name"] for c in wl["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
                for ep in endpoints:
                    self.assertEqual(set(ep) - {"port", "path", "interval", "scrapeTimeout",
                                                "relabelings", "metricRelabelings", "scheme"}, set())
                    self.assertIn(ep["port"], ports)
                    self.assertRegex(ep.get("interval", "30s"), r"^\d+(ms|s|m)$")

    def test_dashboard_configmap_is_the_dashboard(self):
        with open(os.path.join(REPO, "deploy", "grafana", "dashboard.json"), encoding="utf-8") as f:
            source = f.read()
        for overlay, docs in self.rendered.items():
            cm = by_kind(docs, "ConfigMap", "dfa-grafana-dashboard")[0]
            self.assertEqual(cm["metadata"]["labels"].get("grafana_dashboard"), "1")
            self.assertEqual(list(cm["data"].values()), [source], f"{overlay}: dashboard differs")


class HardeningTest(unittest.TestCase):
    """What issue-level operability asks of the manifests beyond schema validity."""

    @classmethod
    def setUpClass(cls):
        cls.rendered = {}
        if shutil.which("kubectl"):
            cls.rendered = {o: render(o) for o in OVERLAYS}
        cls.flags = daemon_flags()

    def test_rendered(self):
        self.assertEqual(set(self.rendered), set(OVERLAYS), "kubectl missing: run ./dfa.sh setup")

    def test_every_flag_exists_in_its_daemon(self):
        for overlay, docs in self.rendered.items():
            for wl in workloads(docs):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    binary = os.path.basename(c["command"][0])
                    self.assertIn(binary, self.flags, f"{overlay}: unknown program {binary}")
                    for arg in c["args"]:
                        m = re.fullmatch(r"--(\w+)=.*", arg)
                        self.assertIsNotNone(m, f"{overlay} {binary}: {arg!r} is not --flag=value")
                        self.assertIn(m.group(1), self.flags[binary],
                                      f"{overlay}: {binary} has no flag --{m.group(1)}")
                    names = [re.match(r"--(\w+)", a).group(1) for a in c["args"]]
                    self.assertEqual(len(names), len(set(names)), f"{overlay} {binary}: repeated flag")

    def test_every_configmap_key_feeds_a_flag(self):
        for overlay, docs in self.rendered.items():
            (flags,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("dfa-flags")]
            self.assertNotIn("HEARTBEAT_INTERVAL_MS", flags["data"])
            used = set()
            for wl in workloads(docs):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    args = " ".join(c["args"])
                    refs = set(re.findall(r"\$\((\w+)\)", args))
                    if any(r["configMapRef"]["name"] == flags["metadata"]["name"]
                           for r in c.get("envFrom", [])):
                        used |= refs & set(flags["data"])
                    for e in c.get("env", []):
                        ref = e.get("valueFrom", {}).get("configMapKeyRef")
                        if ref and ref["name"] == flags["metadata"]["name"] and e["name"] in refs:
                            used.add(ref["key"])
            self.assertEqual(set(flags["data"]) - used, set(),
                             f"{overlay}: ConfigMap keys that feed no flag")
            # The lease the coordinator gives workers (they heartbeat at a third of it).
            coord = by_kind(docs, "Deployment", "dfa-coordinator")[0]
            self.assertEqual(flag_values(coord["spec"]["template"]["spec"]["containers"][0])["lease_ms"],
                             "$(LEASE_MS)")

    def test_threads_and_memory_from_the_container(self):
        for overlay, docs in self.rendered.items():
            sts = by_kind(docs, "StatefulSet", "dfa-worker")[0]
            (c,) = sts["spec"]["template"]["spec"]["containers"]
            f = flag_values(c)
            threads = env_source(c, var_of(f["threads"]))
            self.assertIsNotNone(threads, f"{overlay}: --threads is not $(VAR) of an env var")
            ref = threads["valueFrom"]["resourceFieldRef"]
            self.assertEqual((ref["resource"], ref.get("containerName"), str(ref.get("divisor", "1"))),
                             ("limits.cpu", c["name"], "1"), overlay)
            memory = env_source(c, var_of(f["memory_limit_bytes"]))
            self.assertIsNotNone(memory, f"{overlay}: --memory_limit_bytes is not $(VAR)")
            res = c["resources"]
            shm = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm"][0]
            self.assertEqual(shm["emptyDir"].get("medium"), "Memory")
            if overlay == "gpu":
                # A GPU worker's limit is its device memory pool, from the ConfigMap.
                self.assertEqual(memory["valueFrom"]["configMapKeyRef"]["key"],
                                 "WORKER_DEVICE_MEMORY_BYTES")
                continue
            ref = memory["valueFrom"]["resourceFieldRef"]
            self.assertEqual((ref["resource"], ref.get("containerName"), str(ref.get("divisor", "1"))),
                             ("requests.memory", c["name"], "1"), overlay)
            # Sessions (the request) + /dev/shm (memory-backed, charged to the pod) + 1 GiB for
            # the process fit the limit: the kernel never has to kill a worker that kept its budget.
            need = (km.quantity(res["requests"]["memory"]) + km.quantity(shm["emptyDir"]["sizeLimit"])
                    + 2 ** 30)
            self.assertLessEqual(need, km.quantity(res["limits"]["memory"]),
                                 f"{overlay}: sessions + /dev/shm + 1 GiB exceed the memory limit")
            self.assertGreaterEqual(km.quantity(res["limits"]["cpu"]), 1)

    def test_disruption_budgets_cover_the_workloads(self):
        for overlay, docs in self.rendered.items():
            pdbs = by_kind(docs, "PodDisruptionBudget")
            for wl in workloads(docs):
                labels = wl["spec"]["template"]["metadata"]["labels"]
                mine = [p for p in pdbs if km.selects(p["spec"]["selector"], labels)]
                self.assertEqual(len(mine), 1, f"{overlay}: {wl['metadata']['name']} has {len(mine)} PDBs")
                spec = mine[0]["spec"]
                if wl["kind"] == "StatefulSet":
                    self.assertEqual(spec.get("maxUnavailable"), 1, f"{overlay}: one worker at a time")
                else:
                    # The only coordinator is not evicted while it serves; a broken one may be.
                    self.assertEqual(spec.get("minAvailable"), 1)
                    self.assertEqual(spec.get("unhealthyPodEvictionPolicy"), "AlwaysAllow")

    def test_network_policies_admit_exactly_the_intended_peers(self):
        for overlay, docs in self.rendered.items():
            policies = by_kind(docs, "NetworkPolicy")
            coord = km.Pod.of(by_kind(docs, "Deployment", "dfa-coordinator")[0])
            worker = km.Pod.of(by_kind(docs, "StatefulSet", "dfa-worker")[0])
            port = lambda pod, name: [p["containerPort"] for p in pod.ports if p["name"] == name][0]
            client = km.Pod("apps", {"dfa-client": "true"})
            stranger = km.Pod("dfa", {"app": "debug"})
            outsider = km.Pod("apps", {"app": "web"})
            prometheus = km.Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
            for pod in (coord, worker):
                self.assertTrue(km.isolated(policies, pod), f"{overlay}: {pod.labels} not isolated")
            allowed = [
                (client, coord, port(coord, "grpc")), (client, worker, port(worker, "grpc")),
                (worker, coord, port(coord, "grpc")), (coord, worker, port(worker, "grpc")),
                (worker, worker, port(worker, "grpc")), (worker, worker, 41000),  # UCX, NCCL
                (prometheus, coord, port(coord, "metrics")),
                (prometheus, worker, port(worker, "metrics")),
            ]
            denied = [
                (stranger, coord, port(coord, "grpc")), (stranger, worker, port(worker, "grpc")),
                (outsider, coord, port(coord, "grpc")), (outsider, worker, port(worker, "metrics")),
                (client, worker, 41000), (client, coord, port(coord, "metrics")),
                (prometheus, coord, port(coord, "grpc")), (prometheus, worker, port(worker, "grpc")),
                (coord, worker, 41000),
            ]
            for src, dst, p in allowed:
                self.assertTrue(km.ingress_allowed(policies, src, dst, p),
                                f"{overlay}: {src.labels}@{src.namespace} -> {dst.labels}:{p} refused")
            for src, dst, p in denied:
                self.assertFalse(km.ingress_allowed(policies, src, dst, p),
                                 f"{overlay}: {src.labels}@{src.namespace} -> {dst.labels}:{p} admitted")

    def test_pods_meet_the_restricted_profile(self):
        for overlay, docs in self.rendered.items():
            (ns,) = by_kind(docs, "Namespace")
            self.assertEqual(ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce"),
                             "restricted", overlay)
            for wl in workloads(docs):
                spec = wl["spec"]["template"]["spec"]
                where = f"{overlay} {wl['metadata']['name']}"
                ctx = spec["securityContext"]
                self.assertEqual(ctx.get("seccompProfile"), {"type": "RuntimeDefault"}, where)
                self.assertIs(ctx.get("runAsNonRoot"), True, where)
                self.assertNotEqual(ctx.get("runAsUser"), 0, where)
                self.assertIs(spec.get("automountServiceAccountToken"), False, where)
                for key in ("hostNetwork", "hostPID", "hostIPC"):
                    self.assertFalse(spec.get(key, False), where)
                for v in spec.get("volumes", []):
                    self.assertNotIn("hostPath", v, where)
                for c in spec["containers"]:
                    sc = c["securityContext"]
                    self.assertIs(sc.get("allowPrivilegeEscalation"), False, where)
                    self.assertIs(sc.get("readOnlyRootFilesystem"), True, where)
                    self.assertEqual(sc.get("capabilities"), {"drop": ["ALL"]}, where)
                    self.assertFalse(sc.get("privileged", False), where)

    def test_secure_mode_reads_tls_and_tokens_from_secrets(self):
        for overlay, docs in self.rendered.items():
            secure = 0
            for wl in workloads(docs):
                spec = wl["spec"]["template"]["spec"]
                (c,) = spec["containers"]
                where = f"{overlay} {wl['metadata']['name']}"
                f = flag_values(c)
                tls = {k: f[k] for k in ("tls_cert", "tls_key", "tls_ca") if k in f}
                if overlay == "gpu":
                    self.assertEqual(len(tls), 3, f"{where}: not in secure mode")
                    self.assertIn("worker_token_file", f, where)
                if not tls:
                    continue
                self.assertEqual(len(tls), 3, f"{where}: --tls_cert/--tls_key/--tls_ca go together")
                secure += 1
                secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
                mounts = {m["mountPath"]: m for m in c["volumeMounts"]}

                def secret_file(path, secret_name):
                    mount = [m for m in mounts.values() if path.startswith(m["mountPath"] + "/")]
                    self.assertEqual(len(mount), 1, f"{where}: {path} is on no mount")
                    self.assertIs(mount[0].get("readOnly"), True, f"{where}: {path} writable")
                    volume = secrets.get(mount[0]["name"])
                    self.assertIsNotNone(volume, f"{where}: {path} is not from a Secret")
                    self.assertEqual(volume["secretName"], secret_name, where)
                    key = path[len(mount[0]["mountPath"]) + 1:]
                    items = [i["path"] for i in volume.get("items", [])]
                    self.assertTrue(not items or key in items, f"{where}: {key} not projected")
                    # Readable by the daemon's group (fsGroup), by nobody else.
                    self.assertEqual(volume.get("defaultMode", 0o644) & 0o007, 0, where)
                    self.assertEqual(spec["securityContext"].get("fsGroup"),
                                     spec["securityContext"]["runAsGroup"], where)
                    return key

                self.assertEqual({k: secret_file(v, "dfa-tls") for k, v in tls.items()},
                                 {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"})
                self.assertEqual(secret_file(f["worker_token_file"], "dfa-tokens"), "worker-token")
                if wl["kind"] == "Deployment":
                    # The coordinator's client token: a file from the Secret as well.
                    self.assertIn("auth_token_file", f, f"{where}: no --auth_token_file")
                    self.assertEqual(secret_file(f["auth_token_file"], "dfa-tokens"), "auth-token")
                else:
                    # Workers check no client token: theirs is the only one they can read.
                    tokens = [v["secret"] for v in spec["volumes"]
                              if v.get("secret", {}).get("secretName") == "dfa-tokens"]
                    for t in tokens:
                        self.assertEqual([i["key"] for i in t.get("items", [])], ["worker-token"],
                                         f"{where}: the worker's token volume carries other keys")
                self.assert_secrets_only_as_files(c, where)
            if overlay == "gpu":
                self.assertEqual(secure, 2, "gpu: coordinator and workers in secure mode")

    def assert_secrets_only_as_files(self, c, where):
        """No secret on a command line or in an environment variable: each token flag is given
        as its *_file (a mounted Secret); no env entry or envFrom draws on a Secret."""
        f = flag_values(c)
        for flag in ("auth_token", "worker_token"):
            self.assertNotIn(flag, f, f"{where}: --{flag} as a value, not --{flag}_file")
        for arg in c.get("args", []) + c.get("command", []):
            self.assertNotRegex(arg, r"--(auth|worker)_token=", f"{where}: token in a flag: {arg}")
        for e in c.get("env", []):
            self.assertNotIn("secretKeyRef", e.get("valueFrom", {}),
                             f"{where}: env {e['name']} carries a Secret")
        for e in c.get("envFrom", []):
            self.assertNotIn("secretRef", e, f"{where}: envFrom a Secret")

    def test_every_secret_flag_has_a_file_form(self):
        """Each secret a daemon or the CLI takes as a value can be given as a file instead
        (Kubernetes Secrets are mounted files): --X_token has --X_token_file in the daemon's
        main.cc; the dfa CLI's --auth-token has --auth-token-file, python -m dfa's too."""
        for daemon in ("coordinator", "worker"):
            with open(os.path.join(REPO, daemon, "main.cc")) as fh:
                flags = set(re.findall(r"ABSL_FLAG\(\s*[\w:]+\s*,\s*(\w+)", fh.read()))
            secrets = {f for f in flags if f.endswith("_token")}
            self.assertTrue(secrets, f"dfa-{daemon}: no token flag found")
            for flag in secrets:
                self.assertIn(flag + "_file", flags, f"dfa-{daemon} --{flag} has no --{flag}_file")
        with open(os.path.join(REPO, "client", "cli", "job_flags.cc")) as fh:
            cli = fh.read()
        self.assertIn('"auth-token-file"', cli, "dfa: --auth-token has no --auth-token-file")
        with open(os.path.join(REPO, "client", "python", "dfa", "__main__.py")) as fh:
            py = fh.read()
        self.assertIn('"--auth-token-file"', py, "python -m dfa: no --auth-token-file")

    def test_no_workload_passes_a_secret_by_value(self):
        for overlay, docs in self.rendered.items():
            for wl in workloads(docs):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    self.assert_secrets_only_as_files(c, f"{overlay} {wl['metadata']['name']}")

    def test_gpu_workers_stay_on_one_nvlink_island(self):
        for overlay, docs in self.rendered.items():
            sts = by_kind(docs, "StatefulSet", "dfa-worker")[0]
            affinity = sts["spec"]["template"]["spec"].get("affinity", {})
            if overlay != "gpu":
                self.assertNotIn("podAffinity", affinity, overlay)
                continue
            terms = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            labels = sts["spec"]["template"]["metadata"]["labels"]
            together = [t for t in terms if km.selects(t["labelSelector"], labels)
                        and t["topologyKey"] in ("kubernetes.io/hostname", "nvidia.com/gpu.clique")]
            self.assertEqual(len(together), 1, f"gpu: no required affinity of the workers: {terms}")
            # One HGX node holds 8 GPUs: the island fits the replicas.
            self.assertLessEqual(sts["spec"]["replicas"], 8)

    def test_images_name_a_registry_and_a_version(self):
        for overlay, docs in self.rendered.items():
            for wl in workloads(docs):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    image = c["image"]
                    m = re.fullmatch(r"([a-z0-9.-]+(?::\d+)?)/([a-z0-9._/-]+)(?::([\w.-]+)|@sha256:[0-9a-f]{64})",
                                     image)
                    self.assertIsNotNone(m, f"{overlay}: image {image!r} names no registry/tag")
                    self.assertRegex(m.group(1), r"[.:]|^localhost$", f"{overlay}: {image}: no registry")
                    self.assertTrue(m.group(3) is None or m.group(3).endswith(
                        "-cuda" if overlay == "gpu" else "-cpu"), f"{overlay}: {image}")


class GpuIpcOverlayTest(unittest.TestCase):
    """deploy/k8s/overlays/gpu-ipc: the gpu overlay plus what CUDA IPC from training pods of the
    same node needs (hostIPC on the workers, the namespace's profile allowing it, workers
    preferring the IPC clients' node, a device memory limit leaving the GPU's rest to them)."""

    @classmethod
    def setUpClass(cls):
        cls.docs = render("gpu-ipc") if shutil.which("kubectl") else []
        cls.gpu = render("gpu") if shutil.which("kubectl") else []

    def setUp(self):
        if not self.docs:
            self.skipTest("kubectl missing (test_tools_present reports it)")

    def test_only_the_workers_share_the_host_ipc_namespace(self):
        for wl in workloads(self.docs):
            spec = wl["spec"]["template"]["spec"]
            want = wl["metadata"]["name"] == "dfa-worker"
            self.assertIs(spec.get("hostIPC", False), want, wl["metadata"]["name"])
            self.assertFalse(spec.get("hostPID", False) or spec.get("hostNetwork", False))

    def test_namespace_allows_host_ipc_and_still_reports_restricted(self):
        (ns,) = by_kind(self.docs, "Namespace")
        labels = ns["metadata"]["labels"]
        self.assertEqual(labels["pod-security.kubernetes.io/enforce"], "privileged")
        self.assertEqual(labels["pod-security.kubernetes.io/warn"], "restricted")
        self.assertEqual(labels["pod-security.kubernetes.io/audit"], "restricted")

    def test_everything_but_host_ipc_is_the_gpu_overlays(self):
        def strip(docs):
            out = []
            for d in docs:
                d = yaml.safe_load(yaml.safe_dump(d))
                if d["kind"] == "Namespace":
                    d["metadata"]["labels"] = {k: v for k, v in d["metadata"]["labels"].items()
                                               if not k.startswith("pod-security")}
                if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("dfa-flags"):
                    d["data"].pop("WORKER_DEVICE_MEMORY_LIMIT", None)
                    d["metadata"]["name"] = "dfa-flags"
                if d["kind"] in ("Deployment", "StatefulSet"):
                    spec = d["spec"]["template"]["spec"]
                    spec.pop("hostIPC", None)
                    spec.get("affinity", {}).get("podAffinity", {}).pop(
                        "preferredDuringSchedulingIgnoredDuringExecution", None)
                    for c in spec["containers"]:
                        c["args"] = [a for a in c["args"]
                                     if not a.startswith("--device_memory_limit=")]
                        for e in c.get("envFrom", []):
                            if e.get("configMapRef", {}).get("name", "").startswith("dfa-flags"):
                                e["configMapRef"]["name"] = "dfa-flags"
                        for e in c.get("env", []):
                            ref = e.get("valueFrom", {}).get("configMapKeyRef")
                            if ref and ref["name"].startswith("dfa-flags"):
                                ref["name"] = "dfa-flags"
                out.append(d)
            return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))
        self.assertEqual(strip(self.docs), strip(self.gpu))

    def test_workers_limit_device_memory_by_a_flag_of_the_worker(self):
        sts = by_kind(self.docs, "StatefulSet", "dfa-worker")[0]
        (c,) = sts["spec"]["template"]["spec"]["containers"]
        f = flag_values(c)
        self.assertIn("device_memory_limit", daemon_flags()["dfa-worker"])
        self.assertEqual(f["device_memory_limit"], "$(WORKER_DEVICE_MEMORY_LIMIT)")
        (flags,) = [d for d in by_kind(self.docs, "ConfigMap")
                    if d["metadata"]["name"].startswith("dfa-flags")]
        self.assertEqual([e["configMapRef"]["name"] for e in c["envFrom"]],
                         [flags["metadata"]["name"]])
        limit = float(flags["data"]["WORKER_DEVICE_MEMORY_LIMIT"])
        self.assertTrue(0 < limit < 1, "a fraction leaves the GPU's rest to the training pod")

    def test_workers_prefer_the_ipc_clients_node_and_keep_their_island(self):
        sts = by_kind(self.docs, "StatefulSet", "dfa-worker")[0]
        aff = sts["spec"]["template"]["spec"]["affinity"]["podAffinity"]
        (pref,) = aff["preferredDuringSchedulingIgnoredDuringExecution"]
        term = pref["podAffinityTerm"]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertTrue(km.selects(term["labelSelector"], {"dfa-cuda-ipc-client": "true"}))
        labels = sts["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(any(km.selects(t["labelSelector"], labels)
                            for t in aff["requiredDuringSchedulingIgnoredDuringExecution"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
