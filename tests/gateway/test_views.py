"""The gateway's replica views (tidal.gateway.core.views): snapshots, own loads, free bytes."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.gateway.core import views
from tidal.gateway.core.routing import LoadBudget, choose_route
from tidal.gateway.core.views import OwnLoads, Snapshot, free_bytes, parse_snapshot

GB = 10**9


def document(**extra: Any) -> dict[str, Any]:
    models = {
        f"m{k}": {"state": "UNAVAILABLE", "lastSizeBytes": GB, "loadSeconds": 1.0}
        for k in range(20)
    }
    models["hot"] = {"state": "READY", "lastSizeBytes": GB, "pinned": True}
    return {
        "generation": 3,
        "ready": True,
        "budgetBytes": 10 * GB,
        "residentBytes": GB,
        "maxConcurrentLoads": 2,
        "models": models,
        **extra,
    }


def test_a_snapshot_reads_the_runtimes_report() -> None:
    doc = document(pendingLoads={"m1": GB}, loadQueue=1)
    doc["models"]["m1"]["state"] = "LOADING"
    snap = parse_snapshot(doc)
    assert snap.hot == {"hot"} and snap.loading == {"m1"} and snap.pinned == {"hot"}
    assert (snap.budget_bytes, snap.resident_bytes, snap.load_slots, snap.load_queue) == (
        10 * GB,
        GB,
        2,
        1,
    )
    assert snap.pending == {"m1": GB} and snap.pinned_bytes == GB
    # An older runtime reports neither: nothing pending, one load slot.
    old = parse_snapshot({k: v for k, v in document().items() if k != "maxConcurrentLoads"})
    assert old.pending == {} and old.load_slots == 1 and old.load_queue == 0


def test_free_bytes_count_queued_and_own_loads_once() -> None:
    snap = parse_snapshot(document(pendingLoads={"m1": GB}))
    snap = Snapshot(**{**{f: getattr(snap, f) for f in snap.__slots__}, "loading": {"m1"}})
    assert free_bytes(snap) == 10 * GB - GB - GB  # resident, and m1 queued at the runtime
    own = OwnLoads().reserve("m1", GB).reserve("m2", 2 * GB)
    # m1: the runtime reports it already (counted once); m2: not yet, the gateway counts it.
    assert free_bytes(snap, own) == 10 * GB - GB - GB - 2 * GB
    assert free_bytes(snap, own.release("m2")) == 10 * GB - 2 * GB
    assert "m2" in own and "m2" not in own.release("m2") and not OwnLoads()


def test_a_burst_of_cold_requests_spreads_within_the_load_slots() -> None:
    """Issue 30: cold requests for 16 different models at once, as the gateway routes them one
    after another (each reserving its load's bytes on dispatch before any snapshot moves): no
    replica gets more on-demand loads than its load slots, and the loads spread over the
    replicas. Counting only residentBytes sent every one of them to the replica with the most
    free bytes."""
    snaps = {
        "a": parse_snapshot(document(budgetBytes=12 * GB)),
        "b": parse_snapshot(document()),
        "c": parse_snapshot(document()),
        "d": parse_snapshot(document()),
    }
    own = {name: OwnLoads() for name in snaps}
    budget = LoadBudget(per_replica=1, total=4)
    sent: dict[str, list[str]] = {name: [] for name in snaps}
    for k in range(16):
        model = f"m{k}"
        seen = [views.replica_view(n, s, healthy=True, own=own[n]) for n, s in snaps.items()]
        size = views.model_bytes(snaps.values(), model)
        route = choose_route(model, seen, budget, model_bytes=size)
        if route.action == "load":
            assert route.replica is not None
            own[route.replica] = own[route.replica].reserve(model, GB)
            sent[route.replica].append(model)
    assert all(len(models) <= 2 for models in sent.values()), sent
    assert sum(len(m) for m in sent.values()) == 8, sent  # every replica's two slots in use


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b'{"error": "no room", "waitingOn": ["m0", "m1"]}', ("m0", "m1")),
        (b'{"error": "no room"}', ()),  # an older runtime, or pinned bytes
        (b'{"waitingOn": "m0"}', ()),
        (b'{"waitingOn": ["m0", 3]}', ("m0",)),
        (b"not json", ()),
        (b"[]", ()),
    ],
)
def test_a_load_refusal_says_which_requests_hold_the_room(
    body: bytes, names: tuple[str, ...]
) -> None:
    assert views.waiting_on(body) == names, body
