"""One request's way through the gateway, as plain data: forward, hold, retry or give up.

Both fronts (HTTP, :mod:`tidal.gateway.http_front`, and gRPC, :mod:`tidal.gateway.grpc_proxy`)
run the same loop (:class:`tidal.gateway.dispatch.Dispatcher`), which asks this module at every
turn what to do with the route :func:`~tidal.gateway.core.routing.choose_route` chose:

* :func:`next_step`: forward (and to which replica, with which extra load), refuse (an unknown
  model: 404; nothing routable for a request that may not be held: 503), or hold (and which
  load to start, whether it waits for a request slot or for a model);
* :func:`least_busy`: the replica for a call that names no model (gRPC repository calls);
* :func:`tries`: how many forwards a request gets before the gateway gives up;
* :func:`hold_end`: whether a held request's time is up, and why (its deadline, or the drain).

No clock, no I/O: the shell passes the time in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from .routing import Reason, ReplicaView, Route

StepAction = Literal["forward", "unknown", "unavailable", "hold"]


class Step(NamedTuple):
    """What the shell does next with one request (a tuple: one is made per request)."""

    action: StepAction
    reason: Reason | None = None  # the route's (None: a call that names no model)
    replica: str | None = None  # forward: where to; hold: where to start a load (None: none)
    extra_load: str | None = None  # forward: also load a copy here (busy:extra-copy)
    slot: bool = False  # hold: waiting for a request slot (the burst buffer), not for a model


def next_step(route: Route, *, may_hold: bool) -> Step:
    """The step for ``route``. A request that may not be held (metadata) goes to whichever
    replica the route names, hot or not (the one loading the model, or the one that would):
    it can answer for the model without holding anything."""
    if route.action == "forward" or (not may_hold and route.replica is not None):
        return Step("forward", route.reason, route.replica, route.extra_load)
    if route.status == 404:
        return Step("unknown", route.reason)
    if not may_hold:
        return Step("unavailable", route.reason)
    load = route.replica if route.action == "load" else None
    return Step("hold", route.reason, load, slot=route.reason == "busy:wait-slot")


def least_busy(replicas: Sequence[ReplicaView], excluded: frozenset[str]) -> Step:
    """A call that names no model: the healthy replica with the fewest requests in flight
    (the first in ``replicas`` among equals); never held."""
    healthy = [r for r in replicas if r.healthy and r.name not in excluded]
    if not healthy:
        return Step("unavailable", "unavailable:no-replica")
    return Step("forward", None, min(healthy, key=lambda r: r.outstanding).name)


def tries(may_hold: bool, refused: int) -> int:
    """Forwards a request gets before the gateway gives up: two; three for one that may be
    held once a replica refused it (503): a replica killed mid-request, then a copy the gateway
    saw hot but evicted meanwhile, must not fail a request that a third replica can load."""
    return 3 if may_hold and refused else 2


HoldEnd = Literal["expired", "drained"]


def hold_end(now: float, deadline: float, own_deadline: float) -> HoldEnd | None:
    """None while a held request may wait on; else ``drained`` when the drain's end
    (``deadline``, earlier than its ``own_deadline``) ended it, ``expired`` when its own did."""
    if now < deadline:
        return None
    return "drained" if deadline < own_deadline else "expired"
