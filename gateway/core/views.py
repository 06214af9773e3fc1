"""What the gateway knows of each replica when it routes (pure: no I/O, no clock, no aiohttp).

The gateway's shell (``tidal.gateway.server``) and the fleet simulator (``bench/fleet_sim.py``)
both assemble :func:`~tidal.gateway.core.routing.choose_route`'s inputs here, so that the
simulator runs the code users run (DESIGN.md §9):

* :func:`parse_snapshot`: one runtime's ``GET /v2/tidal/models`` answer as a :class:`Snapshot`;
* :class:`OwnLoads`: the loads the gateway has asked a replica for and not had an answer to yet,
  with the bytes each is expected to take (reserved on dispatch, released on the answer);
* :func:`free_bytes` and :func:`replica_view`: the :class:`ReplicaView` routing decides on;
* :func:`model_bytes`: a model's last measured size over the fleet (0: unknown).

Free bytes are the budget less everything that will be resident once the loads under way end:
``residentBytes`` (engines ready, and loads that hold a load slot and have reserved their
bytes), the runtime's ``pendingLoads`` (accepted, queued for a load slot or fetching, bytes not
reserved yet) and the gateway's own loads the runtime has not reported yet. Counting only
``residentBytes`` showed every load of a burst the same free bytes, and loads that "fit in free
bytes" (``LoadBudget.beyond_into_free``) piled onto one replica: its load queue reached 124
(issue 30).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .routing import ReplicaView

READY = "READY"
LOADING = "LOADING"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One runtime's hot-set report, as the gateway uses it."""

    generation: int = -1
    ready: bool = False
    models: frozenset[str] = frozenset()  # every model the replica can serve
    hot: frozenset[str] = frozenset()  # READY
    loading: frozenset[str] = frozenset()  # LOADING: accepted, from queued to warming up
    budget_bytes: int = 0
    resident_bytes: int = 0  # engines ready + loads holding a slot (their bytes reserved)
    sizes: Mapping[str, int] = field(default_factory=dict)  # last measured, per model
    pinned: frozenset[str] = frozenset()
    load_seconds: Mapping[str, float] = field(default_factory=dict)
    # Loads accepted whose bytes are not in resident_bytes yet -> expected bytes (0: unknown).
    pending: Mapping[str, int] = field(default_factory=dict)
    load_slots: int = 1  # maxConcurrentLoads
    load_queue: int = 0  # loads waiting for a load slot
    # Requests each model executes at once with full batches (slots x maxBatchSize); absent
    # from older runtimes (0: unknown).
    concurrency: Mapping[str, int] = field(default_factory=dict)

    @property
    def pinned_bytes(self) -> int:
        return sum(self.sizes.get(n, 0) for n in self.pinned)


def waiting_on(body: bytes) -> tuple[str, ...]:
    """The models a replica's load refusal (503) says hold the room it needs (its JSON body's
    ``waitingOn``): room exists once their requests end. Empty: not said (an older runtime,
    or pinned engines hold the bytes), or not a JSON object."""
    try:
        document = json.loads(body)
    except ValueError:
        return ()
    names = document.get("waitingOn") if isinstance(document, dict) else None
    if not isinstance(names, list):
        return ()
    return tuple(n for n in names if isinstance(n, str))


def parse_snapshot(document: Mapping[str, Any]) -> Snapshot:
    """Typed view of ``GET /v2/tidal/models``; raises ``KeyError``, ``ValueError`` or
    ``TypeError`` when the document is not one (the shell marks the replica unhealthy).

    ``pendingLoads`` and ``loadQueue`` are absent from older runtimes: nothing pending then.
    """
    models: Mapping[str, Mapping[str, Any]] = document["models"]
    sizes = {n: int(m.get("lastSizeBytes", 0)) for n, m in models.items()}
    pending = document.get("pendingLoads") or {}
    return Snapshot(
        generation=int(document["generation"]),
        ready=bool(document["ready"]),
        models=frozenset(models),
        hot=frozenset(n for n, m in models.items() if m["state"] == READY),
        loading=frozenset(n for n, m in models.items() if m["state"] == LOADING),
        budget_bytes=int(document["budgetBytes"]),
        resident_bytes=int(document["residentBytes"]),
        sizes=sizes,
        pinned=frozenset(n for n, m in models.items() if m.get("pinned")),
        load_seconds={n: float(m.get("loadSeconds", 0.0)) for n, m in models.items()},
        pending={str(n): max(int(b), 0) for n, b in pending.items()},
        load_slots=max(int(document.get("maxConcurrentLoads", 1)), 1),
        load_queue=max(int(document.get("loadQueue", 0)), 0),
        concurrency={n: max(int(m.get("concurrency", 0)), 0) for n, m in models.items()},
    )


