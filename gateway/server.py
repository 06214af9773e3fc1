"""The gateway process: its parts wired together (:class:`Gateway`: the :class:`Fleet` of
replicas, :class:`Loads`, :class:`Holds`, the :class:`Dispatcher` both fronts send requests
through, the HTTP front) and served with the gRPC front (:func:`serve`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from aiohttp import web

from ..common.http import JsonErrorRunner
from ..common.offload import Offload
from .config import GatewayConfig, ReplicaRef
from .dispatch import Dispatcher
from .holding import Holds
from .http_front import HttpFront
from .loads import Loads
from .metrics import GatewayMetrics
from .replicas import Fleet, Replica

log = logging.getLogger("tidal.gateway")

HOLDS_ANSWERED_S = 5.0  # after the drain: how long the last held answers may take to leave


class Gateway:
    """The gateway's parts and its lifecycle: started by its application, drained on SIGTERM."""

    def __init__(self, config: GatewayConfig, replicas: Sequence[ReplicaRef] = ()) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.fleet = Fleet(config, self.metrics)
        self.holds = Holds(self.fleet, self.time)
        self.loads = Loads(self.fleet, self.time)
        self.dispatcher = Dispatcher(self.holds, self.loads)
        self.http = HttpFront(self)
        self.name = os.environ.get("POD_NAME") or "tidal-gateway"
        # Large or compressed bodies on the hold path are judged in a worker process, one at
        # a time: their parse never stalls the loop (health, forwards), its memory is bounded.
        self.offload = Offload(workers=1)
        self._initial = list(replicas)
        self._loop: asyncio.AbstractEventLoop | None = None

    def build_app(self) -> web.Application:
        return self.http.build_app()

    async def on_startup(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()
        self.fleet.set(self._initial, {})

    async def on_cleanup(self, app: web.Application) -> None:
        self.offload.close()
        await self.loads.close()
        await self.fleet.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the gateway has not started"
        return self._loop

    def time(self) -> float:
        """The event loop's monotonic clock: every deadline and duration of the gateway."""
        return self.loop.time()

    @property
    def replicas(self) -> dict[str, Replica]:
        return self.fleet.replicas

    @property
    def held_now(self) -> int:
        return self.holds.count

    @property
    def held_bytes(self) -> int:
        return self.holds.bytes

    @property
    def ready(self) -> bool:
        """A healthy replica and not draining; an activator takes requests with no replica at
        all: it holds them while the service wakes from zero."""
        return (self.fleet.healthy > 0 or self.config.activator) and not self.holds.draining

    def start_draining(self) -> None:
        """Not ready from now on; every hold ends within ``shutdownDrainSeconds`` (held
        requests are forwarded if a replica becomes routable by then, else answered 503),
        so the process exits within the pod's grace period, not at the hold deadlines."""
        self.holds.start_draining()

    async def holds_answered(self, within_s: float) -> bool:
        """Wait until no request is held (True), at most ``within_s`` seconds."""
        return await self.holds.answered(within_s)


async def serve(
    config: GatewayConfig,
    host: str,
    port: int,
    replicas: Sequence[ReplicaRef] = (),
    stop: asyncio.Event | None = None,
    grpc_port: int = 0,
) -> None:
    """Run the gateway until cancelled or until ``stop`` is set, then drain like the runtime.
    ``grpc_port``: also pass OIP v2 gRPC calls through (``tidal.gateway.grpc_proxy``); 0: not."""
    from .grpc_proxy import start_grpc

    gateway = Gateway(config, replicas)
    runner = JsonErrorRunner(
        gateway.build_app(),
        access_log=None,
        handle_signals=False,
        auto_decompress=False,
        header_read_timeout=config.header_read_timeout_seconds,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    grpc_server = proxy = None
    try:
        if grpc_port:
            grpc_server, proxy = await start_grpc(gateway, host, grpc_port)
        log.info(
            "tidal-gateway listening on %s:%d%s, %d replicas",
            host,
            port,
            f" (gRPC {proxy.port})" if proxy is not None else "",
            len(replicas),
        )
        await (stop or asyncio.Event()).wait()
        gateway.start_draining()
        log.info(
            "stopping: not ready, serving for %.1fs more (%d requests held)",
            config.shutdown_drain_seconds,
            gateway.held_now,
        )
        await asyncio.sleep(config.shutdown_drain_seconds)
        # Each hold ended with the drain: wait for the last answers to leave (a held request
        # forwarded at the end is the replica's, no longer held).
        if not await gateway.holds_answered(HOLDS_ANSWERED_S):
            log.warning("stopping with %d requests still held", gateway.held_now)
    finally:
        if grpc_server is not None and proxy is not None:
            await grpc_server.stop(1.0)
            await proxy.close()
        await runner.cleanup()
