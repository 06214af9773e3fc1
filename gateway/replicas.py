"""The replicas the gateway knows, their views kept fresh, and the route over them.

* :class:`Replica`: one runtime replica (its last snapshot, the gateway's requests in flight and
  loads there, its refusals) and the cached :class:`~tidal.gateway.core.routing.ReplicaView`
  routing decides on, rebuilt only when it changes.
* :class:`Fleet`: the replica list (replaced whole by the operator's ``PUT /v2/tidal/replicas``,
  level-triggered), one watcher task per replica that long-polls ``GET /v2/tidal/models`` on a
  control session of that replica's own (closed when the replica is forgotten, so a new replica
  at a reused address never inherits a dead connection), so a hot-set change reaches the
  routing table within milliseconds, and :meth:`Fleet.route`, the shell of
  :func:`~tidal.gateway.core.routing.choose_route`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from ..common.backoff import Backoff, Retry
from .config import GatewayConfig, ReplicaRef
from .core.routing import LoadBudget, ReplicaView, Route, choose_route
from .core.views import (
    NO_LOADS,
    OwnLoads,
    Snapshot,
    free_bytes,
    model_bytes,
    parse_snapshot,
    replica_view,
)
from .holding import Changes
from .metrics import GatewayMetrics
from .upstream import UpstreamPool

log = logging.getLogger("tidal.gateway")

WATCH_BACKOFF = Backoff(first_seconds=0.05, max_seconds=2.0)
# A replica that cannot be reached or answers nonsense: unhealthy until it answers again.
WATCH_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError)
UNKNOWN_LABEL = "(unknown)"  # metrics label of names no replica serves (bounded cardinality)


@dataclass(eq=False)
class Replica:
    """One runtime replica as the gateway knows it; its view is rebuilt only when it changes."""

    name: str
    url: str
    pool: UpstreamPool
    healthy: bool = False
    snapshot: Snapshot = field(default_factory=Snapshot)  # its last GET /v2/tidal/models
    outstanding: int = 0
    own_loads: OwnLoads = NO_LOADS  # loads asked for here, not answered yet
    refused: set[str] = field(default_factory=set)
    # Refused models the replica said room for exists once some requests end ("waitingOn"):
    # asked again at its next snapshot (its long-poll moves when they end), not after the
    # refusal cooldown (issue 45).
    refused_until_change: set[str] = field(default_factory=set)
    last_error: str | None = None
    watcher: asyncio.Task[None] | None = None
    # Long-polls and loads go on a session of the replica's own, closed with it: a pooled
    # connection to a forgotten replica must never serve a new one that reuses its address
    # (a dead peer's connection can hang a request for seconds).
    control: aiohttp.ClientSession | None = None
    slots_per_concurrency: float = 0.0  # the burst buffer's bound (GatewayConfig)
    _view: ReplicaView | None = None

    def invalidate(self) -> None:
        self._view = None

    def view(self) -> ReplicaView:
        cached = self._view
        if cached is not None and cached.outstanding == self.outstanding:
            return cached
        cached = self._view = replica_view(
            self.name,
            self.snapshot,
            healthy=self.healthy,
            outstanding=self.outstanding,
            own=self.own_loads,
            refused=frozenset(self.refused),
            slots_per_concurrency=self.slots_per_concurrency,
        )
        return cached

    def session(self) -> aiohttp.ClientSession:
        """The replica's control session (long-polls and loads), opened on first use."""
        if self.control is None:
            self.control = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=16),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self.control

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "healthy": self.healthy,
            "generation": self.snapshot.generation,
            "hot": sorted(self.snapshot.hot),
            "loading": sorted(self.snapshot.loading | self.own_loads.models),
            "outstanding": self.outstanding,
            "requestSlots": self.view().request_slots,
            "freeBytes": free_bytes(self.snapshot, self.own_loads),
            "budgetBytes": self.snapshot.budget_bytes,
            "loadQueue": self.snapshot.load_queue,
            "loadSlots": self.snapshot.load_slots,
            "refused": sorted(self.refused),
            "lastError": self.last_error,
        }


