"""End to end: a primary that breaches its P99 SLO loses its traffic to a warm baseline.

Two pools on the real runtime serving the same generated MLP: the primary answers every request
150 ms late (``TIDAL_FAULT_ADDED_LATENCY_MS`` in ``spec.runtime.env``), the baseline (its own
``runtime`` without the fault) is healthy. ``slo: {p99Ms: 100, for: 5s}``. Under steady load the
operator must flip the Service to the baseline within ``for`` + 5 s of the breach's onset, with
no failed request during the flip, and report it (``RolledBack`` condition and Event); setting
``activePool: primary`` then moves traffic back.
"""

from __future__ import annotations

import asyncio
import json
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
    pods,
    running_operator,
)

from tidal.operator.core.api import LABEL_POOL
from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(180)]

SLO_FOR_S = 5.0
RPS = 15.0


def pool_ips(sandbox: Any, namespace: str) -> dict[str, str]:
    """Pod IP -> pool."""
    return {
        p["status"]["podIP"]: p["metadata"]["labels"].get(LABEL_POOL, "")
        for p in pods(sandbox, namespace)
        if (p.get("status") or {}).get("podIP")
    }


def test_breach_flips_to_warm_baseline_and_active_pool_moves_it_back(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "canary"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={"TIDAL_FAULT_ADDED_LATENCY_MS": "150"},
        autoscaling={"minReplicas": 1, "maxReplicas": 3, "targetQueueDepth": 8},
        rollout=baseline_rollout(
            drain_seconds=5, slo={"p99Ms": 100, "for": f"{SLO_FOR_S:.0f}s", "minRequests": 20}
        ),
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def both_pools_ready() -> bool:
            pools = (get_isvc(sandbox, namespace, name).get("status") or {}).get("pools") or {}
            return all(pools.get(p, {}).get("ready", 0) >= 1 for p in ("primary", "baseline"))

        wait_for(both_pools_ready, timeout=90, interval=0.5, what="both pools ready")
        body = get_isvc(sandbox, namespace, name)
        assert body["status"]["activePool"] == "primary"

        load = LoadGenerator(
            sandbox.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: RPS, refresh=0.1
        )
        with StatusRecorder(sandbox, namespace, name) as recorder:
            started = time.time()
            report = asyncio.run(load.run(30.0))
        rolled = get_isvc(sandbox, namespace, name)
        ips = pool_ips(sandbox, namespace)

        # -- the flip ---------------------------------------------------------------------------
        flips = [(t, r) for t, r in recorder.rollouts if r.get("traffic") == "baseline"]
        assert flips, recorder.rollouts
        state = json.loads(flips[0][1]["state"])
        rollback = state["rollback"]
        onset = min(b["breachingSince"] for b in rollback["breaches"])
        switched = rollback["switchedAt"]
        print(
            f"\nbreach onset -> flip decision: {switched - onset:.2f}s (slo.for {SLO_FOR_S:.0f}s; "
            f"load start -> onset {onset - started:.2f}s): {rollback['reason']}"
        )
        client_flip = next(
            (
                t
                for t, eps in report.endpoint_changes
                if eps and all(ips.get(e.split(":")[0]) == "baseline" for e in eps)
            ),
            None,
        )
        assert client_flip is not None, report.endpoint_changes
        print(
            f"breach onset -> load generator sees only baseline endpoints: "
            f"{started + client_flip - onset:.2f}s"
        )
        assert switched - onset <= SLO_FOR_S + 5.0
        assert started + client_flip - onset <= SLO_FOR_S + 5.0
        failures = report.failures()
        assert not failures, failures[:5]
        after = report.p99(client_flip + 1.0, 30.0)
        before = report.p99(0.0, client_flip)
        print(f"P99 on the primary {before * 1000:.0f} ms, on the baseline {after * 1000:.0f} ms")
        assert after < 0.1

        assert rolled["status"]["activePool"] == "baseline"
        rb = condition(rolled, "RolledBack")
        assert rb.get("status") == "True" and "p99" in rb.get("message", ""), rb
        metrics = {p: s.get("metrics") for p, s in rolled["status"]["pools"].items()}
        print("pool metrics after the flip:", metrics)
        assert metrics["primary"] and metrics["baseline"]
        reasons = [e["reason"] for e in events(sandbox, namespace, name)]
        assert "RolledBack" in reasons and "SloBreach" in reasons, reasons

        # -- back through activePool --------------------------------------------------------------
        sandbox.kubectl(
            "patch",
            "inferenceservice",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec": {"rollout": {"activePool": "primary"}}}',
        )
        back = LoadGenerator(
            sandbox.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: 5.0, refresh=0.1
        )
        pinned = time.time()
        report2 = asyncio.run(back.run(8.0))
        body = wait_for(
            lambda: (
                (b := get_isvc(sandbox, namespace, name))["status"]["activePool"] == "primary" and b
            ),
            timeout=30,
            what="traffic back on the primary",
        )
        ips = pool_ips(sandbox, namespace)
        final_eps = report2.endpoint_changes[-1][1] if report2.endpoint_changes else ()
        back_at = next(
            (
                t
                for t, eps in report2.endpoint_changes
                if eps and all(ips.get(e.split(":")[0]) == "primary" for e in eps)
            ),
            None,
        )
        print(
            f"activePool: primary -> only primary endpoints after "
            f"{back_at if back_at is not None else float('nan'):.2f}s; phase "
            f"{body['status']['rollout']['phase']}"
        )
        assert final_eps and all(ips.get(e.split(":")[0]) == "primary" for e in final_eps)
        assert not report2.failures(), report2.failures()[:5]
        assert pinned > 0
