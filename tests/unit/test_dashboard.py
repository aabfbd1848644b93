"""The chart's Grafana dashboard asks only for metrics the project exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_kubeflow import metrics

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts/dispatch-kubeflow/files/grafana-dashboard.json"
)
# PromQL words that look like names: aggregation modifiers and set operators.
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset"}
)  # fmt: skip
# What a metric name cannot be: strings, label matchers, ranges, grouping labels, variables,
# durations, and the label argument of Grafana's label_values(metric, label).
NOT_NAMES = re.compile(
    r'"(?:[^"\\]|\\.)*"|\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)'
    r"|\$\w+|\b\d+(?:ms|[smhdwy])\b|,\s*\w+\s*\)\s*$"
)
NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def targets(node: Any) -> Iterator[str]:
    """The ``expr`` of every query target, in panels and rows at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from targets(value)
    elif isinstance(node, list):
        for item in node:
            yield from targets(item)


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: query targets and query variables."""
    yield from targets(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]
            yield variable["definition"]


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects: names not called as functions, nor keywords."""
    bare = NOT_NAMES.sub(" ", expression)
    names = set()
    for match in NAME.finditer(bare):
        called = bare[match.end() :].lstrip().startswith("(")
        word = match.group()
        if not called and word not in KEYWORDS and not re.fullmatch(r"\d.*", word):
            names.add(word)
    return names


def served_names() -> frozenset[str]:
    """What the metrics endpoint serves: the project's series and the default collectors'."""
    collected = {sample.name for family in metrics.REGISTRY.collect() for sample in family.samples}
    return metrics.exported_names() | collected


DASHBOARD_JSON = json.loads(DASHBOARD.read_text())
EXPRESSIONS = sorted(set(expressions(DASHBOARD_JSON)))


def test_the_dashboard_has_an_expression_for_every_panel() -> None:
    panels = [p for p in DASHBOARD_JSON["panels"] if p["type"] != "row"]
    assert panels
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_every_dashboard_expression_names_only_exported_metrics(expression: str) -> None:
    names = metric_names(expression)
    assert names, f"no metric found in {expression!r}"
    assert names <= served_names(), f"{expression!r} names {sorted(names - served_names())}"


def test_the_name_finder_sees_through_functions_matchers_and_grouping() -> None:
    expression = (
        'histogram_quantile(0.9, sum by (le, type) (rate(a_bucket{b="c{d}", e=~"$f"}[5m]))) '
        "/ ignoring (x) sum(other_total offset 1h) and on (y) up"
    )
    assert metric_names(expression) == {"a_bucket", "other_total", "up"}
    assert metric_names("label_values(dispatch_kubeflow_events_total, namespace)") == {
        "dispatch_kubeflow_events_total"
    }
    assert not metric_names("rate(dispatch_kubeflow_jobs_total[5m])") <= served_names()
