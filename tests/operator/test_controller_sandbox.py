"""The control loop against the sandbox: held pools say so, deleted objects stop their loop.

Pods on the sandbox's fake node are Ready but serve no metrics, so the autoscaler can never see
a queue there: the pool must hold its size (never scale down) and report ``MetricsStale``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_operator_sandbox import apply, condition, fake_service, get_isvc, is_ready

from tidal.sandbox.operatorproc import OperatorProcess
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox


def test_missing_metrics_hold_the_pool_and_say_so(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    scaling = {"minReplicas": 1, "maxReplicas": 3, "standbyReplicas": 0, "scaleDownDelaySeconds": 0}
    apply(sandbox, namespace, fake_service("held", autoscaling=scaling))
    wait_for(lambda: is_ready(sandbox, namespace, "held"), timeout=120, what="Ready")

    def stale() -> dict[str, Any] | None:
        body = get_isvc(sandbox, namespace, "held")
        return body if condition(body, "MetricsStale").get("status") == "True" else None

    body = wait_for(stale, timeout=30, what="MetricsStale=True")
    decision = body["status"]["lastDecision"]
    assert decision["reason"].startswith("hold:"), decision
    assert "queue" in condition(body, "MetricsStale")["message"]
    # Held, not scaled down, although the delay is zero and nothing is queued anywhere.
    time.sleep(4)
    body = get_isvc(sandbox, namespace, "held")
    assert body["status"]["lastDecision"]["reason"].startswith("hold:")
    assert body["status"]["pools"]["primary"]["desired"] == 1
    assert condition(body, "Scaling").get("status") in ("True", "False")


def test_deleted_service_stops_its_control_loop(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("gone"))
    wait_for(lambda: is_ready(sandbox, namespace, "gone"), timeout=120, what="Ready")
    wait_for(
        lambda: (get_isvc(sandbox, namespace, "gone").get("status") or {}).get("lastDecision"),
        timeout=30,
        what="a first decision",
    )
    sandbox.kubectl("delete", "inferenceservice", "gone", "-n", namespace, "--wait=true")
    time.sleep(3)
    log = operator.log()
    assert "control tick of" not in log, log[-3000:]
    assert operator.proc is not None and operator.proc.poll() is None
