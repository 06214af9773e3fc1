"""The operator's kube-state-style series (``tidal_inferenceservice_*``): what one
InferenceService's body, pods and Deployments turn into, and the collector over a Store."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tidal.operator.shell import metrics
from tidal.operator.shell.metrics import InferenceServiceCollector, service_samples
from tidal.operator.shell.reconciler import Store

ISVC = "serving.tidal.dev/isvc"
POOL = "serving.tidal.dev/pool"
ROLE = "serving.tidal.dev/role"


def pod(
    name: str, pool: str, *, ready: bool = False, standby: bool = False, **status: Any
) -> dict[str, Any]:
    labels = {ISVC: "a", POOL: pool, ROLE: "standby" if standby else "serving"}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if status.get("unschedulable"):
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": labels}
    if status.get("terminating"):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "kind": "Pod",
        "metadata": meta,
        "status": {"phase": "Running", "conditions": conditions},
    }


def body(
    spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": spec or {},
        "status": status or {},
    }


def values(samples: list[metrics.Sample]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    base = {("namespace", "ns"), ("isvc", "a")}
    return {(s.name, frozenset(set(s.labels) - base)): s.value for s in samples}


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_replicas_by_state_come_from_the_pods_and_the_deployment() -> None:
    pods = [
        pod("p1", "primary", ready=True),
        pod("p2", "primary", ready=True, standby=True),
        pod("p3", "primary"),
        pod("p4", "primary", unschedulable=True),
        pod("p5", "primary", ready=True, terminating=True),
        pod("b1", "baseline", ready=True),
        {"kind": "Pod", "metadata": {"name": "gw", "labels": {ISVC: "a"}}},  # a gateway pod
    ]
    got = values(service_samples(body(status={"activePool": "baseline"}), pods, {"primary": 4}))
    assert got[key("replicas", pool="primary", state="desired")] == 4
    assert got[key("replicas", pool="primary", state="ready")] == 1
    assert got[key("replicas", pool="primary", state="standby")] == 1
    assert got[key("replicas", pool="primary", state="warming")] == 1
    assert got[key("replicas", pool="primary", state="unschedulable")] == 1
    assert got[key("replicas", pool="primary", state="terminating")] == 1
    assert got[key("replicas", pool="baseline", state="ready")] == 1
    # The baseline has no Deployment yet: its desired count falls back to the status'.
    assert got[key("replicas", pool="baseline", state="desired")] == 0
    assert got[key("active_pool", pool="baseline")] == 1
    assert got[key("active_pool", pool="primary")] == 0


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, {}),
        ({"autoscaling": {"targetP99Ms": 50}}, {"target_p99_seconds": 0.05}),
        (
            {"rollout": {"slo": {"p99Ms": 80, "errorRate": 0.01, "coldStartMs": 5e3, "for": "2m"}}},
            {
                "slo_p99_seconds": 0.08,
                "slo_error_rate": 0.01,
                "slo_cold_start_seconds": 5.0,
                "slo_for_seconds": 120.0,
            },
        ),
        ({"rollout": {"slo": {"gpuMemoryHeadroom": "10%"}}}, {"slo_for_seconds": 60.0}),
    ],
)  # fmt: skip
def test_slo_and_target_lines_come_from_the_spec(
    spec: dict[str, Any], expected: dict[str, float]
) -> None:
    lines = {
        s.name: s.value
        for s in service_samples(body(spec), [], {})
        if s.name.startswith(("slo_", "target_"))
    }
    assert lines == pytest.approx(expected)


def test_conditions_decision_signals_and_fleet_come_from_the_status() -> None:
    status = {
        "activePool": "primary",
        "conditions": [
            {"type": "RolledBack", "status": "True", "reason": "RolledBack"},
            {"type": "MetricsStale", "status": "False", "reason": "Fresh"},
        ],
        "lastDecision": {"reason": "surge:rate", "at": "2026-01-01T00:00:10Z", "pool": "primary"},
        "pools": {"primary": {"desired": 2, "metrics": {"queueDepth": 3.5, "arrivalRate": None}}},
        "fleet": {"modelsHot": 3, "modelsTotal": 5, "hotCopies": 4, "pinnedCopies": 6,
                  "gatewaysReady": 1, "loadedBytes": 1000},
    }  # fmt: skip
    got = values(service_samples(body({"fleet": {}}, status), [], {}))
    assert got[key("condition", condition="RolledBack", reason="RolledBack")] == 1
    assert got[key("condition", condition="MetricsStale", reason="Fresh")] == 0
    at = got[key("last_decision_timestamp_seconds", pool="primary", reason="surge:rate")]
    assert at == 1767225610.0
    assert got[key("queue_depth", pool="primary")] == 3.5
    assert key("arrival_rate", pool="primary") not in got  # unknown: no sample, not a zero
    assert got[key("fleet_models", state="hot")] == 3
    assert got[key("fleet_models", state="total")] == 5
    assert got[key("fleet_copies", state="pinned")] == 6
    assert got[key("fleet_gateways_ready")] == 1
    assert got[key("fleet_loaded_bytes")] == 1000
    # Without spec.fleet, no fleet series even if an old status has them.
    assert not [s for s in service_samples(body({}, status), [], {}) if s.name.startswith("fleet")]


def test_collector_exposes_every_service_of_the_store() -> None:
    store = Store()
    store.put_service(body(status={"activePool": "primary"}))
    store.put_child(pod("p1", "primary", ready=True), deleted=False)
    other = body()
    other["metadata"] = {"name": "b", "namespace": "ns2"}
    store.put_service(other)
    registry = CollectorRegistry()
    collector = InferenceServiceCollector()
    registry.register(collector)
    assert b"tidal_inferenceservice" not in generate_latest(registry)  # no store yet
    collector.store = store
    text = generate_latest(registry).decode()
    assert (
        'tidal_inferenceservice_replicas{isvc="a",namespace="ns",pool="primary",state="ready"} 1.0'
        in text
    )
    assert 'tidal_inferenceservice_active_pool{isvc="b",namespace="ns2",pool="primary"} 1.0' in text
    assert text.count("# TYPE tidal_inferenceservice_replicas gauge") == 1


def test_rollbacks_are_counted_from_the_rollout_events() -> None:
    before = metrics.ROLLBACKS.labels(namespace="ns", isvc="c", reason="RollingBack")._value.get()
    metrics.count_rollout_events("ns", "c", ["SloBreach", "RollingBack", "RolledBack"])
    after = metrics.ROLLBACKS.labels(namespace="ns", isvc="c", reason="RollingBack")._value.get()
    assert after - before == 1
    assert {"RollingBack", "RolloutAborted"} == metrics.ROLLBACK_EVENT_REASONS


def test_a_services_counters_start_at_zero_and_go_with_it() -> None:
    """A rollback must be an increase Prometheus can see: the counter exists at 0 first."""
    from prometheus_client import generate_latest

    from tidal.operator.shell import metrics

    def lines() -> list[str]:
        text = generate_latest(metrics.REGISTRY).decode()
        return [x for x in text.splitlines() if 'isvc="zeroed"' in x and "_total" in x]

    metrics.start_service("ns-z", "zeroed")
    rollbacks = 'tidal_operator_rollbacks_total{isvc="zeroed",namespace="ns-z",reason="%s"} 0.0'
    assert sorted(lines()) == [
        'tidal_operator_placement_changes_total{isvc="zeroed",namespace="ns-z"} 0.0',
        rollbacks % "RollingBack",
        rollbacks % "RolloutAborted",
    ]
    metrics.count_rollout_events("ns-z", "zeroed", ["RollingBack", "Promoted"])
    assert any(x.endswith('reason="RollingBack"} 1.0') for x in lines())
    metrics.forget_service("ns-z", "zeroed")
    assert lines() == []
