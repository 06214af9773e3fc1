"""Where the gateway sends one request (pure: no I/O, no clock, no aiohttp, no Prometheus).

:func:`choose_route` maps (model, a view of every replica, the load limits, the operator's
placement hints) to a :class:`Route` with a reason from a closed vocabulary (:data:`REASONS`):

=========================  ===========================================================
reason                     route
=========================  ===========================================================
``hot:least-outstanding``  forward to the hot copy with the fewest requests in flight
``busy:wait-slot``         every hot copy has its ``request_slots`` in flight (the burst
                           buffer): hold the request until a slot frees on any of them
``busy:extra-copy``        the same, and start a load on another replica: every hot copy
                           has more than ``busy_outstanding`` in flight and none is loading
``cold:wait-loading``      no hot copy, one is loading: hold the request until it is ready
``cold:load-placed``       no copy: load on the replica the placement names, then forward
``cold:load-most-free``    no copy, no placement: load where most bytes are free
``unavailable:no-replica`` no healthy replica serves the model (503; the shell holds)
``unavailable:no-room``    every replica recently refused to load it for lack of room (503)
``unavailable:load-limit`` the per-replica or fleet-wide load limit is reached (503)
``unknown:model``          no such model (404)
=========================  ===========================================================

Ties are broken by the placement's order and then by replica name, so the same inputs give
the same route whatever the order of ``replicas``.

The load limits (:class:`LoadBudget`: per replica and fleet-wide) bound loads that evict: each
pushes some engine out, and many at once are churn. The fleet-wide limit grows with the fleet
unless set (``LoadBudget.fleet_limit``: the per-replica limit summed over the replicas that
serve the model; issue 45). A load of a known size that fits in a
replica's free bytes evicts nothing, so it goes beyond both limits
(``LoadBudget.beyond_into_free``): the limits then scale with the fleet's free room instead of
holding a rare model's request behind a fixed 1 / 4 (fleet simulator, issue 23 third pass) —
but never beyond the replica's own load slots (``ReplicaView.load_slots``, its
``maxConcurrentLoads``), and free bytes count every load under way there
(:mod:`tidal.gateway.core.views`): without both, a burst of cold requests for different models
all saw the same free bytes and queued 124 loads on one replica (issue 30).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Reason = Literal[
    "hot:least-outstanding",
    "busy:wait-slot",
    "busy:extra-copy",
    "cold:wait-loading",
    "cold:load-placed",
    "cold:load-most-free",
    "unavailable:no-replica",
    "unavailable:no-room",
    "unavailable:load-limit",
    "unknown:model",
]
REASONS: tuple[Reason, ...] = get_args(Reason)

Action = Literal["forward", "load", "wait", "reject"]


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the gateway knows about one replica when it routes."""

    name: str
    healthy: bool
    models: frozenset[str]  # every model the replica can serve (its configuration)
    hot: frozenset[str]  # resident and warm: routable now
    loading: frozenset[str] = frozenset()  # loads under way there (reported, or started by us)
    outstanding: int = 0  # the gateway's own requests in flight to this replica
    free_bytes: int = 0  # engine-cache budget not yet used
    budget_bytes: int = 0
    # Distinct on-demand loads there now (the replica's background loads of pinned models are
    # not counted: the runtime keeps a load slot apart for on-demand loads).
    loads_in_flight: int = 0
    refused: frozenset[str] = frozenset()  # models it refused to load lately (no room)
    # Bytes a load can have there by evicting unpinned engines (budget - pinned); None: unknown.
    room_bytes: int | None = None
    # Loads the replica runs at once (its maxConcurrentLoads): the bound on loads into free
    # bytes there, so that they never wait in its load queue.
    load_slots: int = 1
    # The burst buffer: requests the gateway keeps in flight here at most (0: no bound).
    request_slots: int = 0

    @property
    def slot_free(self) -> bool:
        return self.request_slots == 0 or self.outstanding < self.request_slots


@dataclass(frozen=True, slots=True)
class LoadBudget:
    """Bounds on concurrent loads: per replica and across the whole fleet."""

    per_replica: int = 1
    # None (the default): sized from the fleet, the per-replica limit summed over the healthy
    # replicas that serve the model (`fleet_limit`): a constant (it was 4) held ~53 requests
    # in the gateway on 12 replicas whose load slots stood idle (issue 45).
    total: int | None = None
    # Whether a load that fits in a replica's free bytes (it evicts nothing) may go beyond
    # both limits: the limits bound the churn of loads that evict; free room bounds the rest.
    beyond_into_free: bool = True

    def fleet_limit(self, replicas: Sequence[ReplicaView]) -> int:
        """Loads that evict, at once across `replicas`: `total` when set, else each replica's
        share (the per-replica limit, never above its own load slots) summed, at least 1."""
        if self.total is not None:
            return self.total
        return max(1, sum(min(self.per_replica, max(r.load_slots, 1)) for r in replicas))


