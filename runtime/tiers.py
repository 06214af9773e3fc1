"""The host-warm tier: a replica whose engines are fetched, verified and staged in host memory
but none is on the device (requests refused until it is promoted), and the moves between it
and the device tier (``PUT /v2/tidal/tier``).  The state (``tier``, ``last_tier_change``,
``leaving``, ``last_acquired``) is the engine cache's, which refuses requests off the device.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .enginecache import READY, EngineCache
from .errors import TierConflict

log = logging.getLogger("tidal.runtime.cache")

# Moving to the host tier waits for this long without a request, and gives up (the replica is
# still being routed to) after HOST_DRAIN_SECONDS.
HOST_QUIET_SECONDS = 1.0
HOST_DRAIN_SECONDS = 20.0


async def stage(cache: EngineCache, names: list[str]) -> None:
    """Fetch and verify the engines of ``names`` without loading them (host-warm start)."""
    for name in names:
        slot = cache.slot(name)
        chosen, sha, _ = cache.choose(slot.spec)
        path = await cache.phase(slot, "fetch", cache.store.fetch, chosen.uri, sha)
        slot.staged = (chosen.uri, path)
    cache.metrics.cache_bytes.labels("host").set(cache.store.host_bytes())


async def to_host(
    cache: EngineCache, quiet_seconds: float | None = None, drain_seconds: float | None = None
) -> dict[str, Any]:
    """Become a host-warm standby: go on serving until no request has arrived for
    ``quiet_seconds`` and none is in flight, then take every engine off the device, keeping
    it staged.

    A pod just taken out of a Service still gets requests from clients whose endpoints are
    a moment old; refusing them would fail them, so the engines stay until the traffic has
    stopped. Traffic that goes on for ``drain_seconds`` (the pod is still being routed to),
    or a promotion meanwhile, calls the move off: :class:`TierConflict`, nothing changed.
    """
    quiet_seconds = HOST_QUIET_SECONDS if quiet_seconds is None else quiet_seconds
    drain_seconds = HOST_DRAIN_SECONDS if drain_seconds is None else drain_seconds
    started = cache.clock.monotonic()
    if cache.tier == "host":
        return cache.last_tier_change or {"tier": "host", "seconds": 0.0, "staged": []}
    token = cache.leaving = object()
    deadline = started + drain_seconds
    while True:
        if cache.leaving is not token:
            raise TierConflict("promoted while draining for the host tier: kept on the device")
        busy = any(s.refs > 0 or s.loading is not None for s in cache.slots.values())
        if not busy and cache.clock.monotonic() - cache.last_acquired >= quiet_seconds:
            break
        if cache.clock.monotonic() >= deadline:
            cache.leaving = None
            raise TierConflict(
                f"still receiving requests after {drain_seconds:g} s: kept on the device "
                "(is the pod still in a Service's endpoints?)"
            )
        await asyncio.sleep(0.01)
    cache.leaving = None
    cache.tier = "host"
    cache.changes.bump()
    staged = []
    for slot in cache.slots.values():
        if slot.state == READY and slot.refs == 0:
            cache.take_off(slot)
        if slot.staged is not None:
            staged.append(slot.spec.name)
    cache.publish()
    cache.changes.bump()
    cache.last_tier_change = {
        "tier": "host",
        "seconds": round(cache.clock.monotonic() - started, 4),
        "staged": sorted(staged),
    }
    log.info("host-warm: %d engine(s) staged, none on the device", len(staged))
    return cache.last_tier_change


async def to_device(cache: EngineCache, names: list[str]) -> dict[str, Any]:
    """Promote a host-warm standby: load ``names`` (the preloaded models) from their staged
    files — no fetch, no cold-load cost — warm them up, then accept requests again."""
    started = cache.clock.monotonic()
    cache.leaving = None  # a move to the host tier in progress is called off
    if cache.tier == "device":
        return {"tier": "device", "seconds": 0.0, "models": {}}
    models: dict[str, float] = {}
    for name in names:
        t0 = cache.clock.monotonic()
        await cache.ensure_loaded(name)
        models[name] = round(cache.clock.monotonic() - t0, 4)
    cache.tier = "device"
    cache.changes.bump()
    cache.last_tier_change = {
        "tier": "device",
        "seconds": round(cache.clock.monotonic() - started, 4),
        "models": models,
    }
    log.info("promoted to the device in %.3fs: %s", cache.clock.monotonic() - started, models)
    return cache.last_tier_change