@dataclass(frozen=True, slots=True)
class OwnLoads:
    """Loads the gateway asked one replica for, not answered yet: model -> expected bytes."""

    expected: Mapping[str, int] = field(default_factory=dict)

    def reserve(self, model: str, nbytes: int) -> OwnLoads:
        """On dispatch of ``POST .../load``: its bytes count until the answer."""
        return OwnLoads({**self.expected, model: max(nbytes, 0)})

    def release(self, model: str) -> OwnLoads:
        """On the answer (loaded, refused, failed or no answer)."""
        return OwnLoads({m: b for m, b in self.expected.items() if m != model})

    @property
    def models(self) -> frozenset[str]:
        return frozenset(self.expected)

    def __contains__(self, model: object) -> bool:
        return model in self.expected

    def __bool__(self) -> bool:
        return bool(self.expected)


NO_LOADS = OwnLoads()


def free_bytes(snapshot: Snapshot, own: OwnLoads = NO_LOADS) -> int:
    """The budget less what will be resident once every load under way there ends.

    An own load the runtime already reports (loading or ready) is counted once, by the runtime.
    """
    unreported = sum(
        b
        for m, b in own.expected.items()
        if m not in snapshot.loading and m not in snapshot.hot and m not in snapshot.pending
    )
    pending = sum(snapshot.pending.values())
    return max(snapshot.budget_bytes - snapshot.resident_bytes - pending - unreported, 0)


def replica_view(
    name: str,
    snapshot: Snapshot,
    *,
    healthy: bool,
    outstanding: int = 0,
    own: OwnLoads = NO_LOADS,
    refused: frozenset[str] = frozenset(),
    slots_per_concurrency: float = 0.0,
) -> ReplicaView:
    """The routing core's view of one replica: its last snapshot and the gateway's own state.

    ``slots_per_concurrency``: the burst buffer's bound on requests in flight to the replica,
    in multiples of what its hot models execute at once (:func:`request_slots`); 0: none."""
    own_models = own.models
    loading = snapshot.loading | own_models if own_models else snapshot.loading
    # Background loads of pinned models run on a load slot of their own: not counted.
    on_demand = (snapshot.loading - snapshot.pinned) | own_models
    budget = snapshot.budget_bytes
    return ReplicaView(
        name=name,
        healthy=healthy,
        models=snapshot.models,
        hot=snapshot.hot,
        loading=loading,
        outstanding=outstanding,
        free_bytes=free_bytes(snapshot, own),
        budget_bytes=budget,
        loads_in_flight=len(on_demand),
        refused=refused,
        room_bytes=max(budget - snapshot.pinned_bytes, 0) if budget else None,
        load_slots=snapshot.load_slots,
        request_slots=request_slots(snapshot, slots_per_concurrency),
    )


def request_slots(snapshot: Snapshot, per_concurrency: float) -> int:
    """How many requests the gateway keeps in flight to one replica before it holds the next
    (0: no bound): ``per_concurrency`` x the largest concurrency of its hot models, at least 1.

    With 2 (the operator's setting), each execution slot has one full batch running and one
    forming behind it: the replica never idles between batches, and nothing more waits in its
    queue, where only that replica could ever serve it (issue 40's stranded herd).
    """
    if per_concurrency <= 0:
        return 0
    known = [snapshot.concurrency.get(m, 0) for m in snapshot.hot]
    largest = max(known, default=0)
    if largest <= 0:
        return 0  # an older runtime, or nothing hot: unbounded, as before
    return max(1, math.ceil(per_concurrency * largest))


def model_bytes(snapshots: Iterable[Snapshot], model: str) -> int:
    """The model's last measured size on any replica (0: nobody has measured it)."""
    return max((s.sizes.get(model, 0) for s in snapshots), default=0)


def with_hot(snapshot: Snapshot, model: str) -> Snapshot:
    """A load answered 200: the model is routable there before the long-poll confirms it (its
    bytes stay counted as the last snapshot counted them until the next one)."""
    return replace(snapshot, hot=snapshot.hot | {model})


def without_model(snapshot: Snapshot, model: str) -> Snapshot:
    """A load answered 404: the replica's configuration lacks the model after all."""
    return replace(snapshot, models=snapshot.models - {model})
