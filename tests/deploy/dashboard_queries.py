"""Reads deploy/grafana/dashboard.json and turns its panels' queries into plain PromQL.

Shared by the deploy tests (dashboard_test.py checks them offline, cluster_test.py runs them
against a real Prometheus). Grafana variables are substituted the way Grafana would for a
dashboard showing all workers: $__rate_interval becomes a window of a few scrape intervals,
$worker a regex matching every worker.
"""

import json
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "dashboard.json")
METRICS_DOC = os.path.join(REPO, "docs", "metrics.md")

# Variables Grafana fills in and what they stand for when every worker is shown.
GRAFANA_VARIABLES = ("$__rate_interval", "$__interval", "$__range", "$worker", "${worker}")


def load_dashboard(path=DASHBOARD):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def panels(dashboard):
    """Every non-row panel, including those nested inside collapsed rows."""
    out = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def queries(dashboard):
    """(panel title, refId, raw expr) for every target of every panel."""
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            out.append((p.get("title", ""), t.get("refId", ""), t.get("expr", "")))
    return out


def substitute(expr, rate_interval="15s", worker_regex=".*"):
    """PromQL with Grafana's variables replaced; raises ValueError on an unknown variable."""
    s = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    s = s.replace("$__range", rate_interval)
    s = s.replace("${worker}", worker_regex).replace("$worker", worker_regex)
    left = re.findall(r"\$\{?[A-Za-z_]\w*\}?", s)
    if left:
        raise ValueError(f"unknown Grafana variable(s) {left} in: {expr}")
    return s


def documented_metrics(path=METRICS_DOC):
    """Metric base names from the contract table of docs/metrics.md: {name: type}."""
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*`(dfa_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|", line)
            if m:
                names[m.group(1)] = m.group(2)
    return names


def referenced_metrics(expr):
    """dfa_* series names an expression reads (with _bucket/_sum/_count suffixes kept)."""
    return set(re.findall(r"\bdfa_[a-z0-9_]+", expr))


def base_name(series, documented):
    """Maps a series name (possibly with a histogram suffix) to its documented metric, or None."""
    if series in documented:
        return series
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and documented.get(series[: -len(suffix)]) == "histogram":
            return series[: -len(suffix)]
    return None
