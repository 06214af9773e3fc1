"""End to end (issue 31): a rolling update of the activator with requests held answers every
held client inside the pod's grace period.

A ``minReplicas: 0`` service on the real runtime whose replicas take 90 s to warm up
(``TIDAL_FAULT_EXTRA_WARMUP_SECONDS``), so that a wake from zero outlasts what follows. At zero,
``HELD`` requests are sent to the activator pod (the Service's one ready endpoint) and held
there; the operator wakes the pool (the replica is still warming up). The service's
``holdTimeoutSeconds`` is then edited: the operator renders a new gateway configuration and the
gateway Deployment rolls (surge one new pod, then the old pod gets SIGTERM). Every held client
must get an answer — forwarded (200), or ``503`` saying the gateway is shutting down with a
``Retry-After`` of 1-30 s — before the old pod's grace period ends (its
``deletionTimestamp``), none a reset connection; before issue 31 they were held until the hold
deadline (118 s), past the 30 s grace, and reset when the kubelet killed the pod.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from scenario import (
    INFER_BODY,
    apply,
    install_crd,
    model_service,
    parse_time,
    pods,
    running_operator,
)

from tidal.sandbox.endpoints import ready_endpoints
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(900)]

HELD = 20
LABEL_COMPONENT = "serving.tidal.dev/component"


async def _held_requests(url: str, count: int) -> list[tuple[int, float, str, str]]:
    """``count`` concurrent infer requests: (status, wall time answered, Retry-After, body)."""

    async def one(session: aiohttp.ClientSession) -> tuple[int, float, str, str]:
        try:
            async with session.post(f"{url}/v2/models/mlp/infer", json=INFER_BODY) as response:
                text = await response.text()
                retry = response.headers.get("Retry-After", "")
                return response.status, time.time(), retry, text[:300]
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 0, time.time(), "", f"{type(exc).__name__}: {exc}"

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        return list(await asyncio.gather(*(one(session) for _ in range(count))))


def _gateway_pods(sandbox: Any, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(sandbox, namespace)
        if (p["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == "gateway"
    ]


def _held(url: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/v2/tidal/held", timeout=10) as response:
        return int(json.loads(response.read())["held"])


def test_a_rolling_update_of_the_activator_answers_every_held_request_in_its_grace_period(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "holdroll"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={"TIDAL_FAULT_EXTRA_WARMUP_SECONDS": "90"},
        autoscaling={
            "minReplicas": 0,
            "maxReplicas": 1,
            "scaleToZeroAfterSeconds": 5,
            "holdTimeoutSeconds": 120,
        },
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def at_zero() -> list[tuple[str, int]] | None:
            body = get_isvc(sandbox, namespace, name)
            status = body.get("status") or {}
            if condition(body, "Ready").get("reason") != "ScaledToZero":
                return None
            if status.get("desiredReplicas") != 0 or status.get("readyReplicas"):
                return None
            endpoints = ready_endpoints(sandbox.api_client(), namespace, name)
            return endpoints if len(endpoints) == 1 else None

        endpoints = wait_for(at_zero, timeout=400, interval=0.5, what="at zero, one activator")
        url = "http://{}:{}".format(*endpoints[0])
        (old,) = [p for p in _gateway_pods(sandbox, namespace) if p["status"].get("podIP")]
        assert old["status"]["podIP"] == endpoints[0][0], (old["status"], endpoints)
        old_name = old["metadata"]["name"]
        resources = old["spec"]["containers"][0].get("resources") or {}
        assert resources.get("limits", {}).get("memory"), f"activator resources: {resources}"

        results: list[tuple[int, float, str, str]] = []
        sender = threading.Thread(
            target=lambda: results.extend(asyncio.run(_held_requests(url, HELD))), daemon=True
        )
        sender.start()
        wait_for(lambda: _held(url) == HELD, timeout=60, what=f"{HELD} requests held at zero")

        # A new gateway configuration: the operator rolls the activator's Deployment.
        edited = time.time()
        manifest["spec"]["autoscaling"]["holdTimeoutSeconds"] = 110
        apply(sandbox, namespace, manifest)
        seen: dict[str, Any] = {}

        def old_terminating() -> float | None:
            for p in _gateway_pods(sandbox, namespace):
                if p["metadata"]["name"] == old_name:
                    stamp = p["metadata"].get("deletionTimestamp")
                    seen["old"] = p["status"].get("phase")
                    return parse_time(stamp) if stamp else None
            seen["old"] = "gone"
            return seen.get("deadline")

        deadline = wait_for(
            old_terminating, timeout=180, interval=0.2, what="the old activator pod terminating"
        )
        seen["deadline"] = deadline
        sender.join(120)
        assert not sender.is_alive(), f"held clients unanswered; old pod: {seen}"
        assert len(results) == HELD, results
        late = [r for r in results if r[1] > deadline + 1.0]  # API timestamps: whole seconds
        assert not late, (
            f"{len(late)} of {HELD} answered after the old pod's grace period ended "
            f"({deadline - edited:.1f} s after the edit): {late[:3]}"
        )
        for status, _, retry, body in results:
            if status == 200:
                continue
            assert status == 503 and "shutting down" in body, (status, body)
            assert retry.isdigit() and 1 <= int(retry) <= 30, (retry, body)
        answered_after = max(r[1] for r in results) - edited
        print(
            f"rolling update of the activator with {HELD} held: all answered "
            f"{answered_after:.1f} s after the edit ({[r[0] for r in results].count(200)} "
            f"forwarded), the old pod's grace ending {deadline - edited:.1f} s after it"
        )
