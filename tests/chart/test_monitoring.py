"""The dashboard and the alert rules the chart ships (``charts/tessera/monitoring/``).

A panel or an alert that reads a metric nobody exports shows nothing and never fires, and no
one notices until the day it was needed; a metric the code exports that no panel shows is one
an operator cannot see. So both sides are checked against the metrics the agent and the
controller register, every query is parsed by promtool (built from Prometheus's Go module,
``make promtool``), and the alerts are unit-tested with ``promtool test rules``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tessera.agent.metrics import AgentMetrics
from tessera.controller.operator import ControllerMetrics
from tessera.testing.cluster._cluster import Binaries
from tessera.testing.cluster.fixtures import require_binaries

from .test_chart import CHART, render

MONITORING = CHART / "monitoring"
DASHBOARD = MONITORING / "tessera-dashboard.json"
RULES = MONITORING / "tessera-rules.yaml"
ALERT_TESTS = Path(__file__).parent / "alerts.test.yaml"
GRAFANA_SCHEMA = Path(__file__).resolve().parents[2] / "tools" / "grafana-schema"

_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and",
                       "or", "unless", "offset", "bool"})


def _series_names(registry: CollectorRegistry) -> set[str]:
    """The series names a registry exposes, as PromQL sees them (a counter's ``_total``, a
    histogram's ``_bucket``/``_sum``/``_count``), whether or not a sample was recorded yet."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        else:
            names.add(family.name)
    return names


def exported() -> set[str]:
    return _series_names(AgentMetrics().registry) | _series_names(ControllerMetrics().registry)


def _family(series: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", series)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: every bare identifier that is not a function
    call, a grouping label, a keyword, a label matcher or a string."""
    text = re.sub(r'"[^"]*"', "", expr)  # strings, including label values
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        if word in _KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        if re.fullmatch(r"[0-9]+[smhdwy]|e[0-9]*", word):
            continue
        names.add(word)
    return names


def dashboard_queries() -> Iterator[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def rule_queries() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def test_the_expression_reader_finds_metrics_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.95, sum by (instance, le) (rate(tessera_x_bucket'
            '{result="failed"}[5m]))) > 2 and on(instance) (tessera_y or vector(0))')
    assert metric_names(expr) == {"tessera_x_bucket", "tessera_y"}


@pytest.mark.parametrize(("where", "expr"), [*dashboard_queries(), *rule_queries()])
def test_every_query_reads_only_metrics_the_code_exports(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: reads no metric"
    assert names <= exported(), f"{where}: {sorted(names - exported())} are not exported"


def test_every_exported_metric_is_on_the_dashboard() -> None:
    shown = {_family(n) for _, expr in dashboard_queries() for n in metric_names(expr)}
    missing = {_family(n) for n in exported()} - shown
    assert not missing, f"no panel shows {sorted(missing)}"


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']} is wider than the dashboard"
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["description"], f"{panel['title']} says what it shows"
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource", "datasource", "prometheus")


@pytest.fixture(scope="module")
def binaries() -> Binaries:
    return require_binaries()


def promtool() -> str:
    """promtool from ``make promtool`` (its path in ``TESSERA_PROMTOOL``); skip locally, fail
    under CI, without it."""
    path = os.environ.get("TESSERA_PROMTOOL", "")
    if path and Path(path).is_file():
        return path
    message = ("promtool is missing: run `make promtool`, then set TESSERA_PROMTOOL to the "
               "path it prints (make test does both)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_promtool_accepts_the_alert_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(list(rule_queries()))} rules found" in (result.stdout
                                                                   + result.stderr)


def test_each_alert_fires_on_its_symptom_and_only_then() -> None:
    """``promtool test rules``: series over time, and the alerts (labels and text) expected at
    given instants, quiet before and after."""
    tested = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == {name for name, _ in rule_queries()}, "every alert has a unit test"
    result = run_promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Grafana sends the queries as written, so a syntax error shows as an empty panel;
    promtool parses each one (as a recording rule, ``$__rate_interval`` as 5m)."""
    rules = [{"record": f"tessera:dashboard:{i}",
              "expr": expr.replace("$__rate_interval", "5m")}
             for i, (_, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def _schema_checker() -> Path:
    """Grafana's schema package and tsc from ``make grafana-schema``; skip locally, fail
    under CI, without them."""
    modules = GRAFANA_SCHEMA / "node_modules"
    if (modules / ".installed").is_file() and shutil.which("node"):
        return modules
    message = "Grafana's schema is not installed: run `make grafana-schema` (needs npm)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _type_check(dashboard: dict[str, Any], where: Path) -> subprocess.CompletedProcess[str]:
    """The dashboard as a literal of Grafana's published ``Dashboard`` type (the schema
    Grafana's own front end builds against), compiled by tsc: unknown fields, wrong types and
    missing required ones are errors, as Grafana would misread them."""
    modules = _schema_checker()
    (where / "dashboard.ts").write_text(
        "import type { Dashboard } from '@grafana/schema';\n"
        f"export const dashboard: Dashboard = {json.dumps(dashboard, indent=1)};\n")
    (where / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True,
                            "module": "commonjs", "moduleResolution": "node",
                            "target": "es2020", "baseUrl": ".",
                            "paths": {"@grafana/schema": [str(modules / "@grafana/schema")]}},
        "files": ["dashboard.ts"]}))
    return subprocess.run(["node", str(modules / "typescript/bin/tsc"), "-p", str(where)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_dashboard_is_what_grafana_s_schema_says_a_dashboard_is(tmp_path: Path) -> None:
    result = _type_check(json.loads(DASHBOARD.read_text()), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_misspelt_field(tmp_path: Path) -> None:
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][1]["gridPoss"] = broken["panels"][1].pop("gridPos")
    result = _type_check(broken, tmp_path)
    assert result.returncode != 0
    assert "'\"gridPoss\"' does not exist" in result.stdout


def _kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_the_chart_ships_the_dashboard_for_grafana_s_sidecar(binaries: Binaries) -> None:
    (config_map,) = [d for d in _kinds(render(binaries), "ConfigMap")
                     if d["metadata"]["name"] == "tessera-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["tessera.json"]) == json.loads(DASHBOARD.read_text())
    moved = render(binaries, "monitoring.grafanaDashboard.namespace=monitoring")
    assert [d["metadata"]["namespace"] for d in _kinds(moved, "ConfigMap")
            if d["metadata"]["name"] == "tessera-dashboard"] == ["monitoring"]
    assert not [d for d in _kinds(render(binaries, "monitoring.grafanaDashboard.enabled=false"),
                                  "ConfigMap") if d["metadata"]["name"] == "tessera-dashboard"]


def test_service_monitors_and_rules_are_optional(binaries: Binaries) -> None:
    plain = render(binaries)
    assert not _kinds(plain, "ServiceMonitor")
    assert not _kinds(plain, "PrometheusRule")
    docs = render(binaries, "monitoring.serviceMonitor.enabled=true",
                  "monitoring.prometheusRule.enabled=true",
                  "monitoring.serviceMonitor.labels.release=kps",
                  "monitoring.prometheusRule.labels.release=kps")
    (rule,) = _kinds(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    services = {s["metadata"]["name"]: s for s in _kinds(docs, "Service")}
    workloads = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in docs
                 if d["kind"] in ("Deployment", "DaemonSet")}
    monitors = _kinds(docs, "ServiceMonitor")
    assert len(monitors) == 2
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "kps"
        component = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        (service,) = [s for s in services.values() if all(
            s["metadata"]["labels"].get(k) == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items())]
        pod_labels = workloads[component]["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items(), \
            f"the {component} Service selects the {component}'s pods"
        (container,) = workloads[component]["spec"]["template"]["spec"]["containers"]
        assert service["spec"]["ports"][0]["targetPort"] == "metrics"
        assert "metrics" in [p["name"] for p in container["ports"]]
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
