"""The Grafana dashboard in examples/grafana reads only what the server exports: every metric
named in its expressions (panels and variables) is a series of the HTTP child's ``/metrics`` page
(a gauge by its name, a counter by ``_total``, a histogram by ``_bucket``, ``_count`` or
``_sum``), every SGLang metric it selects is selected by ``model_name``, and what is left of an
expression once metric names are taken out is PromQL. The page is the real ``Metrics`` page,
parsed by prometheus_client."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.http.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "examples" / "grafana" / "sglang-launch-dashboard.json"

# PromQL's words the dashboard may use: functions, aggregations and their clauses.
PROMQL = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "irate", "increase",
    "histogram_quantile", "label_values", "clamp_min", "topk", "on", "ignoring",
}  # fmt: skip
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    found += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def exported_series() -> dict[str, str]:
    """Every series name the metrics page can carry, with its family's type."""
    page = Metrics("any-model").render()[0].decode()
    series = {}
    for family in text_string_to_metric_families(page):
        for suffix in SUFFIXES[family.type]:
            series[family.name + suffix] = family.type
    return series


def metric_names(expr: str) -> tuple[list[str], list[str]]:
    """The metric names of ``expr``, and its other words (functions, clauses)."""
    bare = re.sub(r'"[^"]*"', "", expr)  # strings
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", r"\1", bare)  # grouping labels
    bare = re.sub(r"(label_values\([^,()]+),\s*\w+\)", r"\1)", bare)  # the label it lists
    words = NAME.findall(re.sub(r"\$\w+", "", bare))
    words = [w for w in words if not re.fullmatch(r"\d+(\.\d+)?", w)]
    metrics = [w for w in words if w not in PROMQL]
    return metrics, [w for w in words if w in PROMQL]


def test_the_dashboard_has_expressions():
    assert len(expressions()) >= 10


@pytest.mark.parametrize("expr", expressions())
def test_every_expression_names_metrics_the_server_exports(expr):
    series = exported_series()
    metrics, _ = metric_names(expr)
    assert metrics, f"{expr!r} names no metric"
    missing = [m for m in metrics if m not in series]
    assert not missing, f"{expr!r} names {missing}, which /metrics does not export"


@pytest.mark.parametrize("expr", expressions())
def test_every_sglang_metric_is_selected_by_model_name(expr):
    for selector in re.finditer(r"(sglang:[A-Za-z0-9_:]+)(\{[^}]*\})?", expr):
        if expr.startswith("label_values("):
            continue  # the variable that lists the model names
        assert selector[2] and 'model_name=~"$model_name"' in selector[2], (
            f"{selector[1]} in {expr!r} is not selected by the model_name variable"
        )


def test_the_checker_finds_names_and_leaves_promql():
    metrics, words = metric_names(
        'histogram_quantile(0.99, sum by (le, route) (rate(x_bucket{a="b"}[$__rate_interval])))'
    )
    assert metrics == ["x_bucket"] and words == ["histogram_quantile", "sum", "by", "rate"]
    assert metric_names("label_values(y, model_name)") == (["y"], ["label_values"])
    assert "sglang:time_to_first_token_seconds_bucket" in exported_series()
    assert "sglang_launch_requests_total" in exported_series()
    assert "sglang:num_running_reqs_total" not in exported_series()
