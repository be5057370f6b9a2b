"""The shipped Grafana dashboard queries only series, labels and outcomes the app exports.

Every PromQL query of ``dashboards/leases.json`` (panel targets and template variables) is
tokenised: each metric selector must name a series ``leases.telemetry.metrics`` registers under the
configured namespace, each label it matches or groups by must be one of that metric's
labels, and each ``outcome`` it matches must be an outcome the engine counts. A panel whose
series does not exist yet must say so (``Pending`` in its description); none may be now
(the fence refusal panel's ``<namespace>_lease_fence_rejected_total{resource}`` arrived with
issue 20).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from leases.telemetry import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "leases.json"
PENDING_PANELS: set[str] = set()
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
FUNCTIONS_AND_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?|[A-Za-z_:][A-Za-z0-9_:]*'
                   r'|=~|!~|!=|==|>=|<=|[-+*/%^(){},=<>]')


def exported_series() -> dict[str, set[str]]:
    """Every series name leases.telemetry.metrics registers, with the labels it carries."""
    series = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            labels = set(metric._labelnames)
            for suffix in SUFFIXES[metric._type]:
                series[metric._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return series


def counted_outcomes() -> set[str]:
    """Every ``outcome`` the package spells as a literal (``outcome="busy"``, ``outcome = "granted"``)."""
    found = set()
    for path in (REPO / "leases").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "outcome" and isinstance(node.value, ast.Constant):
                found.add(node.value.value)
            elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                  and any(isinstance(t, ast.Name) and t.id == "outcome" for t in node.targets)):
                found.add(node.value.value)
    return found


def substitute(expr: str) -> str:
    """Grafana's variables as the server would see them (namespace: this app's)."""
    for name, value in (("namespace", metrics.NAMESPACE), ("resource", ".*"), ("__rate_interval", "5m"),
                        ("__interval", "1m"), ("__range", "1h")):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def parse(expr: str) -> tuple[list[tuple[str, dict[str, str]]], set[str]]:
    """The metric selectors (name, {label: matched value}) and grouping labels of a PromQL query."""
    tokens = [t for t in TOKEN.findall(expr) if not t.isspace()]
    assert "".join(tokens) == re.sub(r"\s+", "", expr), f"cannot tokenise {expr!r}"
    selectors, grouping, i = [], set(), 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in GROUPING and following == "(":
            close = tokens.index(")", i)
            grouping |= {t for t in tokens[i + 2:close] if t != ","}
            i = close + 1
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token) and following != "(" and following not in GROUPING \
                and token.lower() not in FUNCTIONS_AND_KEYWORDS:  # a function, or "sum by (...)", is no series
            matchers: dict[str, str] = {}
            i += 1
            if following == "{":
                close = tokens.index("}", i)
                body = [t for t in tokens[i + 1:close] if t != ","]
                for name, _op, value in zip(body[0::3], body[1::3], body[2::3], strict=True):
                    matchers[name] = json.loads(value)
                i = close + 1
            selectors.append((token, matchers))
        else:
            i += 1
    return selectors, grouping


def queries():
    """(where, query, panel) for every PromQL query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"], panel
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_]+)\)", query)
            assert inner, f"variable {variable['name']}: {query!r}"
            yield f"variable {variable['name']!r}", f"count by ({inner[2]}) ({inner[1]})", None


@pytest.mark.parametrize("where, expr, panel", list(queries()), ids=lambda v: v if isinstance(v, str) and
                         v.startswith(("panel", "variable")) else "")
def test_given_a_dashboard_query_then_it_names_series_labels_and_outcomes_the_app_exports(where, expr, panel):
    series, outcomes = exported_series(), counted_outcomes()
    selectors, grouping = parse(substitute(expr))
    assert selectors, f"{where}: no series in {expr!r}"
    known_labels: set[str] = set()
    for name, matchers in selectors:
        assert name.startswith(metrics.PREFIX), f"{where}: {name} is not a lease series of this namespace"
        if name not in series:
            assert panel is not None and panel["title"] in PENDING_PANELS \
                and panel["description"].startswith("Pending"), f"{where}: {name} is not exported ({sorted(series)})"
            continue
        assert set(matchers) <= series[name], f"{where}: {name} has no label {set(matchers) - series[name]}"
        assert matchers.get("outcome", "success") in outcomes, f"{where}: no code counts outcome {matchers['outcome']!r}"
        known_labels |= series[name]
    assert grouping <= known_labels or not known_labels, f"{where}: grouped by {grouping - known_labels}"


def test_given_the_dashboard_then_it_covers_the_issues_series_and_only_the_fence_panel_is_pending():
    dashboard = json.loads(DASHBOARD.read_text())
    named = {name for _, expr, _ in queries() for name, _ in parse(substitute(expr))[0]}
    prefix = metrics.PREFIX
    assert {f"{prefix}acquire_total", f"{prefix}wait_by_class_seconds_bucket", f"{prefix}waiting",
            f"{prefix}reap_total", f"{prefix}reconcile_total", f"{prefix}fence_rejected_total"} <= named
    pending = {p["title"] for p in dashboard["panels"] if p.get("description", "").startswith("Pending")}
    assert pending <= PENDING_PANELS
    namespace = next(v for v in dashboard["templating"]["list"] if v["name"] == "namespace")
    assert namespace["query"] == metrics.DEFAULT_NAMESPACE  # the dashboard's default is the app's


@pytest.mark.parametrize("expr, problem", [
    ('rate(vance_lease_acquire_totl{outcome="success"}[5m])', "is not exported"),
    ('rate(vance_lease_acquire_total{outcom="success"}[5m])', "has no label"),
    ('rate(vance_lease_acquire_total{outcome="sucess"}[5m])', "no code counts outcome"),
    ('sum by (tenant) (vance_lease_waiting)', "grouped by"),
])
def test_given_a_broken_query_then_the_check_names_the_problem(expr, problem):
    if metrics.NAMESPACE != "vance":
        pytest.skip("the broken queries spell the default namespace")
    with pytest.raises(AssertionError, match=problem):
        test_given_a_dashboard_query_then_it_names_series_labels_and_outcomes_the_app_exports(
            "query", expr, {"title": "x", "description": ""})
