"""End to end: a 5x step surge on the real runtime is met by the autoscaler, standby first.

An InferenceService on the runtime (onnxruntime, a generated MLP) whose replicas hold each
request ~100 ms (``faults.addedLatencyMs``: a service time that does not eat the sandbox's two
CPUs) and warm up for a measurable few seconds (``faults.extraWarmupSeconds``). The load
generator finds the ready endpoints through the Service's EndpointSlices and sends 8 req/s,
then 40 req/s. Asserted: the scale-up decision follows the surge within a few seconds (status
``lastDecision.at``), the warm standby is promoted, no request reached a replica before its Ready
transition, no request failed, and the latency after the surge (P95 of the last 10 s) is back
near the pre-surge P99.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    apply,
    events,
    install_crd,
    model_service,
    parse_time,
    pods,
    ready_since_by_ip,
    run_surge,
    running_operator,
)

from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(180)]

BASE_RPS, SURGE_RPS = 8.0, 40.0
SURGE_AT, DURATION = 12.0, 40.0
WARMUP_S = 3.0
LATENCY_MS = 100.0


def test_surge_scales_up_within_seconds_and_serves_only_warm_replicas(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "surge"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={
            "TIDAL_FAULT_ADDED_LATENCY_MS": str(LATENCY_MS),
            "TIDAL_FAULT_EXTRA_WARMUP_SECONDS": str(WARMUP_S),
        },
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 4,
            "standbyReplicas": 1,
            "targetQueueDepth": 1.5,
            "scaleDownDelaySeconds": 600,
        },
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def prewarmed() -> dict[str, Any] | None:
            body = get_isvc(sandbox, namespace, name)
            status = body.get("status") or {}
            ok = (
                condition(body, "Ready").get("status") == "True"
                and condition(body, "Prewarmed").get("status") == "True"
                and status.get("standbyReplicas") == 1
                and status.get("readyReplicas") == 1
            )
            return body if ok else None

        wait_for(prewarmed, timeout=90, interval=0.5, what="1 serving + 1 warm standby")
        # Let the autoscaler see a fresh, steady pool before the load starts.
        time.sleep(2.0)

        surge = run_surge(
            sandbox,
            namespace,
            name,
            base_rps=BASE_RPS,
            surge_rps=SURGE_RPS,
            surge_at=SURGE_AT,
            duration=DURATION,
            timeout=10.0,
        )
        report, recorder, surge_wall = surge.report, surge.recorder, surge.surge_wall
        final = get_isvc(sandbox, namespace, name)
        pod_list = pods(sandbox, namespace)
        isvc_events = events(sandbox, namespace, name)

    # -- the decision follows the surge --------------------------------------------------------
    ups = surge.ups(above=1)
    assert ups, f"no scale-up decision after the surge: {recorder.decisions}"
    first = ups[0]
    decision_after = parse_time(first["at"]) - surge_wall
    print(
        f"\nsurge onset -> scale-up decision: {decision_after:.2f}s ({first['reason']}, "
        f"desired {first['desiredReplicas']}, inputs {first.get('inputs')})"
    )
    assert decision_after <= 4.0, first
    scaled = [e for e in isvc_events if e["reason"] == "ScaledUp"]
    assert scaled, [e["reason"] for e in isvc_events]
    print("ScaledUp events:", *[e["message"] for e in scaled], sep="\n  ")

    # -- warm capacity: serving endpoints reach the decision's target -----------------------------
    # The first decision may only promote the standby; later ticks add pods as the rate
    # estimate catches up. Warm capacity: as many serving endpoints as the largest decision.
    target = max(d["desiredReplicas"] for d in ups)
    warm_at = next(
        (t for t, eps in report.endpoint_changes if t >= SURGE_AT and len(eps) >= target), None
    )
    more_at = next(
        (t for t, eps in report.endpoint_changes if t >= SURGE_AT and len(eps) >= 2), None
    )
    print(
        f"surge onset -> 2 serving endpoints (standby promoted): "
        f"{(more_at - SURGE_AT) if more_at is not None else float('nan'):.2f}s"
    )
    print(
        f"surge onset -> warm capacity ({target} serving endpoints): "
        f"{(warm_at - SURGE_AT) if warm_at is not None else float('nan'):.2f}s"
    )
    print(
        "endpoint changes (s since start, endpoints):",
        *[f"{t:.2f} {len(eps)}" for t, eps in report.endpoint_changes],
        sep="\n  ",
    )
    assert more_at is not None and more_at - SURGE_AT <= 4.0, report.endpoint_changes
    assert warm_at is not None, report.endpoint_changes

    # -- never a request to a replica before it was ready -----------------------------------------
    ready_since = ready_since_by_ip(pod_list)
    for ip, first_wall in report.first_request_wall().items():
        assert ip in ready_since, (ip, ready_since)
        assert first_wall >= ready_since[ip], (ip, first_wall, ready_since[ip])
    failures = report.failures()
    assert not failures, failures[:5]
    assert report.dropped == 0

    # -- P99 recovers ---------------------------------------------------------------------------
    before = report.p99(2.0, SURGE_AT)
    during = report.p99(SURGE_AT, SURGE_AT + 5.0)
    after = report.p99(DURATION - 10.0, DURATION)
    after_p95 = report.quantile(0.95, DURATION - 10.0, DURATION)
    print(
        f"P99 before {before * 1000:.0f} ms, first 5 s of surge {during * 1000:.0f} ms, "
        f"last 10 s {after * 1000:.0f} ms (P95 {after_p95 * 1000:.0f} ms); "
        f"requests {len(report.samples)}, "
        f"replicas now {final['status'].get('pools', {}).get('primary')}"
    )
    # The backlog is gone: a queue left over would lift the whole distribution, so the last
    # 10 s' P95 (~20 samples above it at 40 req/s) is held to the pre-surge P99. Their P99 is
    # the 4th-worst of ~400 requests: on CI's 2 busy cores a few scheduling stalls of the
    # sandbox decide it (CI saw 241 ms against a 217 ms bound with 4 replicas serving and no
    # queue). Latency targets belong to bench/, not to this test.
    assert after_p95 <= max(2.0 * before, before + 0.1), (before, after_p95, after)
    assert final["status"]["pools"]["primary"]["ready"] >= target

    # -- time to routable, by phase, in status ----------------------------------------------------
    routable = (final["status"]["pools"]["primary"].get("metrics") or {}).get("timeToRoutable")
    print(f"time to routable (status.pools.primary.metrics.timeToRoutable): {routable}")
    assert routable and routable["samples"] >= 1, final["status"]["pools"]["primary"]
    assert routable["runtimeSeconds"] > 0 and {"fetch", "warmup"} <= set(routable["phases"])
