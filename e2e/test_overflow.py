"""End to end: a surge shared with the warm baseline while the primary's new replicas warm.

The runtime pods have a real capacity limit (100 ms a batch of at most 2 rows on one slot:
20 req/s a replica) and a cold start that costs 8 s more. The InferenceService keeps a
baseline pool of two warm replicas with ``spec.rollout.baseline.overflow: true`` (rollout rule
8). On a surge from 6 to 30 req/s the primary (one replica) is short: the autoscaler asks for
more, and while they warm the Service also selects the baseline's ready replicas, whose 40 req/s
take the surge at once. When the primary's new replicas are ready the overflow ends and the
baseline drains.

Asserted: the rollout status goes ``primary`` -> ``overflow`` after the surge's onset and back to
``primary`` before the run ends, with ``Overflow`` and ``OverflowEnded`` Events; during the
overflow the load generator's endpoints include the baseline's pods; no request fails.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    apply,
    capacity_limited_service,
    events,
    install_crd,
    pods,
    run_surge,
    running_operator,
)

from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]

BASE_RPS, SURGE_RPS = 6.0, 30.0
SURGE_AT, DURATION = 10.0, 40.0
BASELINE_REPLICAS = 2


def _manifest(name: str, model_path: Path) -> dict[str, Any]:
    manifest = capacity_limited_service(
        name,
        model_path,
        service_ms=100.0,
        batch_rows=2,
        warmup_seconds=8.0,
        autoscaling={"minReplicas": 1, "maxReplicas": 6, "scaleDownDelaySeconds": 600},
    )
    manifest["spec"]["rollout"] = {
        "baseline": {"minReplicas": BASELINE_REPLICAS, "overflow": True},
        "drainSeconds": 5,
    }
    return manifest


def _pool_ips(sandbox: Any, namespace: str, pool: str, ready: bool = False) -> set[str]:
    def is_ready(pod: dict[str, Any]) -> bool:
        conditions = pod["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    return {
        p["status"]["podIP"]
        for p in pods(sandbox, namespace)
        if p["metadata"]["labels"].get("serving.tidal.dev/pool") == pool
        and p["status"].get("podIP")
        and (is_ready(p) or not ready)
    }


def test_a_surge_overflows_to_the_warm_baseline_until_the_primary_is_ready(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "overflow"
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, _manifest(name, tmp_path / "mlp.onnx"))

        def settled() -> bool:
            body = get_isvc(sandbox, namespace, name)
            rollout = (body.get("status") or {}).get("rollout") or {}
            return (
                condition(body, "Ready").get("status") == "True"
                and rollout.get("traffic") == "primary"
                and len(_pool_ips(sandbox, namespace, "baseline", ready=True)) == BASELINE_REPLICAS
            )

        wait_for(settled, timeout=150, interval=1.0, what="primary serving, baseline warm")
        baseline_ips = _pool_ips(sandbox, namespace, "baseline")
        assert len(baseline_ips) == BASELINE_REPLICAS
        time.sleep(3.0)  # a few quiet ticks: the learned capacity settles

        surge = run_surge(
            sandbox,
            namespace,
            name,
            base_rps=BASE_RPS,
            surge_rps=SURGE_RPS,
            surge_at=SURGE_AT,
            duration=DURATION,
            timeout=15.0,
        )
        report, recorder, started = surge.report, surge.recorder, surge.started
        reasons = [e.get("reason") for e in events(sandbox, namespace, name)]

    traffic = [(seen - started, r.get("traffic")) for seen, r in recorder.rollouts]
    overflow_at = next((t for t, v in traffic if v == "overflow"), None)
    ended_at = next(
        (t for t, v in traffic if v == "primary" and overflow_at is not None and t > overflow_at),
        None,
    )
    shared = [
        t
        for t, eps in report.endpoint_changes
        if baseline_ips & {ep.rsplit(":", 1)[0] for ep in eps} and t >= SURGE_AT - 1
    ]
    failures = report.failures()
    print(
        f"\ntraffic {[(round(t, 1), v) for t, v in traffic]}; overflow from "
        f"{overflow_at if overflow_at is None else round(overflow_at - SURGE_AT, 2)} s after "
        f"the onset, ended at {ended_at if ended_at is None else round(ended_at, 1)} s; "
        f"endpoints with the baseline from {shared[0] if shared else None}; P99 before "
        f"{report.p99(2.0, SURGE_AT) * 1000:.0f} ms, first 10 s of the surge "
        f"{report.p99(SURGE_AT, SURGE_AT + 10) * 1000:.0f} ms, last 10 s "
        f"{report.p99(DURATION - 10, DURATION) * 1000:.0f} ms; requests {len(report.samples)}, "
        f"failed {len(failures)}"
    )
    assert overflow_at is not None and overflow_at >= SURGE_AT - 0.5, traffic
    assert ended_at is not None, traffic
    assert "Overflow" in reasons and "OverflowEnded" in reasons, reasons
    assert shared, report.endpoint_changes
    assert not failures, failures[:5]
