"""The fleet endpoints (``/v2/tidal/*``, :mod:`tidal.common.contract`): what the gateway and
the operator ask of a runtime.  ``GET /v2/tidal/models``, the hot set and each model's state (a
long-poll with ``since``); ``GET /v2/tidal/activity``, the infer requests that arrived (a
long-poll: how the operator learns at once that traffic reached a quiet service);
``PUT /v2/tidal/placement``, the pinned models; ``GET``/``PUT /v2/tidal/tier``, the host-warm
tier (:mod:`tidal.runtime.tiers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..common.contract import PATH_ACTIVITY, PATH_MODELS, PATH_PLACEMENT, PATH_TIER
from . import tiers
from .enginecache import ChangeFeed
from .errors import InvalidRequest, Unavailable

if TYPE_CHECKING:
    from .server import RuntimeServer

MAX_LONG_POLL_S = 30.0  # longest a GET /v2/tidal/models?since=… waits for a change
MAX_ACTIVITY_POLL_S = 120.0  # longest a GET /v2/tidal/activity?since=… waits for a request


async def _long_poll(request: web.Request, feed: ChangeFeed, cap_seconds: float) -> None:
    """With ``?since=G[&wait=S]``: wait until ``feed`` moves past G, at most S (default 30) and
    ``cap_seconds``; without ``since``, return at once."""
    since_text = request.query.get("since")
    if since_text is None:
        return
    try:
        since = int(since_text)
        wait = float(request.query.get("wait", "30"))
    except ValueError:
        raise InvalidRequest("'since' must be an integer and 'wait' a number") from None
    await feed.wait_past(since, min(max(wait, 0.0), cap_seconds))


class FleetEndpoints:
    """The ``/v2/tidal/*`` handlers of one :class:`~tidal.runtime.server.RuntimeServer`."""

    def __init__(self, server: RuntimeServer) -> None:
        self.server = server

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get(PATH_MODELS, self.models)
        router.add_get(PATH_ACTIVITY, self.activity)
        router.add_put(PATH_PLACEMENT, self.placement)
        router.add_get(PATH_TIER, self.tier_get)
        router.add_put(PATH_TIER, self.tier_put)

    async def models(self, request: web.Request) -> web.Response:
        """The hot set and per-model state; with ``since``, a long-poll for the next change."""
        await _long_poll(request, self.server.cache.changes, MAX_LONG_POLL_S)
        return web.json_response(self.view(request))

    def concurrency(self, model: str) -> int:
        """Requests of ``model`` executing at once: execution slots x the largest batch."""
        batcher = self.server.batchers.get(model)
        if batcher is None:
            return 0
        return batcher.slots * batcher.spec.max_batch_size

    async def activity(self, request: web.Request) -> web.Response:
        """``{"arrivals": N}``, the infer requests that arrived so far; with ``since``, a
        long-poll that answers once the count differs from it (or after ``wait`` seconds)."""
        await _long_poll(request, self.server.arrivals, MAX_ACTIVITY_POLL_S)
        return web.json_response({"arrivals": self.server.arrivals.generation})

    def view(self, request: web.Request) -> dict[str, Any]:
        cache = self.server.cache
        replica = self.server.replica_name
        if replica is None:
            sockname = request.transport.get_extra_info("sockname") if request.transport else None
            replica = f"{sockname[0]}:{sockname[1]}" if sockname else request.host
        return {
            "replica": replica,
            "generation": cache.changes.generation,
            "ready": self.server.ready and not self.server.draining,
            "budgetBytes": cache.budget,
            "residentBytes": cache.resident_bytes(),
            "maxConcurrentLoads": self.server.config.max_concurrent_loads,
            # Loads accepted, not yet in residentBytes: expected bytes (issue 30); and how many
            # loads wait for a load slot.
            "pendingLoads": cache.pending_loads(),
            "loadQueue": cache.load_queue(),
            "models": {
                name: {
                    "state": slot.fleet_state,
                    "sizeBytes": slot.size_bytes,
                    "lastSizeBytes": slot.last_size_bytes,
                    "loadSeconds": slot.last_load_seconds,
                    "outstanding": slot.outstanding,
                    "requests": slot.requests,
                    "pinned": slot.pinned,
                    "lastError": slot.last_error,
                    # Requests it executes at once with full batches: the burst buffer in
                    # front (the gateway) sends no more than twice this (one batch forming
                    # behind each executing one) and holds the rest (issue 40).
                    "concurrency": self.concurrency(name),
                }
                for name, slot in cache.slots.items()
            },
        }

    async def placement(self, request: web.Request) -> web.Response:
        """Replace the pinned set: those models are loaded in the background and kept hot."""
        body = await self.server.json_body(request)
        pinned = body.get("pinned")
        if set(body) - {"pinned"} or not isinstance(pinned, list):
            raise InvalidRequest('the body must be {"pinned": ["model", ...]}')
        if not all(isinstance(name, str) for name in pinned):
            raise InvalidRequest("'pinned' must be a list of model names (strings)")
        unknown = sorted(set(pinned) - set(self.server.cache.slots))
        if unknown:
            raise InvalidRequest(f"unknown models {unknown}: not in this runtime's configuration")
        accepted, rejected = self.server.cache.set_pins(pinned)
        loading = [name for name in self.server.cache.pins_loading() if name in accepted]
        return web.json_response({"pinned": accepted, "loading": loading, "rejected": rejected})

    async def tier_get(self, request: web.Request) -> web.Response:
        """Where the engines are: ``device`` (serving) or ``host`` (host-warm standby)."""
        return web.json_response(
            {"tier": self.server.cache.tier, "last": self.server.cache.last_tier_change}
        )

    async def tier_put(self, request: web.Request) -> web.Response:
        """``{"tier": "host"}``: drain, take the engines off the device, keep them staged;
        ``{"tier": "device"}``: load the preloaded models from their staged files, warm them up,
        serve again. Answers when done, with the seconds it took (the operator's promotion)."""
        body = await self.server.json_body(request)
        tier = body.get("tier")
        if set(body) - {"tier"} or tier not in ("host", "device"):
            raise InvalidRequest('the body must be {"tier": "host"} or {"tier": "device"}')
        if not self.server.ready:
            raise Unavailable("not ready yet: engines are still being fetched", retry_after=1)
        if tier == "host":
            result = await tiers.to_host(self.server.cache)
        else:
            names = [m.name for m in self.server.config.models if m.preload]
            result = await tiers.to_device(self.server.cache, names)
        return web.json_response(result)
