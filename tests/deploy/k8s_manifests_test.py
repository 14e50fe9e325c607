#!/usr/bin/env python3
"""Renders deploy/k8s/overlays/{cpu,gpu} with `kubectl kustomize` and validates them offline.

Built-in kinds are validated strictly (unknown fields rejected) against the Kubernetes JSON
schemas that the kubernetes-validate package ships, for the oldest Kubernetes we support (1.27:
native gRPC probes are GA there) and the newest the package knows. The PodMonitor (a CRD, no
schema shipped) gets a structural check here. Then the wiring: selectors match pod labels,
probes hit declared ports, $(VAR) references resolve, the dashboard ConfigMap is byte-identical
to deploy/grafana/dashboard.json, GPU limits only in the gpu overlay.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

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

    def test_containers_have_grpc_probes_resources_and_resolved_vars(self):
        for overlay, docs in self.rendered.items():
            configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
            for wl in by_kind(docs, "StatefulSet") + by_kind(docs, "Deployment"):
                for c in wl["spec"]["template"]["spec"]["containers"]:
                    where = f"{overlay} {wl['metadata']['name']}/{c['name']}"
                    ports = {p["containerPort"] for p in c["ports"]}
                    grpc_port = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"][0]
                    for probe in ("livenessProbe", "readinessProbe"):
                        self.assertIn("grpc", c.get(probe, {}), f"{where}: {probe} not a gRPC probe")
                        self.assertEqual(c[probe]["grpc"]["port"], grpc_port, where)
                        self.assertIn(c[probe]["grpc"]["port"], ports)
                    for k in ("requests", "limits"):
                        self.assertIn("cpu", c["resources"][k], where)
                        self.assertIn("memory", c["resources"][k], where)
                    env = {e["name"] for e in c.get("env", [])}
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
