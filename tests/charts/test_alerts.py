"""The chart's PrometheusRule: promtool accepts the rendered rules, each alert fires on the
series that describe its failure (and not on healthy ones) under ``promtool test rules``, the
thresholds come from the values, and every alert has its runbook in charts/tidal/RUNBOOKS.md.

promtool is Debian's (``prometheus`` package), found beside the sandbox's Prometheus
(``$TIDAL_CACHE/prometheus/usr/bin/promtool``) or on PATH."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, Doc, Helm, by_kind, one

from tidal.sandbox.binaries import Binaries

ENABLED = ("--set", "prometheusRule.enabled=true")
ALERTS = {
    "TidalSloBreach",
    "TidalRolledBack",
    "TidalMetricsStale",
    "TidalUnschedulableReplicas",
    "TidalEngineCacheThrash",
    "TidalEngineLoadFailures",
    "TidalOperatorAbsent",
}


def promtool() -> Path:
    beside = Binaries.locate().prometheus.parent / "promtool"
    if beside.exists():
        return beside
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not found (Debian's prometheus package, as the sandbox uses)")
    return Path(found)


def rules_of(docs: list[Doc]) -> list[Doc]:
    return [
        rule for group in one(docs, "PrometheusRule")["spec"]["groups"] for rule in group["rules"]
    ]


def write_rules(docs: list[Doc], path: Path, annotations: bool = True) -> Path:
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    if not annotations:
        groups = [
            {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in groups
        ]
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], capture_output=True, text=True, timeout=60, check=False
    )


# -- rendering ---------------------------------------------------------------------------------


def test_rules_are_off_by_default(helm: Helm) -> None:
    assert not by_kind(helm.template(), "PrometheusRule")


def test_promtool_accepts_the_rendered_rules(helm: Helm, tmp_path: Path) -> None:
    docs = helm.template(*ENABLED, "--set", "prometheusRule.alertLabels.team=ml")
    result = run_promtool("check", "rules", str(write_rules(docs, tmp_path / "rules.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {r["alert"] for r in rules_of(docs)} == ALERTS
    for rule in rules_of(docs):
        assert rule["labels"]["team"] == "ml" and rule["labels"]["severity"], rule
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), rule


def test_lint_passes_with_the_rules_and_the_dashboard(helm: Helm) -> None:
    result = helm("lint", "--strict", str(CHART), *ENABLED, "--set", "dashboard.enabled=true")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_metadata_and_thresholds_come_from_the_values(helm: Helm) -> None:
    docs = helm.template(
        *ENABLED,
        "--set", "prometheusRule.namespace=monitoring",
        "--set", "prometheusRule.labels.release=kube-prometheus-stack",
        "--set-json", "prometheusRule.rules.cacheThrash.evictionsPerMinute=2.5",
        "--set", "prometheusRule.rules.sloBreach.for=10m",
        "--set", "prometheusRule.rules.operatorAbsent.enabled=false",
        "--set", "prometheusRule.runbookUrl=https://runbooks.example/tidal",
    )  # fmt: skip
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = rules_of(docs)
    assert "TidalOperatorAbsent" not in {r["alert"] for r in rules}
    thrash = next(r for r in rules if r["alert"] == "TidalEngineCacheThrash")
    assert thrash["expr"].rstrip().endswith("> 2.5"), thrash["expr"]
    assert {r["for"] for r in rules if r["alert"] == "TidalSloBreach"} == {"10m"}
    assert (
        thrash["annotations"]["runbook_url"]
        == "https://runbooks.example/tidal#tidalenginecachethrash"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "prometheusRule.rules.cacheThrash.evictionsPerMinute=0"], "evictionsPerMinute"),
        (["--set", "prometheusRule.rules.sloBreach.for=5 minutes"], "/rules/sloBreach/for"),
        (["--set", "prometheusRule.rules.paging.enabled=true"], "paging"),
        (["--set", "prometheusRule.runbookUrl=README.md"], "/prometheusRule/runbookUrl"),
        (["--set", "dashboard.namespace=Monitoring"], "/dashboard/namespace"),
        (["--set-string", "dashboard.enabled=yes"], "/dashboard/enabled"),
    ],
)  # fmt: skip
def test_schema_rejects_bad_rule_and_dashboard_values(
    helm: Helm, args: list[str], message: str
) -> None:
    result = helm("template", "t", str(CHART), *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_every_alert_has_a_runbook_in_the_chart(helm: Helm) -> None:
    runbooks = (CHART / "RUNBOOKS.md").read_text()
    section = runbooks.split("## Alerts and runbooks", 1)
    assert len(section) == 2, "charts/tidal/RUNBOOKS.md has no '## Alerts and runbooks' section"
    body = section[1].split("\n## ", 1)[0]
    headings = re.findall(r"^### (\w+)$", body, flags=re.M)
    assert set(headings) == ALERTS, headings
    for rule in rules_of(helm.template(*ENABLED)):
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == rule["alert"].lower()
        paragraph = body.split(f"### {rule['alert']}\n", 1)[1].split("\n### ", 1)[0]
        assert len(paragraph.split()) > 40, f"{rule['alert']}: the runbook is too short"


# -- the alerts' logic, on synthetic series ------------------------------------------------------

ISVC = 'namespace="ns", isvc="a"'
PRIMARY = ISVC + ', pool="primary"'
EVICTING = PRIMARY + ', pod="p1", model="m1"'
WAITING = PRIMARY + ', model="m"'  # requests held by a load, waiting on its weight transfer


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def hot_buckets(slow: bool) -> list[dict[str, str]]:
    """Hot request histogram of the primary: 10 requests a minute, 90 % slow (0.1-0.25 s) or
    all fast (< 0.05 s)."""
    fast = "0+1x40" if slow else "0+10x40"
    sel = PRIMARY + ', cache="hot", code="200"'
    return [
        series("tidal_request_duration_seconds_bucket", sel + ', le="0.05"', fast),
        series("tidal_request_duration_seconds_bucket", sel + ', le="0.1"', fast),
        series("tidal_request_duration_seconds_bucket", sel + ', le="0.25"', "0+10x40"),
        series("tidal_request_duration_seconds_bucket", sel + ', le="+Inf"', "0+10x40"),
    ]


def slo_lines() -> list[dict[str, str]]:
    return [
        series("tidal_inferenceservice_slo_p99_seconds", ISVC, "0.1x40"),
        series("tidal_inferenceservice_slo_error_rate", ISVC, "0.05x40"),
        series("tidal_inferenceservice_slo_cold_start_seconds", ISVC, "5x40"),
        series("tidal_inferenceservice_slo_transfer_wait_seconds", ISVC, "0.5x40"),
        series("tidal_inferenceservice_active_pool", PRIMARY, "1x40"),
        series("tidal_inferenceservice_active_pool", ISVC + ', pool="baseline"', "0x40"),
    ]


def fires(alert: str, at: str, labels: dict[str, str] | None) -> dict[str, Any]:
    """An alert_rule_test: ``alert`` fires with ``labels`` at ``at`` (None: it does not fire)."""
    expected = [] if labels is None else [{"exp_labels": labels}]
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


SEVERE = {"severity": "critical", "namespace": "ns", "isvc": "a"}
WARN = {"severity": "warning", "namespace": "ns", "isvc": "a"}
IN_PRIMARY = {"pool": "primary"}

CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "slo p99 sustained on the serving pool": (
        hot_buckets(slow=True) + slo_lines(),
        [
            fires("TidalSloBreach", "4m", None),  # not yet sustained for 5m
            fires("TidalSloBreach", "12m", {**SEVERE, "pool": "primary", "signal": "p99"}),
        ],
    ),
    "slo p99 met": (hot_buckets(slow=False) + slo_lines(), [fires("TidalSloBreach", "12m", None)]),
    "slo p99 breached by a pool without traffic": (
        [
            *hot_buckets(slow=True),
            *slo_lines()[:3],
            series("tidal_inferenceservice_active_pool", PRIMARY, "0x40"),
        ],
        [fires("TidalSloBreach", "12m", None)],
    ),
    "error rate over the slo": (
        [
            series("tidal_requests_total", PRIMARY + ', model="m", code="200"', "0+90x40"),
            series("tidal_requests_total", PRIMARY + ', model="m", code="503"', "0+10x40"),
            *slo_lines(),
        ],
        [fires("TidalSloBreach", "12m", {**SEVERE, "pool": "primary", "signal": "errorRate"})],
    ),
    "cold starts over the slo": (
        [
            series("tidal_cold_start_seconds_bucket", PRIMARY + ', model="m", le="1"', "0x40"),
            series("tidal_cold_start_seconds_bucket", PRIMARY + ', model="m", le="10"', "0+1x40"),
            series("tidal_cold_start_seconds_bucket", PRIMARY + ', model="m", le="+Inf"', "0+1x40"),
            *slo_lines(),
        ],
        [fires("TidalSloBreach", "25m", {**SEVERE, "pool": "primary", "signal": "coldStart"})],
    ),
    "transfer waits over the slo": (
        [
            series("tidal_transfer_wait_seconds_bucket", WAITING + ', le="0.5"', "0x40"),
            series("tidal_transfer_wait_seconds_bucket", WAITING + ', le="5"', "0+2x40"),
            series("tidal_transfer_wait_seconds_bucket", WAITING + ', le="+Inf"', "0+2x40"),
            *slo_lines(),
        ],
        [
            fires("TidalSloBreach", "4m", None),  # not yet sustained for 5m
            fires("TidalSloBreach", "25m", {**SEVERE, "pool": "primary", "signal": "transferWait"}),
        ],
    ),
    "transfer waits within the slo": (
        [
            series("tidal_transfer_wait_seconds_bucket", WAITING + ', le="0.05"', "0+2x40"),
            series("tidal_transfer_wait_seconds_bucket", WAITING + ', le="+Inf"', "0+2x40"),
            *slo_lines(),
        ],
        [fires("TidalSloBreach", "25m", None)],
    ),
    "rolled back": (
        [
            series(
                "tidal_inferenceservice_condition",
                ISVC + ', condition="RolledBack", reason="RolledBack"',
                "0 0 1x20",
            )
        ],
        [
            fires("TidalRolledBack", "2m", None),
            fires("TidalRolledBack", "5m", {**WARN, "reason": "RolledBack"}),
        ],
    ),
    "autoscaler holding for missing metrics": (
        [
            series(
                "tidal_inferenceservice_condition",
                ISVC + ', condition="MetricsStale", reason="MetricsMissing"',
                "1x20",
            )
        ],
        [
            fires(
                "TidalMetricsStale",
                "5m",
                {**WARN, "reason": "MetricsMissing", "source": "autoscaler"},
            )
        ],
    ),
    "a runtime pod Prometheus cannot scrape": (
        [
            series("up", PRIMARY + ', pod="a-1", job="pods"', "0x20"),
            series("up", PRIMARY + ', pod="a-2", job="pods"', "1x20"),
        ],
        [fires("TidalMetricsStale", "5m", {**WARN, "pool": "primary", "source": "prometheus"})],
    ),
    "unschedulable replicas": (
        [series("tidal_inferenceservice_replicas", PRIMARY + ', state="unschedulable"', "2x20")],
        [fires("TidalUnschedulableReplicas", "10m", {**WARN, "pool": "primary"})],
    ),
    "no unschedulable replicas": (
        [series("tidal_inferenceservice_replicas", PRIMARY + ', state="unschedulable"', "0x20")],
        [fires("TidalUnschedulableReplicas", "10m", None)],
    ),
    "cache thrash: 30 evictions a minute per replica": (
        [
            series("tidal_engine_cache_evictions_total", EVICTING, "0+60x40"),
            series("tidal_inferenceservice_replicas", PRIMARY + ', state="ready"', "2x40"),
        ],
        [fires("TidalEngineCacheThrash", "20m", {**WARN, "pool": "primary"})],
    ),
    "evictions now and then": (
        [
            series("tidal_engine_cache_evictions_total", EVICTING, "0+6x40"),
            series("tidal_inferenceservice_replicas", PRIMARY + ', state="ready"', "2x40"),
        ],
        [fires("TidalEngineCacheThrash", "20m", None)],
    ),
    "the gateway's loads fail": (
        [
            series("tidal_gateway_loads_total", ISVC + ', pod="g", result="failed"', "0+1x20"),
            series("tidal_gateway_loads_total", ISVC + ', pod="g", result="ok"', "0+5x20"),
        ],
        [fires("TidalEngineLoadFailures", "10m", {**WARN, "source": "gateway"})],
    ),
    "replicas stuck warming": (
        [series("tidal_inferenceservice_replicas", PRIMARY + ', state="warming"', "1x40")],
        [
            # A long warm-up is not a failure yet.
            fires("TidalEngineLoadFailures", "10m", None),
            fires("TidalEngineLoadFailures", "20m", {**WARN, **IN_PRIMARY, "source": "warmup"}),
        ],
    ),
    "no operator metrics": (
        [series("up", 'job="other"', "1x20")],
        [fires("TidalOperatorAbsent", "10m", {"severity": "critical"})],
    ),
    "operator scraped": (
        [series("tidal_operator_queue_depth", "", "0x20")],
        [fires("TidalOperatorAbsent", "10m", None)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_alert_fires_on_its_failure_only(helm: Helm, tmp_path: Path, case: str) -> None:
    rules = write_rules(helm.template(*ENABLED), tmp_path / "rules.yaml", annotations=False)
    inputs, expectations = CASES[case]
    unit = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": expectations}],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = run_promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_annotations_name_the_service_and_the_numbers(helm: Helm, tmp_path: Path) -> None:
    rules = write_rules(helm.template(*ENABLED), tmp_path / "rules.yaml")
    url = "https://github.com/tidal-serving/tidal/blob/main/charts/tidal/RUNBOOKS.md"
    inputs, _ = CASES["unschedulable replicas"]
    unit = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "TidalUnschedulableReplicas",
                        "exp_alerts": [
                            {
                                "exp_labels": {**WARN, "pool": "primary"},
                                "exp_annotations": {
                                    "summary": "ns/a: 2 replica(s) of pool primary cannot be "
                                    "scheduled",
                                    "description": "The scheduler finds no node with room (GPUs, "
                                    "CPU, memory, selectors or taints); the autoscaler stops "
                                    "asking for more.",
                                    "runbook_url": f"{url}#tidalunschedulablereplicas",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = run_promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
