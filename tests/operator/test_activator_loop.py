"""The gateway loop's activator part against a real gateway: it pushes the service's ready
serving pods to the gateway pod and learns, through its long-poll, how many requests the
gateway holds (what `Controller.held` hands to the zero decision), poking the service at once."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import aiohttp
from aiohttp import web
from isvc_fixtures import minimal

from tidal.common.http import JsonErrorRunner
from tidal.gateway.config import GatewayConfig
from tidal.gateway.server import Gateway
from tidal.operator.core.api import LABEL_ISVC, LABEL_POOL, LABEL_ROLE
from tidal.operator.core.resources import (
    COMPONENT_GATEWAY,
    GATEWAY_PORT,
    LABEL_COMPONENT,
    RUNTIME_PORT,
)
from tidal.operator.shell.fleet import FleetController, FleetSettings
from tidal.operator.shell.kube import Kube
from tidal.operator.shell.reconciler import Store

INFER = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


def _pod(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": {LABEL_ISVC: "svc", **labels}},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


async def _until(predicate: Any, what: str, seen: Any, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {within} s; seen: {seen()}")
        await asyncio.sleep(0.01)


async def test_the_activator_loop_pushes_replicas_and_learns_the_held_count() -> None:
    # A loopback address of its own, so that the gateway can listen on the operator's fixed
    # gateway port beside other test runs.
    prefix = f"127.{random.randint(1, 250)}.{random.randint(1, 250)}"
    host, runtime_ip = f"{prefix}.2", f"{prefix}.3"  # nothing listens on the runtime's
    gateway = Gateway(GatewayConfig(activator=True, models=["m"], hold_timeout_seconds=8))
    runner = JsonErrorRunner(gateway.build_app(), access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, host, GATEWAY_PORT).start()
    store = Store()
    key = store.put_service(minimal(autoscaling={"minReplicas": 0}))
    store.put_child(_pod("svc-gateway-1", host, {LABEL_COMPONENT: COMPONENT_GATEWAY}), False)
    pokes: list[int] = []

    async def enqueue(key: Any) -> None:
        return None

    loop = FleetController(
        cast(Kube, None),
        store,
        enqueue,
        lambda key: None,
        FleetSettings(held_wait_seconds=5.0),
        on_held=lambda k: pokes.append(loop.held(k)),
    )
    session = aiohttp.ClientSession()
    request: asyncio.Task[Any] | None = None
    try:
        await loop.tick(key)  # at zero: no replica pushed, the long-poll starts
        assert gateway.replicas == {}
        request = asyncio.create_task(
            session.post(f"http://{host}:{GATEWAY_PORT}/v2/models/m/infer", json=INFER)
        )
        await _until(lambda: loop.held(key) == 1, "the held request seen", lambda: pokes)
        assert pokes and pokes[-1] == 1, pokes  # the service was poked with the count
        # ... and the zero forecast's count of arrivals came with it: the held one included.
        counted = loop.arrivals(key)
        assert counted is not None and counted[0] == {"svc-gateway-1": 1}, counted
        # A runtime pod turns Ready: the next tick hands it to the gateway.
        runtime = _pod("svc-primary-1", runtime_ip, {LABEL_POOL: "primary", LABEL_ROLE: "serving"})
        store.put_child(runtime, False)
        await loop.tick(key)
        await _until(
            lambda: "svc-primary-1" in gateway.replicas,
            "the replica pushed",
            lambda: list(gateway.replicas),
        )
        assert gateway.replicas["svc-primary-1"].url == f"http://{runtime_ip}:{RUNTIME_PORT}"
        # That replica never answers: the request's hold ends at its deadline (503 with
        # Retry-After), nothing is held any more, and the operator hears of it.
        response = await asyncio.wait_for(request, 30)
        assert response.status == 503 and response.headers.get("Retry-After"), response
        await _until(lambda: loop.held(key) == 0, "the held count back to 0", lambda: pokes)
        assert pokes[-1] == 0, pokes
        # The gateway pod goes: its long-poll stops and its count is forgotten.
        store.put_child(_pod("svc-gateway-1", host, {LABEL_COMPONENT: COMPONENT_GATEWAY}), True)
        await loop.tick(key)
        assert loop.states[key].held_polls == {}
        assert loop.arrivals(key) is None  # forgotten with the pod
    finally:
        if request is not None:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
        await session.close()
        await loop.close()
        await runner.cleanup()


def _gateway_deployment(replicas: int) -> dict[str, Any]:
    labels = {LABEL_ISVC: "svc", LABEL_COMPONENT: COMPONENT_GATEWAY}
    return {
        "kind": "Deployment",
        "metadata": {"name": "svc-gateway", "namespace": "ns", "labels": labels},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": replicas},
    }


async def test_a_gateway_left_over_from_zero_still_learns_of_the_replicas_until_retired() -> None:
    """Edited from minReplicas 0 to 1 at zero, the Service keeps selecting the gateway until a
    pod is ready: the loop goes on pushing replicas to it (so what it holds is forwarded), and
    ends once the gateway is retired (scaled to zero)."""
    prefix = f"127.{random.randint(1, 250)}.{random.randint(1, 250)}"
    host, runtime_ip = f"{prefix}.2", f"{prefix}.3"
    gateway = Gateway(GatewayConfig(activator=True, models=["m"], hold_timeout_seconds=8))
    runner = JsonErrorRunner(gateway.build_app(), access_log=None, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, host, GATEWAY_PORT).start()
    store = Store()
    key = store.put_service(minimal(autoscaling={"minReplicas": 1}))
    store.put_child(_gateway_deployment(1), False)
    store.put_child(_pod("svc-gateway-1", host, {LABEL_COMPONENT: COMPONENT_GATEWAY}), False)

    async def enqueue(key: Any) -> None:
        return None

    loop = FleetController(cast(Kube, None), store, enqueue, lambda key: None)
    try:
        loop.ensure(key)
        assert key in loop.tasks, "a live gateway of a service at minReplicas 1 gets a loop"
        runtime = _pod("svc-primary-1", runtime_ip, {LABEL_POOL: "primary", LABEL_ROLE: "serving"})
        store.put_child(runtime, False)
        loop.poke(key)
        await _until(
            lambda: "svc-primary-1" in gateway.replicas,
            "the replica pushed to the left-over gateway",
            lambda: list(gateway.replicas),
        )
        store.put_child(_gateway_deployment(0), False)  # retired by the reconciler
        loop.poke(key)
        await _until(lambda: key not in loop.tasks, "the loop ended", lambda: list(loop.tasks))
    finally:
        await loop.close()
        await runner.cleanup()
