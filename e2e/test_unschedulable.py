"""End to end: when the cluster runs out of room, the autoscaler stops asking and says so.

Each replica requests a CPU share sized so that the sandbox's nodes hold four replicas at the most
(``scenario.cpu_request_for``; CPU stands in for GPUs, which only the TensorRT backend may ask
for). The load asks for more; the scheduler leaves the extra pods Pending (Unschedulable), and
the autoscaler must stop adding replicas (the ``Scaling`` condition says so, and the decision
``unschedulable`` whenever it wanted more) instead of running up to ``maxReplicas``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    apply,
    cpu_request_for,
    events,
    install_crd,
    model_service,
    pods,
    running_operator,
)

from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(180)]


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def test_autoscaler_stops_adding_replicas_that_cannot_be_scheduled(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "crowded"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={"TIDAL_FAULT_ADDED_LATENCY_MS": "100"},
        autoscaling={
            "minReplicas": 1,
            # Well above the ~10 the load needs, so "not up to maxReplicas" means something: at
            # 10 the first surge decision could rightly ask all 10 (demand 9-10 replicas).
            "maxReplicas": 20,
            "standbyReplicas": 0,
            "targetQueueDepth": 1,
            "scaleDownDelaySeconds": 600,
        },
    )
    cpu = cpu_request_for(sandbox, replicas=4)
    manifest["spec"]["runtime"]["resources"] = {"requests": {"cpu": cpu}}
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)
        wait_for(
            lambda: condition(get_isvc(sandbox, namespace, name), "Ready").get("status") == "True",
            timeout=90,
            interval=0.5,
            what="Ready",
        )
        # ~10 requests in flight at 100 ms each: the autoscaler wants ~10 replicas; 4 fit.
        load = LoadGenerator(
            sandbox.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: 100.0
        )

        def held() -> dict[str, Any] | None:
            # Says so: the Scaling condition names the pods the cluster has no room for. (The
            # decision's own reason is `unschedulable` only on a tick that wanted more than it
            # had asked; with queue mode's capacity bound the first ask may already be all.)
            body = get_isvc(sandbox, namespace, name)
            decision = (body.get("status") or {}).get("lastDecision") or {}
            scaling = condition(body, "Scaling")
            if decision and scaling.get("reason") == "Unschedulable":
                return body
            return None

        async def drive() -> dict[str, Any]:
            task = asyncio.create_task(load.run(45.0))
            body = await asyncio.to_thread(
                wait_for, held, timeout=40, interval=0.3, what="an unschedulable decision"
            )
            # Hold the load a while longer: the ask must not keep growing.
            await asyncio.sleep(5.0)
            later = await asyncio.to_thread(get_isvc, sandbox, namespace, name)
            await task
            return {"first": body, "later": later}

        seen = asyncio.run(drive())
        pod_list = pods(sandbox, namespace)
        isvc_events = events(sandbox, namespace, name)

    pending = [p for p in pod_list if unschedulable(p)]
    running = [p for p in pod_list if p["status"].get("phase") == "Running"]
    first = seen["first"]["status"]
    later = seen["later"]["status"]
    print(
        f"\nrunning {len(running)}, pending unschedulable {len(pending)}; "
        f"decision {first['lastDecision']}; later desired {later['pools']['primary']['desired']}"
    )
    assert pending, "expected pods the scheduler cannot place"
    assert len(running) <= 4
    assert "pending unschedulable" in condition(seen["first"], "Scaling").get("message", "") or (
        first["lastDecision"]["reason"] == "unschedulable"
    )
    # Stopped asking: no more replicas than exist (running + pending), far below maxReplicas.
    assert later["pools"]["primary"]["desired"] <= len(running) + len(pending) < 20
    print(
        "events:",
        *[f"{e.get('type')} {e['reason']}: {e['message']}" for e in isvc_events],
        sep="\n  ",
    )
