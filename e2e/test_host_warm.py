"""End to end: a 10x surge met by host-warm standby replicas, routable within about a second.

The runtime pods have a real capacity limit (every batch holds the model's one execution slot
for 100 ms, 2 rows a batch: 20 req/s a replica) and a cold load that costs 8 s
(``faults.extraWarmupSeconds``: what deserializing a large engine and its first runs cost on a
GPU). Two standby replicas are kept **host-warm** (``standbyTier: host``): their engines are
fetched, verified and staged off the device, and they get no traffic. On a surge from 3 to
30 req/s the operator promotes them: each loads its engines back from the staged files (no
fetch, no cold cost), warms up, and only then gets the serving label.

Asserted: before the surge the standby pods report the host tier and have no model on the
device; the promotion (``status.pools.primary.metrics.timeToRoutable.promoteSeconds``: the
device-tier call, its warm-up and the label flip) takes at most 2 s; the load generator sees
the promoted replicas in the Service within 2.5 s of the scale-up decision, long before a new
replica could be warm (8 s); no request fails.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    apply,
    capacity_limited_service,
    install_crd,
    parse_time,
    pods,
    run_surge,
    running_operator,
)

from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]

# The base load stays well inside one replica even as the capacity first learned from it reads
# (batches of one row: ~10 req/s, half the true 20): at 6 req/s the load's start itself was
# sometimes taken for a rise and promoted a standby before the surge, which then asked no more.
BASE_RPS, SURGE_RPS = 3.0, 30.0
SURGE_AT, DURATION = 12.0, 35.0
SERVICE_MS, BATCH_ROWS = 100.0, 2
COLD_S = 8.0


def _manifest(name: str, model_path: Path) -> dict[str, Any]:
    return capacity_limited_service(
        name,
        model_path,
        service_ms=SERVICE_MS,
        batch_rows=BATCH_ROWS,
        warmup_seconds=COLD_S,
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 6,
            "standbyReplicas": 2,
            "standbyTier": "host",
            "scaleDownDelaySeconds": 600,
        },
    )


def _tier(ip: str) -> str:
    with urllib.request.urlopen(f"http://{ip}:8080/v2/tidal/tier", timeout=5) as response:
        return str(json.loads(response.read())["tier"])


def _standby_ips(sandbox: Any, namespace: str) -> list[str]:
    return [
        p["status"]["podIP"]
        for p in pods(sandbox, namespace)
        if p["metadata"]["labels"].get("serving.tidal.dev/role") == "standby"
        and p["status"].get("podIP")
    ]


def test_host_warm_standby_is_routable_within_seconds_of_a_surge(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "hostwarm"
    with running_operator(sandbox, namespace, tmp_path / "operator.log") as operator:
        apply(sandbox, namespace, _manifest(name, tmp_path / "mlp.onnx"))

        def standby_host_warm() -> list[str] | None:
            body = get_isvc(sandbox, namespace, name)
            if condition(body, "Ready").get("status") != "True":
                return None
            ips = _standby_ips(sandbox, namespace)
            return ips if len(ips) == 2 and all(_tier(ip) == "host" for ip in ips) else None

        ips = wait_for(standby_host_warm, timeout=150, interval=1.0, what="2 host-warm standby")
        on_device = []
        for ip in ips:
            with urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=5) as response:
                on_device.append('tidal_model_ready{model="mlp"} 1.0' in response.read().decode())
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
        report, started, surge_wall = surge.report, surge.started, surge.surge_wall
        final = get_isvc(sandbox, namespace, name)
        log = operator.log()

    # The scale-up decision: the first after the surge that asks more than the last one before
    # it did (a steady decision after the surge is not it, whatever the pool held before).
    held = max((d.get("desiredReplicas", 1) for d in surge.decisions_before()[-1:]), default=1)
    ups = surge.ups(above=held)
    assert ups, json.dumps(surge.recorder.decisions)
    decided = parse_time(ups[0]["at"])
    before = max((len(e) for t, e in report.endpoint_changes if t < SURGE_AT), default=0)
    grown = next(
        (t for t, eps in report.endpoint_changes if t >= SURGE_AT - 0.5 and len(eps) > before),
        None,
    )
    routable = (final["status"]["pools"]["primary"].get("metrics") or {}).get("timeToRoutable")
    failures = report.failures()
    print(
        f"\nsurge -> decision {decided - surge_wall:.2f}s ({ups[0]['reason']}); decision -> "
        f"more endpoints at the client "
        f"{(started + grown - decided) if grown is not None else float('nan'):.2f}s; "
        f"timeToRoutable {routable}; P99 before {report.p99(2.0, SURGE_AT) * 1000:.0f} ms, "
        f"last 10 s {report.p99(DURATION - 10.0, DURATION) * 1000:.0f} ms; requests "
        f"{len(report.samples)}, failed {len(failures)}"
    )
    assert on_device == [False, False], "a host-warm standby had its model on the device"
    assert routable is not None and routable.get("promoteSeconds") is not None, final["status"]
    assert routable["promoteSeconds"] <= 2.0, routable
    assert grown is not None, report.endpoint_changes
    assert started + grown - decided <= 2.5
    assert "not promoted" not in log
    assert not failures, failures[:5]
