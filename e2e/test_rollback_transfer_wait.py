"""End to end: the fifth rollback trigger, an abnormal wait for host->device weight transfer.

Two pools on the real runtime, each with two models: ``mlp`` (preloaded, hot) and ``rare``
(loaded on its first request, cold). The primary's runtime has a slow host->device path
(``TIDAL_FAULT_EXTRA_TRANSFER_SECONDS``: every engine load gets an ``h2d`` phase of 2 s); the
baseline's does not. ``slo: {transferWaitMs: 500, p99Ms: 1000, for: 5s}``. Under steady load on
``mlp`` a handful of requests ask for ``rare``: they wait for its load, and so for its slow
transfer (``tidal_transfer_wait_seconds``). The operator must flip the Service to the baseline
within ``for`` + 5 s of the breach's onset for the ``transferWait`` signal alone -- the cold
requests' wait stays out of the hot P99 -- with no failed request, and say so (``RolledBack``
with the signal and its value).
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
    running_operator,
)

from tidal.runtime.modelgen import write_mlp
from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(180)]

SLO_FOR_S = 5.0
TRANSFER_S = 2.0
RPS = 10.0
COLD_FROM, COLD_TO = 3.0, 3.6  # the seconds of the run whose requests ask for `rare`


def test_a_slow_weight_transfer_rolls_back_on_the_transfer_wait_signal(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "slowpath"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={"TIDAL_FAULT_EXTRA_TRANSFER_SECONDS": str(TRANSFER_S)},
        autoscaling={"minReplicas": 1, "maxReplicas": 2, "targetQueueDepth": 8},
        rollout=baseline_rollout(
            drain_seconds=5, slo={"transferWaitMs": 500, "p99Ms": 1000, "for": f"{SLO_FOR_S:.0f}s"}
        ),
    )
    rare = tmp_path / "rare.onnx"
    write_mlp(rare, seed=2)
    mlp = manifest["spec"]["models"][0]
    manifest["spec"]["models"].append(
        {**mlp, "name": "rare", "engines": [{"uri": rare.resolve().as_uri()}], "preload": False}
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def both_pools_ready() -> bool:
            pools = (get_isvc(sandbox, namespace, name).get("status") or {}).get("pools") or {}
            return all(pools.get(p, {}).get("ready", 0) >= 1 for p in ("primary", "baseline"))

        wait_for(both_pools_ready, timeout=90, interval=0.5, what="both pools ready")
        assert get_isvc(sandbox, namespace, name)["status"]["activePool"] == "primary"

        load = LoadGenerator(
            sandbox.api_client(),
            namespace,
            name,
            lambda t: "rare" if COLD_FROM <= t < COLD_TO else "mlp",
            INFER_BODY,
            lambda t: RPS,
            refresh=0.1,
        )
        with StatusRecorder(sandbox, namespace, name) as recorder:
            started = time.time()
            report = asyncio.run(load.run(30.0))
        rolled = get_isvc(sandbox, namespace, name)

        story = f"rollouts seen: {[r for _, r in recorder.rollouts]}"
        cold = [s for s in report.samples if s.model == "rare"]
        assert cold, "no request asked for the cold model"
        assert not report.failures(), (report.failures()[:5], story)
        print(
            f"\n{len(cold)} requests waited for the slow load; the slowest took "
            f"{max(s.latency for s in cold):.2f}s"
        )

        flips = [(t, r) for t, r in recorder.rollouts if r.get("traffic") == "baseline"]
        assert flips, story
        rollback = json.loads(flips[0][1]["state"])["rollback"]
        breaches = {b["signal"]: b for b in rollback["breaches"]}
        # The transfer wait alone: the cold requests' wait never reached the hot P99.
        assert set(breaches) == {"transferWait"}, rollback
        onset = breaches["transferWait"]["breachingSince"]
        switched = rollback["switchedAt"]
        print(
            f"transfer wait P99 {breaches['transferWait']['value']:.0f} ms > 500 ms; breach onset "
            f"-> flip {switched - onset:.2f}s (slo.for {SLO_FOR_S:.0f}s; load start -> onset "
            f"{onset - started:.2f}s)"
        )
        assert breaches["transferWait"]["value"] >= TRANSFER_S * 1000 * 0.5, rollback
        assert SLO_FOR_S <= switched - onset <= SLO_FOR_S + 5.0, rollback

        assert rolled["status"]["activePool"] == "baseline", rolled["status"]
        rb = condition(rolled, "RolledBack")
        assert rb.get("status") == "True" and "transferWait" in rb.get("message", ""), rb
        reasons = [e["reason"] for e in events(sandbox, namespace, name)]
        assert "RolledBack" in reasons and "SloBreach" in reasons, reasons
