"""The Grafana dashboard (charts/tidal/dashboards/tidal.json) without a cluster: it validates
against the dashboard schema version it declares (Grafana Foundation SDK's strict decoders), its
layout and variables are sound, every query parses and names only series tidal exports (the
alerts' too), and the chart ships it in a ConfigMap for Grafana's sidecar.

That each query returns data from a real run is ``e2e/test_observability.py``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from chart_helpers import Helm, by_kind, one
from dashboard_helpers import (
    DASHBOARD,
    dashboard_queries,
    ensure_dashboardcheck,
    exported_metric_names,
    fill,
    load_dashboard,
    metric_names,
    panels,
    selectors,
)

VARIABLES = {"namespace": "ns", "service": ".*", "pool": ".*"}


@pytest.fixture(scope="module")
def checker() -> Path:
    return ensure_dashboardcheck()


def check(checker: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(checker), str(path)], capture_output=True, text=True, timeout=60, check=False
    )


# -- the schema --------------------------------------------------------------------------------


def test_dashboard_validates_against_the_schema_version_it_declares(checker: Path) -> None:
    sdk = subprocess.run(
        [str(checker), "--schema-version"], capture_output=True, text=True, check=True
    )
    assert load_dashboard()["schemaVersion"] == int(sdk.stdout), (
        "the dashboard declares another schemaVersion than the SDK's schema in dashboardcheck"
    )
    result = check(checker, DASHBOARD)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("a misspelt dashboard field", lambda d: d.update(refersh="30s")),
        ("a wrong type", lambda d: d["panels"][1].update(gridPos={"h": "six", "w": 4, "x": 0})),
        ("a misspelt option", lambda d: d["panels"][1]["options"].update(textMod="name")),
        ("an unknown panel type", lambda d: d["panels"][1].update(type="piechart3d")),
        ("a query without a Prometheus datasource", lambda d: d["panels"][1]["targets"][0].update(
            datasource={"type": "loki", "uid": "x"})),
    ],
)  # fmt: skip
def test_the_checker_refuses_what_the_schema_does_not_allow(
    checker: Path, tmp_path: Path, where: str, change: object
) -> None:
    dashboard = load_dashboard()
    change(dashboard)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(dashboard))
    result = check(checker, path)
    assert result.returncode == 1, f"{where} passed: {result.stdout}"


# -- layout and variables ----------------------------------------------------------------------


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    all_panels = list(panels(load_dashboard()))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_query_uses_the_datasource_variable_and_the_filters() -> None:
    dashboard = load_dashboard()
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "namespace", "service", "pool"]
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p["description"], p["title"]
        for target in p["targets"]:
            assert target["datasource"] == p["datasource"]
            for sel in selectors(fill(target["expr"], VARIABLES)):
                labels = {m[0] for m in sel.matchers}
                # The operator's own process metrics are not per InferenceService.
                if sel.name.startswith("tidal_operator_") and sel.name not in {
                    "tidal_operator_scale_decisions_total",
                    "tidal_operator_rollbacks_total",
                    "tidal_operator_placement_changes_total",
                }:
                    continue
                assert {"namespace", "isvc"} <= labels, (p["title"], sel)


def test_gateway_panels_do_not_filter_by_pool() -> None:
    """Gateway pods belong to no pool: a pool filter would hide them."""
    for query in dashboard_queries(load_dashboard()):
        for sel in selectors(fill(query.expr, VARIABLES)):
            if sel.name.startswith("tidal_gateway_"):
                assert "pool" not in {m[0] for m in sel.matchers}, (query.where, sel)


# -- queries name only what tidal exports ------------------------------------------------------


def rule_queries(helm: Helm) -> list[tuple[str, str]]:
    docs = helm.template("--set", "prometheusRule.enabled=true")
    rule = one(docs, "PrometheusRule")
    return [(f"rule {r['alert']}", r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def test_every_query_parses_and_names_exported_series(helm: Helm) -> None:
    exported = exported_metric_names()
    queries = [(q.where, q.expr) for q in dashboard_queries(load_dashboard())]
    queries += rule_queries(helm)
    unknown = []
    for where, expr in queries:
        for sel in selectors(fill(expr, VARIABLES)):
            names = metric_names(sel)
            assert names, f"{where}: selector without a metric name: {sel}"
            unknown += [(where, n) for n in names if n not in exported]
    assert not unknown, unknown


# -- the ConfigMap -----------------------------------------------------------------------------


def test_dashboard_configmap_is_off_by_default(helm: Helm) -> None:
    assert not [
        d
        for d in by_kind(helm.template(), "ConfigMap")
        if d["metadata"]["name"].endswith("-dashboard")
    ]


def test_dashboard_configmap_carries_the_json_for_the_grafana_sidecar(helm: Helm) -> None:
    docs = helm.template(
        "--set", "dashboard.enabled=true",
        "--set", "dashboard.namespace=monitoring",
        "--set", "dashboard.annotations.grafana_folder=tidal",
    )  # fmt: skip
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["name"] == "t-tidal-dashboard"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "tidal"}
    assert json.loads(cm["data"]["tidal.json"]) == load_dashboard()
    # Other sidecar conventions: the label is a value, not fixed.
    docs = helm.template(
        "--set", "dashboard.enabled=true", "--set", "dashboard.labels.grafana_dashboard=null",
        "--set", "dashboard.labels.dashboards=tidal",
    )  # fmt: skip
    labels = one(docs, "ConfigMap")["metadata"]["labels"]
    assert labels["dashboards"] == "tidal" and "grafana_dashboard" not in labels
