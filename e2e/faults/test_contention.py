"""Two InferenceServices fight for the last room in the cluster: no livelock, both say why.

Each replica of ``left`` and ``right`` requests a CPU share sized so that the sandbox's nodes
hold four replicas in all (``scenario.cpu_request_for``; CPU stands in for GPUs here: pods
asking for ``nvidia.com/gpu`` need the TensorRT backend, which cannot run on the sandbox —
``e2e/test_unschedulable.py`` and ``tests/sandbox`` show the scheduler treating GPUs the same
way). Both get a load that asks for about five replicas each. Asserted: each keeps at least its
one replica, together they run at most four, both stop asking (``Scaling`` reason
``Unschedulable`` naming the pending pods, for as long as they are pending, whatever the last
decision's reason), and then nothing churns — for 15 s no pod of either is created or deleted
and neither's desired count moves (no livelock of scale-up, Pending, scale-down, repeat).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    apply,
    cpu_request_for,
    install_crd,
    model_service,
    pods,
    running_operator,
)

from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]

NAMES = ("left", "right")


def _held(sandbox: Any, namespace: str, name: str) -> bool:
    """The status says the pool is short for lack of room (for as long as it is)."""
    scaling = condition(get_isvc(sandbox, namespace, name), "Scaling")
    return bool(
        scaling.get("reason") == "Unschedulable"
        and "pending unschedulable" in scaling.get("message", "")
    )


def _snapshot(sandbox: Any, namespace: str) -> tuple[frozenset[str], dict[str, int]]:
    uids = frozenset(p["metadata"]["uid"] for p in pods(sandbox, namespace))
    desired = {
        n: int(get_isvc(sandbox, namespace, n)["status"]["pools"]["primary"]["desired"])
        for n in NAMES
    }
    return uids, desired


def test_two_services_short_of_room_settle_and_both_say_why(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    cpu = cpu_request_for(sandbox, replicas=4)
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        for name in NAMES:
            manifest = model_service(
                name,
                tmp_path / f"{name}.onnx",
                env={"TIDAL_FAULT_ADDED_LATENCY_MS": "100"},
                autoscaling={
                    "minReplicas": 1,
                    "maxReplicas": 10,
                    "targetQueueDepth": 1,
                    "scaleDownDelaySeconds": 600,
                },
            )
            manifest["spec"]["runtime"]["resources"] = {"requests": {"cpu": cpu}}
            apply(sandbox, namespace, manifest)
        for name in NAMES:
            wait_for(
                lambda name=name: (
                    condition(get_isvc(sandbox, namespace, name), "Ready").get("status") == "True"
                ),
                timeout=90,
                interval=0.5,
                what=f"{name} Ready",
            )
        loads = [
            LoadGenerator(sandbox.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: 50.0)
            for name in NAMES
        ]

        async def drive() -> dict[str, Any]:
            tasks = [asyncio.create_task(load.run(50.0)) for load in loads]
            try:
                await asyncio.to_thread(
                    wait_for,
                    lambda: all(_held(sandbox, namespace, n) for n in NAMES),
                    timeout=40,
                    interval=0.5,
                    what="both services held as unschedulable",
                )
            except Exception:
                for n in NAMES:
                    body = get_isvc(sandbox, namespace, n)
                    print(n, body["status"].get("lastDecision"), condition(body, "Scaling"))
                for p in pods(sandbox, namespace):
                    print(p["metadata"]["name"], p["status"].get("phase"))
                raise
            first = await asyncio.to_thread(_snapshot, sandbox, namespace)
            held_at = time.monotonic()
            await asyncio.sleep(15.0)
            last = await asyncio.to_thread(_snapshot, sandbox, namespace)
            both_held = await asyncio.to_thread(
                lambda: all(_held(sandbox, namespace, n) for n in NAMES)
            )
            reports = await asyncio.gather(*tasks)
            return {
                "first": first,
                "last": last,
                "held": both_held,
                "window": time.monotonic() - held_at,
                "reports": reports,
            }

        seen = asyncio.run(drive())
        pod_list = pods(sandbox, namespace)

    running = {n: 0 for n in NAMES}
    pending = {n: 0 for n in NAMES}
    for p in pod_list:
        owner = p["metadata"]["labels"].get("serving.tidal.dev/isvc")
        if p["status"].get("phase") == "Running":
            running[owner] += 1
        elif any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions") or []):
            pending[owner] += 1
    (uids_first, desired_first), (uids_last, desired_last) = seen["first"], seen["last"]
    print(
        f"\nrunning {running}, pending unschedulable {pending}; desired {desired_first} -> "
        f"{desired_last} over {seen['window']:.0f} s; pods created/deleted meanwhile "
        f"{len(uids_last ^ uids_first)}; requests "
        f"{[len(r.samples) for r in seen['reports']]}, failed "
        f"{[len(r.failures()) for r in seen['reports']]}"
    )
    assert all(running[n] >= 1 for n in NAMES), running
    assert sum(running.values()) <= 4
    assert seen["held"], "a service stopped reporting why it cannot grow"
    assert uids_last == uids_first, "pods churned while both were short of room"
    assert desired_last == desired_first
    assert all(d < 10 for d in desired_last.values())
