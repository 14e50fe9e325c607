"""Reads deploy/grafana/dashboard.json and turns its panels' queries into plain PromQL.

Shared by the deploy tests (dashboard_test.py checks them offline, cluster_test.py runs them
against a real Prometheus). Grafana variables are substituted the way Grafana would for a
dashboard showing everything: $__rate_interval becomes a window of a few scrape intervals,
$cluster, $namespace, $job and $worker regexes matching every value (Grafana's "All", ".*"),
unless a test asks for particular values.
"""

import json
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "dashboard.json")
METRICS_DOC = os.path.join(REPO, "docs", "metrics.md")

# The variables every series selector of every query must use (Grafana's multi-value regexes),
# so that a dashboard on a Prometheus holding several deployments shows one at a time.
SCOPE_VARIABLES = ("cluster", "namespace", "job")
# Template variables a query may use besides Grafana's $__ ones.
QUERY_VARIABLES = SCOPE_VARIABLES + ("worker",)
# Series names a query may read: ours and the standard process metrics.
SERIES = re.compile(r"\b((?:dfa|process)_[a-z0-9_]+|up)\b(?![(_])")


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


def substitute(expr, rate_interval="15s", worker_regex=".*", **values):
    """PromQL with Grafana's variables replaced; raises ValueError on an unknown variable.

    values: regexes for cluster, namespace and job (default ".*", Grafana's "All").
    """
    s = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    s = s.replace("$__range", rate_interval)
    fill = {name: values.pop(name, ".*") for name in SCOPE_VARIABLES}
    fill["worker"] = worker_regex
    if values:
        raise ValueError(f"unknown variable value(s) {sorted(values)}")
    for name, value in fill.items():
        s = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", lambda _: value, s)
    left = re.findall(r"\$\{?[A-Za-z_]\w*\}?", s)
    if left:
        raise ValueError(f"unknown Grafana variable(s) {left} in: {expr}")
    return s


def documented_metrics(path=METRICS_DOC):
    """Metric base names from the contract tables of docs/metrics.md: {name: type}."""
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*`((?:dfa|process)_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|", line)
            if m:
                names[m.group(1)] = m.group(2)
    return names


def referenced_metrics(expr):
    """dfa_* and process_* series names an expression reads (histogram suffixes kept)."""
    return {m.group(1) for m in SERIES.finditer(expr)} - {"up"}


def selectors(expr):
    """(series name, label matchers text) for every series selector of an expression, `up`
    included; the text is "" for a bare name."""
    out = []
    for m in SERIES.finditer(expr):
        rest = expr[m.end():]
        inner = ""
        if rest.startswith("{"):
            inner = rest[1:rest.index("}")]
        out.append((m.group(1), inner))
    return out


def base_name(series, documented):
    """Maps a series name (possibly with a histogram suffix) to its documented metric, or None."""
    if series in documented:
        return series
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and documented.get(series[: -len(suffix)]) == "histogram":
            return series[: -len(suffix)]
    return None
