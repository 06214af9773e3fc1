"""End to end: the operator is killed (SIGKILL) mid-surge and restarted; it resumes from the
autoscaler state it persisted in ``status.autoscaler``.

The runtime pods have a real capacity limit (``faults.serviceTimeMs``: every batch holds the
model's single execution slot for 100 ms, at most 2 rows a batch, so one replica serves 20
req/s and requests beyond that queue — P99 and the queue respond to load as on a GPU). The
operator learns that capacity from the pods' batch counters. A surge from 6 to 30 req/s is
sized for (30 / (0.7 x 20) = 2.1 -> 3 replicas, plus a bounded backlog allowance); while the new
replicas warm up (``faults.extraWarmupSeconds``) the operator is killed and started again.
Asserted: the restarted operator restored its state (learned capacity unchanged, not
re-learned), the pool never dropped below what was asked before the kill (no drop to the
minimum) and never grew beyond it (no duplicate scale-up), and no request failed.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    StatusRecorder,
    apply,
    capacity_limited_service,
    install_crd,
    parse_time,
    run_surge,
    running_operator,
    ups_after,
)

from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.timeout(240),
]

BASE_RPS, SURGE_RPS = 6.0, 30.0
SURGE_AT, DURATION = 15.0, 50.0
SERVICE_MS, BATCH_ROWS = 100.0, 2
PER_REPLICA = BATCH_ROWS / (SERVICE_MS / 1000.0)  # 20 req/s at saturation
WARMUP_S = 8.0


def _capacity_limited_service(name: str, model_path: Path) -> dict[str, Any]:
    return capacity_limited_service(
        name,
        model_path,
        service_ms=SERVICE_MS,
        batch_rows=BATCH_ROWS,
        warmup_seconds=WARMUP_S,
        autoscaling={"minReplicas": 1, "maxReplicas": 8, "scaleDownDelaySeconds": 600},
    )


def _desired(body: dict[str, Any]) -> int | None:
    pool = ((body.get("status") or {}).get("pools") or {}).get("primary") or {}
    value = pool.get("desired")
    return int(value) if value is not None else None


def _capacity(body: dict[str, Any]) -> float | None:
    value = ((body.get("status") or {}).get("autoscaler") or {}).get("capacityPerReplica")
    return float(value) if value is not None else None


def test_operator_killed_mid_surge_resumes_from_its_persisted_state(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "restart"
    apply_manifest = _capacity_limited_service(name, tmp_path / "mlp.onnx")
    with running_operator(sandbox, namespace, tmp_path / "operator.log") as operator:
        apply(sandbox, namespace, apply_manifest)

        def ready() -> dict[str, Any] | None:
            body = get_isvc(sandbox, namespace, name)
            ok = condition(body, "Ready").get("status") == "True"
            return body if ok and (body.get("status") or {}).get("readyReplicas") == 1 else None

        wait_for(ready, timeout=120, interval=0.5, what="1 ready replica")
        time.sleep(2.0)

        kill: dict[str, Any] = {}

        def kill_mid_surge(recorder: StatusRecorder, surge_wall: float) -> None:
            # After the surge's scale-up to the replicas it needs (3 at 30 req/s and 20 per
            # replica), while they warm. Not after the first step up: on a loaded machine the
            # first decision may see part of the rise (2 replicas, then 3 a second later), and
            # the new operator's step to 3 would then read as scaling up again after a restart.
            deadline = surge_wall + 20.0
            while time.time() < deadline:
                if ups_after(recorder.decisions, surge_wall, above=2):
                    break
                time.sleep(0.1)
            time.sleep(1.5)
            kill["before"] = [b for _, b in recorder.bodies[-8:]]
            kill["at"] = time.time()
            operator.kill()
            operator.start()
            kill["restarted_at"] = time.time()

        surge = run_surge(
            sandbox,
            namespace,
            name,
            base_rps=BASE_RPS,
            surge_rps=SURGE_RPS,
            surge_at=SURGE_AT,
            duration=DURATION,
            timeout=15.0,
            during=kill_mid_surge,
            settle=3.0,
        )
        report, recorder, surge_wall = surge.report, surge.recorder, surge.surge_wall
        log = operator.log()

    assert "at" in kill, "the operator was not killed (no scale-up decision seen)"
    before = [b for b in kill["before"] if _desired(b) is not None]
    assert before, "no status seen before the kill"
    asked = max(_desired(b) or 0 for b in before)
    capacity_before = next((c for b in reversed(before) if (c := _capacity(b)) is not None), None)
    after = [(t, b) for t, b in recorder.bodies if t >= kill["restarted_at"]]
    desired_after = [d for _, b in after if (d := _desired(b)) is not None]
    # The first statuses written by the new operator (its lastDecision is newer than the kill).
    written = [
        b
        for _, b in after
        if (d := (b.get("status") or {}).get("lastDecision")) and parse_time(d["at"]) > kill["at"]
    ]
    capacity_after = next((c for b in written if (c := _capacity(b)) is not None), None)
    decisions_after = [d for d in recorder.decisions if parse_time(d["at"]) > kill["at"]]

    first = parse_time(decisions_after[0]["at"]) - kill["at"] if decisions_after else math.nan
    print(
        f"\nkilled {kill['at'] - surge_wall:.2f}s after the surge; restarted process "
        f"{kill['restarted_at'] - kill['at']:.2f}s later; first decision of the new operator "
        f"{first:.2f}s after the kill"
    )
    print(
        f"asked before the kill: {asked} replicas; after: min {min(desired_after, default=-1)}, "
        f"max {max(desired_after, default=-1)}; capacity per replica learned "
        f"{capacity_before} -> {capacity_after} req/s (truth {PER_REPLICA:g})"
    )
    print("decisions after the restart:", *decisions_after[:6], sep="\n  ")
    p99_before = report.p99(2.0, SURGE_AT)
    p99_surge = report.p99(SURGE_AT, SURGE_AT + 10.0)
    p99_after = report.p99(DURATION - 10.0, DURATION)
    failures = report.failures()
    print(
        f"P99 before {p99_before * 1000:.0f} ms, first 10 s of surge {p99_surge * 1000:.0f} ms, "
        f"last 10 s {p99_after * 1000:.0f} ms; requests {len(report.samples)}, "
        f"failed {len(failures)}"
    )

    print("failures by error:", Counter(f.error[:60] for f in failures).most_common(4))
    assert "autoscaler state restored" in log, log[-3000:]
    assert capacity_before is not None
    assert capacity_before == pytest.approx(PER_REPLICA, rel=0.3)
    # Restored, not re-learned from scratch (a fresh estimate needs batches first).
    assert capacity_after is not None and capacity_after == pytest.approx(capacity_before, rel=0.1)
    assert asked >= 3, f"killed before the surge's scale-up to 3 was written: {kill['before']}"
    assert desired_after, "no status after the restart"
    assert min(desired_after) >= asked, "dropped below what was asked before the kill"
    assert max(desired_after) <= asked, "scaled up again after the restart"
    # The capacity limit is real: the surge queued (P99 rose), the added replicas absorbed it.
    assert p99_surge > 2 * p99_before
    assert p99_after < p99_surge
    assert not failures, failures[:5]
