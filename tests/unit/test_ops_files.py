"""ops/: the Prometheus alert rules and the Grafana dashboard parse, and every metric and label they use is one
kafka2pc.metrics exposes, so renaming a metric without them fails here."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from prometheus_client.metrics import MetricWrapperBase

from kafka2pc import metrics

yaml = pytest.importorskip("yaml", reason="PyYAML (a dev dependency, through mkdocs) parses the rule file")

OPS = pathlib.Path(__file__).resolve().parents[2] / "ops"
#: the samples each type of metric exposes, after its name
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created")}
#: labels Prometheus and PromQL add themselves
BUILT_IN_LABELS = {"le", "job", "instance", "__name__"}
NAME = re.compile(r"\bkafka2pc_[a-z0-9_]+")


def exposed() -> dict[str, set[str]]:
    """Every sample name kafka2pc.metrics exposes, with its metric's labels."""
    names: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                for suffix in SUFFIXES[family.type]:
                    names[family.name + suffix] = set(metric._labelnames)
    return names


def rule_expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load((OPS / "prometheus-rules.yml").read_text())
    found = []
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["alert"] and rule["labels"]["severity"] in {"page", "warning", "info"}
            assert rule["annotations"]["summary"]
            found.append((rule["alert"], rule["expr"]))
    return found


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads((OPS / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["panels"]
    found = [(f"panel {panel['title']!r}", target["expr"]) for panel in dashboard["panels"]
             for target in panel["targets"]]
    found += [(f"variable {v['name']}", v["definition"]) for v in dashboard["templating"]["list"] if "definition" in v]
    return found


def problems(where: str, expr: str, names: dict[str, set[str]]) -> list[str]:
    """Unknown metric names, labels no metric of the expression has, and unbalanced brackets."""
    found = []
    used = NAME.findall(expr)
    if not used:
        found.append(f"{where}: no kafka2pc metric in {expr!r}")
    for name in used:
        if name not in names:
            found.append(f"{where}: {name} is not a metric kafka2pc.metrics exposes")
    labels = set().union(*(names.get(name, set()) for name in used)) | BUILT_IN_LABELS
    for name, selector in re.findall(r"(kafka2pc_[a-z0-9_]+)\{([^}]*)\}", expr):
        found += [f"{where}: {name} has no label {label!r}" for label in re.findall(r"(\w+)\s*=~?", selector)
                  if label not in names.get(name, set())]
    for grouping in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        found += [f"{where}: no metric of it has the label {label!r}"
                  for label in re.split(r"\s*,\s*", grouping.strip()) if label not in labels]
    for opening, closing in ("()", "{}", "[]"):
        if expr.count(opening) != expr.count(closing):
            found.append(f"{where}: unbalanced {opening}{closing} in {expr!r}")
    return found


def test_the_alert_rules_use_only_kafka2pcs_metrics_and_labels():
    names = exposed()
    expressions = rule_expressions()
    assert len(expressions) >= 5
    assert [p for where, expr in expressions for p in problems(f"rule {where}", expr, names)] == []
    alerted = {name for _, expr in expressions for name in NAME.findall(expr)}
    assert "kafka2pc_oldest_open_transaction_seconds" in alerted  # the alert for consumers held back


def test_the_dashboard_uses_only_kafka2pcs_metrics_and_labels():
    names = exposed()
    expressions = dashboard_expressions()
    assert [p for where, expr in expressions for p in problems(where, expr, names)] == []
    shown = {name for _, expr in expressions for name in NAME.findall(expr)}
    phases = ("prepare", "record_decision", "complete", "recovery")
    assert {f"kafka2pc_{phase}_seconds_bucket" for phase in phases} <= shown


def test_a_renamed_metric_is_caught():
    names = exposed()
    assert problems("x", "max(kafka2pc_oldest_open_transaction_second) > 1", names)
    assert problems("x", 'sum by (prefix) (kafka2pc_transactions_ended_total{outcome="lost"})', names)
    assert not problems("x", "max by (prefix) (kafka2pc_oldest_open_transaction_seconds) > 1", names)