@dataclass(frozen=True, slots=True)
class Route:
    action: Action
    reason: Reason
    replica: str | None = None  # forward/wait: where the request goes; load: where to load
    extra_load: str | None = None  # busy:extra-copy: also load a copy here
    status: int = 200  # reject: 404 or 503

    @property
    def cold(self) -> bool:
        return self.action in ("load", "wait")


NO_PLACEMENT: Mapping[str, tuple[str, ...]] = {}


def _rank(placed: tuple[str, ...], name: str) -> int:
    return placed.index(name) if name in placed else len(placed)


def _load_target(
    candidates: Sequence[ReplicaView],
    loads: LoadBudget,
    fleet_loads: int,
    placed: tuple[str, ...],
    model_bytes: int,
) -> tuple[ReplicaView | None, Reason]:
    """Where a new copy should be loaded, or why nowhere.

    A replica whose room (budget - pinned) is known to be smaller than the model's known size
    is never asked: it could only refuse (503), and each refusal kept that replica from the
    model for the refusal cooldown while the request waited. A model of unknown size goes first
    where the room is largest, so that its first load lands wherever even the largest fits.
    """
    limit = loads.fleet_limit(candidates)
    if model_bytes > 0:
        candidates = [r for r in candidates if r.room_bytes is None or r.room_bytes >= model_bytes]
    if not candidates:
        return None, "unavailable:no-room"

    def into_free(r: ReplicaView) -> bool:
        return (
            loads.beyond_into_free
            and 0 < model_bytes <= r.free_bytes
            and r.loads_in_flight < max(r.load_slots, loads.per_replica)
        )

    under_total = fleet_loads < limit
    eligible = [
        r
        for r in candidates
        if into_free(r) or (under_total and r.loads_in_flight < loads.per_replica)
    ]
    if not eligible:
        return None, "unavailable:load-limit"
    in_placement = [r for r in eligible if r.name in placed]
    if in_placement:
        return min(in_placement, key=lambda r: (_rank(placed, r.name), r.name)), "cold:load-placed"
    unknown = model_bytes <= 0
    best = min(
        eligible,
        key=lambda r: (
            # a model of unknown size: first where the room is largest ...
            -(r.budget_bytes if r.room_bytes is None else r.room_bytes) if unknown else 0,
            # ... else where it fits without evicting anything
            r.free_bytes < model_bytes,
            -r.free_bytes,
            r.loads_in_flight,
            r.outstanding,
            r.name,
        ),
    )
    return best, "cold:load-most-free"


def choose_route(
    model: str,
    replicas: Sequence[ReplicaView],
    loads: LoadBudget,
    placement: Mapping[str, tuple[str, ...]] = NO_PLACEMENT,
    *,
    busy_outstanding: int = 8,
    known_models: frozenset[str] = frozenset(),
    model_bytes: int = 0,
    wait_for_slot: bool = True,
) -> Route:
    """Decide where ``model``'s next request goes (see the module docstring for the reasons).

    ``known_models``: the configured model names; empty accepts any model a replica reports.
    ``model_bytes``: the model's last measured size (0: unknown), to prefer replicas where a
    new copy fits without evictions. ``wait_for_slot``: whether a request that finds every hot
    copy at its ``request_slots`` waits (``busy:wait-slot``); a call that cannot be held
    (metadata) goes to the least busy copy instead.
    """
    if known_models and model not in known_models:
        return Route("reject", "unknown:model", status=404)
    candidates = [r for r in replicas if r.healthy and model in r.models]
    if not candidates:
        reported = any(r.models for r in replicas)
        if not known_models and reported and not any(model in r.models for r in replicas):
            return Route("reject", "unknown:model", status=404)
        return Route("reject", "unavailable:no-replica", status=503)
    placed = placement.get(model, ())
    hot = [r for r in candidates if model in r.hot]
    loading = any(model in r.loading for r in candidates)
    fleet_loads = sum(r.loads_in_flight for r in replicas)
    if hot:
        free = [r for r in hot if r.slot_free]
        if not free and wait_for_slot:
            return Route("wait", "busy:wait-slot")
        best = min(free or hot, key=lambda r: (r.outstanding, _rank(placed, r.name), r.name))
        if best.outstanding > busy_outstanding and not loading:
            others = [r for r in candidates if model not in r.hot and model not in r.refused]
            extra, _ = _load_target(others, loads, fleet_loads, placed, model_bytes)
            if extra is not None:
                return Route("forward", "busy:extra-copy", best.name, extra_load=extra.name)
        return Route("forward", "hot:least-outstanding", best.name)
    if loading:
        waiting = [r for r in candidates if model in r.loading]
        best = min(waiting, key=lambda r: (r.outstanding, _rank(placed, r.name), r.name))
        return Route("wait", "cold:wait-loading", best.name)
    target, reason = _load_target(
        [r for r in candidates if model not in r.refused], loads, fleet_loads, placed, model_bytes
    )
    if target is None:
        return Route("reject", reason, status=503)
    return Route("load", reason, target.name)
