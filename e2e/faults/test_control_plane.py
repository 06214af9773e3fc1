"""Faults of the control plane while an InferenceService serves under steady load.

One InferenceService with a real capacity limit (every batch holds the model's one execution
slot for 100 ms, 2 rows a batch: 20 req/s a replica) and a warm baseline pool behind an SLO
that would roll back, served 20 req/s for the whole run, on a sandbox of its own. In turn:

1. Prometheus is killed and stays down for 60 s: the autoscaler removes nothing (the primary
   never shrinks although ``scaleDownDelaySeconds`` is 5; it would still scale up on the pods'
   own queue), rollback never fires on the missing data, ``MetricsStale`` is True with reason
   ``PrometheusUnavailable``; Prometheus back: it clears.
2. kube-apiserver is killed (SIGKILL) and started again 5 s later, then
3. etcd is killed and started again 5 s later: the operator (the same process, never
   restarted) reconnects and its watches resume — a spec edit made after each restart is
   acted on (``status.observedGeneration`` follows) — and no decision is repeated: no scale
   Event, no rollback, the primary's Deployment keeps its replica count.

Throughout: 0 failed requests (the data plane does not depend on the control plane).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    StatusRecorder,
    apply,
    baseline_rollout,
    events,
    install_crd,
    model_service,
)

from tidal.sandbox.cluster import Sandbox
from tidal.sandbox.loadgen import LoadGenerator, LoadReport
from tidal.sandbox.operatorproc import OperatorProcess, condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

NAME = "steady"
RPS = 20.0
SERVICE_MS, BATCH_ROWS = 100.0, 2  # 20 req/s a replica: 20 req/s at 0.7 needs 2 replicas
PROMETHEUS_DOWN_S = 60.0
CONTROL_PLANE_DOWN_S = 5.0
SCALE_REASONS = {"ScaledUp", "ScaledDown"}


def _manifest(model_path: Path) -> dict[str, Any]:
    manifest = model_service(
        NAME,
        model_path,
        env={
            "TIDAL_FAULT_SERVICE_TIME_MS": str(SERVICE_MS),
            "TIDAL_FAULT_MAX_CONCURRENT_BATCHES": "1",
        },
        autoscaling={"minReplicas": 1, "maxReplicas": 4, "scaleDownDelaySeconds": 5},
        rollout=baseline_rollout(
            drain_seconds=5, slo={"p99Ms": 5000, "for": "5s", "minRequests": 20}
        ),
    )
    model = manifest["spec"]["models"][0]
    model["maxBatchSize"] = BATCH_ROWS
    model["batching"] = {"maxQueueDelayMs": 5}
    return manifest


def _primary(body: dict[str, Any]) -> dict[str, Any]:
    return dict(((body.get("status") or {}).get("pools") or {}).get("primary") or {})


def _deployment_replicas(sandbox: Sandbox, namespace: str) -> dict[str, int]:
    out = sandbox.kubectl("get", "deployments", "-n", namespace, "-o", "json")
    return {
        d["metadata"]["name"]: int(d["spec"].get("replicas") or 0)
        for d in json.loads(out.stdout)["items"]
    }


def _edit_is_acted_on(sandbox: Sandbox, namespace: str, max_replicas: int) -> float:
    """Patch the spec; seconds until the operator's status names the new generation."""
    patch = json.dumps({"spec": {"autoscaling": {"maxReplicas": max_replicas}}})
    t0 = time.monotonic()
    wait_for(
        lambda: sandbox.kubectl(
            "patch", "inferenceservice", NAME, "-n", namespace, "--type=merge", "-p", patch
        ),
        timeout=60,
        what="the spec edit accepted",
    )

    def caught_up() -> bool:
        body = get_isvc(sandbox, namespace, NAME)
        generation = body["metadata"]["generation"]
        return bool((body.get("status") or {}).get("observedGeneration") == generation)

    wait_for(caught_up, timeout=60, interval=0.25, what="observedGeneration after the edit")
    return time.monotonic() - t0


