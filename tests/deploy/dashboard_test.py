#!/usr/bin/env python3
"""Offline checks of the Grafana dashboard (deploy/grafana/dashboard.json).

Every panel has queries; every query reads only metrics documented in docs/metrics.md with
suffixes that fit their type; every series selector of every query is scoped by the cluster,
namespace and job variables (a Prometheus holding several deployments shows one at a time);
the error ratio is shown; every query parses as PromQL (promtool check rules on a generated
rule file); panel ids are unique; the variables are defined and chained. The same queries run
against a real Prometheus in cluster_test.py, with the variables at "All", at the local
cluster's values and at values that match nothing.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_queries as dq  # noqa: E402


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dash = dq.load_dashboard()
        cls.documented = dq.documented_metrics()

    def test_metrics_doc_has_contract_table(self):
        self.assertGreaterEqual(len(self.documented), 10, "docs/metrics.md table not parsed")

    def test_every_panel_has_a_query(self):
        ps = dq.panels(self.dash)
        self.assertGreater(len(ps), 10)
        for p in ps:
            self.assertTrue(p.get("targets"), f"panel '{p.get('title')}' has no targets")
            for t in p["targets"]:
                self.assertTrue(t.get("expr", "").strip(), f"panel '{p['title']}' has an empty expr")
                self.assertEqual(t["datasource"]["uid"], "${datasource}", p["title"])

    def test_panel_ids_unique(self):
        ids = [p["id"] for p in self.dash["panels"]] + [
            q["id"] for p in self.dash["panels"] for q in p.get("panels", [])]
        self.assertEqual(len(ids), len(set(ids)), "duplicate panel ids")

    def test_variables_defined(self):
        names = {v["name"]: v for v in self.dash["templating"]["list"]}
        self.assertEqual(names["datasource"]["type"], "datasource")
        self.assertEqual(names["datasource"]["query"], "prometheus")
        worker = names["worker"]
        self.assertIn("dfa_worker_", worker["definition"])
        self.assertTrue(worker["includeAll"])
        # cluster -> namespace -> job -> worker: each lists the values within the ones before.
        order = [v["name"] for v in self.dash["templating"]["list"]]
        self.assertEqual(order, ["datasource", "cluster", "namespace", "job", "worker"])
        for i, name in enumerate(dq.QUERY_VARIABLES):
            var = names[name]
            with self.subTest(variable=name):
                self.assertEqual(var["type"], "query")
                self.assertEqual(var["datasource"]["uid"], "${datasource}")
                self.assertEqual(var["definition"], var["query"]["query"])
                self.assertRegex(var["definition"], r"^label_values\((dfa|process)_\w+.*, " + name + r"\)$")
                # "All" is a regex that also matches an absent label (one Prometheus, no cluster).
                self.assertTrue(var["includeAll"] and var["multi"])
                self.assertEqual(var["allValue"], ".*")
                for before in dq.QUERY_VARIABLES[:i]:
                    self.assertIn(f'{before}=~"${before}"', var["definition"])

    def test_every_selector_is_scoped(self):
        # 28 of 29 queries once summed every cluster of a Prometheus; now none may.
        count = 0
        for title, ref, expr in dq.queries(self.dash):
            sels = dq.selectors(expr)
            self.assertTrue(sels, f"panel '{title}' {ref} reads no series: {expr}")
            for series, matchers in sels:
                count += 1
                for var in dq.SCOPE_VARIABLES:
                    self.assertIn(f'{var}=~"${var}"', matchers,
                                  f"panel '{title}' {ref}: {series} not filtered by ${var}")
                if series.startswith("dfa_worker_") or series.startswith("dfa_transport_"):
                    self.assertIn('worker=~"$worker"', matchers,
                                  f"panel '{title}' {ref}: {series} ignores $worker")
        self.assertGreater(count, 40)

    def test_error_ratio_panels(self):
        ratios = [(t, ref, e) for t, ref, e in dq.queries(self.dash) if "Error ratio" in t]
        self.assertGreaterEqual(len(ratios), 3, "no error-ratio panels")
        for component in ("coordinator", "worker"):
            name = f"dfa_{component}_requests_total"
            self.assertTrue(any(f'{name}{{' in e and 'code!="OK"' in e and
                                re.search(r"\)\s*/\s*\(?\s*sum", e) for _, _, e in ratios),
                            f"no error ratio over {name}")
        units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in dq.panels(self.dash)}
        self.assertEqual(units["Error ratio"], "percentunit")
        self.assertEqual(units["Error ratio by RPC"], "percentunit")

    def test_queries_use_documented_metrics(self):
        used = set()
        for title, ref, expr in dq.queries(self.dash):
            for series in dq.referenced_metrics(expr):
                base = dq.base_name(series, self.documented)
                self.assertIsNotNone(
                    base, f"panel '{title}' {ref}: {series} is not in docs/metrics.md "
                    "(or a histogram suffix on a non-histogram)")
                used.add(base)
        # The issue's required views: throughput, idle, latency, transport, sessions, memory,
        # errors, live workers, queue depth.
        for needed in ("dfa_worker_attention_flops_total", "dfa_coordinator_attention_flops_total",
                       "dfa_worker_step_idle_seconds", "dfa_worker_step_busy_seconds",
                       "dfa_coordinator_job_latency_seconds", "dfa_transport_sent_bytes_total",
                       "dfa_transport_received_bytes_total", "dfa_worker_sessions",
                       "dfa_worker_memory_used_bytes", "dfa_grpc_errors_total",
                       "dfa_coordinator_live_workers", "dfa_coordinator_queue_depth",
                       "dfa_coordinator_requests_total", "dfa_worker_requests_total",
                       "dfa_build_info", "process_cpu_seconds_total",
                       "process_resident_memory_bytes", "process_open_fds"):
            self.assertIn(needed, used, f"no panel shows {needed}")

    def test_counters_only_through_rate(self):
        for title, ref, expr in dq.queries(self.dash):
            for series in dq.referenced_metrics(expr):
                if series.endswith("_total") or series.endswith("_bucket"):
                    self.assertRegex(expr, r"rate\(\s*" + series,
                                     f"panel '{title}' {ref} reads counter {series} without rate()")

    def test_queries_parse_as_promql(self):
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool missing: run ./dfa.sh setup")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "panels.yml")
            with open(path, "w") as f:
                f.write("groups:\n  - name: dashboard\n    rules:\n")
                for i, (title, ref, expr) in enumerate(dq.queries(self.dash)):
                    promql = dq.substitute(expr).replace("'", "''")
                    f.write(f"      - record: dashboard:panel{i}\n        expr: '{promql}'\n")
            r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_substitute_rejects_unknown_variables(self):
        self.assertEqual(dq.substitute('rate(x{w=~"$worker"}[$__rate_interval])', "9s", "a|b"),
                         'rate(x{w=~"a|b"}[9s])')
        self.assertEqual(dq.substitute('x{c=~"$cluster",n=~"${namespace}",j=~"$job"}',
                                       cluster="local", job="dfa-worker"),
                         'x{c=~"local",n=~".*",j=~"dfa-worker"}')
        with self.assertRaises(ValueError):
            dq.substitute("rate(x[$nope])")
        with self.assertRaises(ValueError):
            dq.substitute("x", pod="p")

    def test_selectors_see_every_series(self):
        self.assertEqual(dq.selectors('sum(rate(dfa_a_total{x="1"}[5m])) / sum(up) + '
                                      'process_open_fds'),
                         [("dfa_a_total", 'x="1"'), ("up", ""), ("process_open_fds", "")])


if __name__ == "__main__":
    unittest.main(verbosity=2)
