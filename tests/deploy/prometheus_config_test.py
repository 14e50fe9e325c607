#!/usr/bin/env python3
"""Checks deploy/prometheus/ with Prometheus' own promtool.

Rules: `promtool check rules`, then the rule unit tests in rules_test.yml. Local config: copied
with its rules into a temp dir, target files written as deploy/local/cluster.sh writes them, then
`promtool check config`. Kubernetes config: Debian builds Prometheus without Kubernetes service
discovery, so promtool here is given the same file with kubernetes_sd_configs swapped for a
static target (everything else checked by promtool), and the relabelling is checked against the
labels and port names the manifests in deploy/k8s really put on the pods.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROM = os.path.join(REPO, "deploy", "prometheus")


def promtool(*args, cwd=None):
    tool = shutil.which("promtool")
    if tool is None:
        raise AssertionError("promtool missing: run ./dfa.sh setup (Debian package prometheus)")
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


class PrometheusConfigTest(unittest.TestCase):
    def test_rules_check(self):
        r = promtool("check", "rules", os.path.join(PROM, "dfa-rules.yml"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_rules_unit_tests(self):
        r = promtool("test", "rules", "rules_test.yml", cwd=HERE)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout)

    def test_local_config(self):
        with open(os.path.join(PROM, "prometheus-local.yml")) as f:
            text = f.read()
        self.assertNotRegex(text, r"127\.0\.0\.1:\d+|localhost:\d+", "ports must come from file_sd")
        cfg = yaml.safe_load(text)
        jobs = {s["job_name"]: s for s in cfg["scrape_configs"]}
        self.assertEqual(set(jobs), {"dfa-coordinator", "dfa-worker"})
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(PROM, "prometheus-local.yml"), tmp)
            shutil.copy(os.path.join(PROM, "dfa-rules.yml"), tmp)
            for job in jobs.values():
                for sd in job["file_sd_configs"]:
                    for path in sd["files"]:
                        full = os.path.join(tmp, path)
                        os.makedirs(os.path.dirname(full), exist_ok=True)
                        with open(full, "w") as f:
                            json.dump([{"targets": ["127.0.0.1:9400"]}], f)
            r = promtool("check", "config", os.path.join(tmp, "prometheus-local.yml"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_k8s_config(self):
        with open(os.path.join(PROM, "prometheus-k8s.yml")) as f:
            cfg = yaml.safe_load(f)
        self.assertEqual(cfg["rule_files"], ["dfa-rules.yml"])
        (job,) = cfg["scrape_configs"]
        self.assertEqual(job["kubernetes_sd_configs"], [{"role": "pod"}])
        # The rest of the file through promtool, with a static target in place of Kubernetes SD.
        stripped = dict(cfg, scrape_configs=[
            dict({k: v for k, v in job.items() if k != "kubernetes_sd_configs"},
                 static_configs=[{"targets": ["127.0.0.1:9400"]}])])
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(PROM, "dfa-rules.yml"), tmp)
            path = os.path.join(tmp, "prometheus-k8s.yml")
            with open(path, "w") as f:
                yaml.safe_dump(stripped, f)
            r = promtool("check", "config", path)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # The relabelling keeps what deploy/k8s labels its pods with.
        kubectl = shutil.which("kubectl")
        self.assertIsNotNone(kubectl, "kubectl missing: run ./dfa.sh setup")
        out = subprocess.run([kubectl, "kustomize", os.path.join(REPO, "deploy/k8s/overlays/cpu")],
                             capture_output=True, text=True, check=True, timeout=120).stdout
        workloads = [d for d in yaml.safe_load_all(out)
                     if d and d["kind"] in ("Deployment", "StatefulSet")]
        self.assertEqual(len(workloads), 2)
        keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"]
                if r.get("action") == "keep"}
        jobrule = [r for r in job["relabel_configs"] if r.get("target_label") == "job"][0]
        jobs = set()
        for wl in workloads:
            pod = wl["spec"]["template"]
            meta = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
                    for k, v in pod["metadata"]["labels"].items()}
            ports = [p["name"] for c in pod["spec"]["containers"] for p in c["ports"]]
            self.assertTrue(re.fullmatch(keep[("__meta_kubernetes_pod_label_app_kubernetes_io_part_of",)],
                                         meta["__meta_kubernetes_pod_label_app_kubernetes_io_part_of"]))
            self.assertEqual(sum(bool(re.fullmatch(keep[("__meta_kubernetes_pod_container_port_name",)], p))
                                 for p in ports), 1, wl["metadata"]["name"])
            value = meta[jobrule["source_labels"][0]]
            jobs.add(re.sub(jobrule["regex"], jobrule["replacement"].replace("$1", r"\1"), value))
        self.assertEqual(jobs, {"dfa-coordinator", "dfa-worker"})


if __name__ == "__main__":
    unittest.main(verbosity=2)