class _Load:
    """The steady load, in a thread, until stopped."""

    def __init__(self, sandbox: Sandbox, namespace: str) -> None:
        self.gen = LoadGenerator(
            sandbox.api_client(), namespace, NAME, "mlp", INFER_BODY, lambda t: RPS, refresh=0.2
        )
        self.stop = threading.Event()
        self.report: LoadReport | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="load")

    def _run(self) -> None:
        self.report = asyncio.run(self.gen.run_until(lambda t: self.stop.is_set()))

    def __enter__(self) -> _Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_control_plane_faults_leave_traffic_alone_and_lose_no_decision(
    private_sandbox: Sandbox, private_namespace: str, tmp_path: Path
) -> None:
    sandbox, namespace = private_sandbox, private_namespace
    install_crd(sandbox)
    operator = OperatorProcess(
        {**os.environ, **sandbox.env}, namespace, tmp_path / "operator.log", "plain"
    ).start()
    try:
        apply(sandbox, namespace, _manifest(tmp_path / "mlp.onnx"))

        def pools_ready() -> bool:
            pools = (get_isvc(sandbox, namespace, NAME).get("status") or {}).get("pools") or {}
            return all(pools.get(p, {}).get("ready", 0) >= 1 for p in ("primary", "baseline"))

        wait_for(pools_ready, timeout=120, interval=0.5, what="both pools ready")
        with _Load(sandbox, namespace) as load, StatusRecorder(sandbox, namespace, NAME) as rec:
            # Steady state: the primary sized for 20 req/s and quiet for 10 s.
            def steady() -> int | None:
                now = time.time()
                recent = [_primary(b).get("desired") for t, b in rec.bodies if t >= now - 10]
                if len(recent) < 20 or len(set(recent)) != 1 or recent[0] is None:
                    return None
                return int(recent[0]) if recent[0] >= 2 else None

            held = wait_for(steady, timeout=120, interval=1.0, what="a steady primary of >= 2")
            replicas_before = _deployment_replicas(sandbox, namespace)
            scale_events_before = [
                e for e in events(sandbox, namespace, NAME) if e["reason"] in SCALE_REASONS
            ]

            # -- 1. Prometheus down -------------------------------------------------------------
            down_at = sandbox.crash("prometheus")
            stale = wait_for(
                lambda: (
                    (b := get_isvc(sandbox, namespace, NAME))
                    and condition(b, "MetricsStale").get("status") == "True"
                    and b
                ),
                timeout=30,
                interval=0.25,
                what="MetricsStale=True with Prometheus down",
            )
            stale_after = time.time() - down_at
            time.sleep(max(0.0, down_at + PROMETHEUS_DOWN_S - time.time()))
            up_at = sandbox.restart("prometheus")
            wait_for(
                lambda: (
                    condition(get_isvc(sandbox, namespace, NAME), "MetricsStale").get("status")
                    == "False"
                ),
                timeout=60,
                interval=0.5,
                what="MetricsStale=False once Prometheus is back",
            )
            fresh_after = time.time() - up_at
            outage = [b for t, b in rec.bodies if down_at + stale_after <= t <= up_at]
            reasons = {
                (b["status"].get("lastDecision") or {}).get("reason", "")
                for b in outage
                if b.get("status")
            }
            desired_in_outage = [_primary(b).get("desired") for b in outage]

            # -- 2. kube-apiserver killed and restarted -----------------------------------------
            api_down = sandbox.crash("kube-apiserver")
            time.sleep(CONTROL_PLANE_DOWN_S)
            api_up = sandbox.restart("kube-apiserver")
            api_edit = _edit_is_acted_on(sandbox, namespace, 5)

            # -- 3. etcd killed and restarted ----------------------------------------------------
            etcd_down = sandbox.crash("etcd")
            time.sleep(CONTROL_PLANE_DOWN_S)
            etcd_up = sandbox.restart("etcd")
            wait_for(sandbox._apiserver_ready, timeout=60, what="kube-apiserver ready after etcd")
            etcd_edit = _edit_is_acted_on(sandbox, namespace, 6)
            time.sleep(5.0)  # a few ticks of the restarted world, still under load
        report = load.report
        body = get_isvc(sandbox, namespace, NAME)
        replicas_after = _deployment_replicas(sandbox, namespace)
        scale_events_after = [
            e for e in events(sandbox, namespace, NAME) if e["reason"] in SCALE_REASONS
        ]
        all_reasons = [e["reason"] for e in events(sandbox, namespace, NAME)]
        alive = operator.proc is not None and operator.proc.poll() is None
    finally:
        operator.stop()

    assert report is not None
    failures = report.failures()
    print(
        f"\nsteady primary {held} replicas; Prometheus down {up_at - down_at:.0f} s: "
        f"MetricsStale after {stale_after:.1f} s, cleared {fresh_after:.1f} s after it was back; "
        f"decisions meanwhile {sorted(reasons)}; primary desired {sorted(set(desired_in_outage))}"
    )
    print(
        f"kube-apiserver down {api_up - api_down:.1f} s, edit acted on {api_edit:.1f} s after; "
        f"etcd down {etcd_up - etcd_down:.1f} s, edit acted on {etcd_edit:.1f} s after"
    )
    print(
        f"requests {len(report.samples)}, failed {len(failures)}; deployments "
        f"{replicas_before} -> {replicas_after}; operator alive {alive}"
    )
    assert condition(stale, "MetricsStale")["reason"] == "PrometheusUnavailable"
    assert reasons and not any(r.startswith("scale-down") for r in reasons), reasons
    assert desired_in_outage and min(d for d in desired_in_outage if d is not None) >= held
    assert body["status"]["activePool"] == "primary"
    assert "RolledBack" not in all_reasons and "SloBreach" not in all_reasons, all_reasons
    assert alive, "the operator exited"
    assert replicas_after == replicas_before
    assert len(scale_events_after) == len(scale_events_before), scale_events_after
    assert not failures, failures[:5]