class Fleet:
    """The replicas, the operator's placement hints, and what routing knows of them."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.replicas: dict[str, Replica] = {}
        self.placement: dict[str, tuple[str, ...]] = {}
        self.known = frozenset(config.models)
        self.loads = LoadBudget(config.max_loads_per_replica, config.max_loads_total)
        self.changes = Changes()  # the fleet changed: held requests route again
        self._background: set[asyncio.Task[None]] = set()

    def set(self, refs: Iterable[ReplicaRef], placement: dict[str, list[str]] | None) -> None:
        """Replace the replica list (level-triggered): watch new ones, forget removed ones."""
        wanted = {ref.name: ref for ref in refs}
        kept: dict[str, Replica] = {}
        for name, replica in self.replicas.items():
            ref = wanted.get(name)
            if ref is not None and ref.url == replica.url:
                kept[name] = replica
            else:
                self._forget(replica)
        limit = self.config.max_connections_per_replica
        for name, ref in wanted.items():
            if name not in kept:
                kept[name] = Replica(
                    name=name,
                    url=ref.url,
                    pool=UpstreamPool(ref.url, limit),
                    slots_per_concurrency=self.config.slots_per_concurrency,
                )
                self._watch(kept[name])
        if list(wanted) != list(self.replicas):
            log.info("replicas: %s", ", ".join(f"{n} ({r.url})" for n, r in wanted.items()))
        self.replicas = {name: kept[name] for name in wanted}
        if placement is not None:
            self.placement = {model: tuple(names) for model, names in placement.items()}
        self.changed()

    def _forget(self, replica: Replica) -> None:
        if replica.watcher is not None:
            replica.watcher.cancel()
        replica.pool.close()
        if replica.control is not None:
            task = asyncio.create_task(replica.control.close())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        tasks = [r.watcher for r in self.replicas.values() if r.watcher is not None]
        tasks += list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for replica in self.replicas.values():
            replica.pool.close()
            if replica.control is not None:
                await replica.control.close()

    @property
    def healthy(self) -> int:
        return sum(1 for r in self.replicas.values() if r.healthy)

    def changed(self) -> None:
        """The replicas' health or hot sets changed: gauges, and held requests route again."""
        healthy = self.healthy
        self.metrics.replicas.labels("healthy").set(healthy)
        self.metrics.replicas.labels("unhealthy").set(len(self.replicas) - healthy)
        self.changes.notify()

    def _watch(self, replica: Replica) -> None:
        if replica.watcher is not None:
            replica.watcher.cancel()
        replica.watcher = asyncio.create_task(self._watcher(replica), name=f"watch-{replica.name}")

    def mark_unhealthy(self, replica: Replica, reason: str) -> None:
        """A forward or load to it failed: stop routing there and re-check it at once."""
        replica.last_error = reason
        if replica.healthy:
            log.warning("replica %s (%s) is unhealthy: %s", replica.name, replica.url, reason)
            replica.healthy = False
            replica.invalidate()
            if self.replicas.get(replica.name) is replica:
                self._watch(replica)  # a fresh poll answers at once, whatever the generation
            self.changed()

    async def _watcher(self, replica: Replica) -> None:
        """Long-poll the replica's hot set for as long as it is in the list."""
        control = replica.session()
        retry = Retry(WATCH_BACKOFF)
        since: int | None = None
        wait = self.config.watch_wait_seconds
        url = f"{replica.url}/v2/tidal/models"
        while True:
            params = {} if since is None else {"since": str(since), "wait": str(wait)}
            try:
                async with control.get(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=wait + 10)
                ) as response:
                    if response.status != 200:
                        text = (await response.text())[:200]
                        raise ValueError(f"GET /v2/tidal/models answered {response.status}: {text}")
                    snapshot = await response.json()
                self._apply_snapshot(replica, snapshot)
                since = int(snapshot["generation"])
                retry.reset()
            except asyncio.CancelledError:
                raise
            except WATCH_ERRORS as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if replica.healthy or replica.last_error != reason:
                    log.info("watching %s (%s): %s", replica.name, replica.url, reason)
                replica.last_error = reason
                since = None
                if replica.healthy:
                    replica.healthy = False
                    replica.invalidate()
                    self.changed()
                await retry.wait()

    def _apply_snapshot(self, replica: Replica, document: dict[str, Any]) -> None:
        snapshot = parse_snapshot(document)
        if snapshot.ready != replica.healthy:
            log.info("replica %s is %s", replica.name, "healthy" if snapshot.ready else "not ready")
        if replica.refused_until_change and snapshot.generation != replica.snapshot.generation:
            replica.refused -= replica.refused_until_change  # the room may be there now
            replica.refused_until_change.clear()
        replica.snapshot = snapshot
        replica.healthy = snapshot.ready
        replica.last_error = None
        replica.invalidate()
        self.changed()

    def views(self) -> list[ReplicaView]:
        return [r.view() for r in self.replicas.values()]

    def route(
        self, model: str, excluded: frozenset[str] = frozenset(), *, may_wait: bool = True
    ) -> Route:
        views = self.views()
        if excluded:
            views = [replace(v, healthy=False) if v.name in excluded else v for v in views]
        return choose_route(
            model,
            views,
            self.loads,
            self.placement,
            busy_outstanding=self.config.busy_outstanding,
            known_models=self.known,
            model_bytes=self.model_bytes(model),
            wait_for_slot=may_wait,
        )

    def model_bytes(self, model: str) -> int:
        return model_bytes((r.snapshot for r in self.replicas.values()), model)

    def model_label(self, model: str) -> str:
        if self.known:
            return model if model in self.known else UNKNOWN_LABEL
        return (
            model
            if any(model in r.snapshot.models for r in self.replicas.values())
            else UNKNOWN_LABEL
        )
