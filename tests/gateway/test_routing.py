"""The gateway's routing core: tables for each reason, hypothesis properties for the invariants."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.gateway.core.routing import (
    REASONS,
    LoadBudget,
    ReplicaView,
    Route,
    choose_route,
)

ALL = frozenset({"m", "other"})


def replica(
    name: str,
    hot: str = "",
    loading: str = "",
    outstanding: int = 0,
    free: int = 100,
    loads: int | None = None,
    healthy: bool = True,
    refused: str = "",
    models: frozenset[str] = ALL,
) -> ReplicaView:
    hot_set = frozenset(hot.split()) if hot else frozenset()
    loading_set = frozenset(loading.split()) if loading else frozenset()
    return ReplicaView(
        name=name,
        healthy=healthy,
        models=models,
        hot=hot_set,
        loading=loading_set,
        outstanding=outstanding,
        free_bytes=free,
        budget_bytes=1000,
        loads_in_flight=len(loading_set) if loads is None else loads,
        refused=frozenset(refused.split()) if refused else frozenset(),
    )


LIMITS = LoadBudget(per_replica=1, total=2)

CASES: list[tuple[str, list[ReplicaView], dict[str, tuple[str, ...]], Route]] = [
    (
        "least outstanding among the hot copies",
        [replica("a", "m", outstanding=3), replica("b", "m", outstanding=1), replica("c")],
        {},
        Route("forward", "hot:least-outstanding", "b"),
    ),
    (
        "ties: the placement's order, then the name",
        [replica("a", "m"), replica("b", "m"), replica("c", "m")],
        {"m": ("c", "b")},
        Route("forward", "hot:least-outstanding", "c"),
    ),
    (
        "ties without placement: by name",
        [replica("b", "m"), replica("a", "m")],
        {},
        Route("forward", "hot:least-outstanding", "a"),
    ),
    (
        "an unhealthy hot copy is never used",
        [replica("a", "m", healthy=False), replica("b", "m", outstanding=50)],
        {},
        Route("forward", "hot:least-outstanding", "b"),
    ),
    (
        "every hot copy busy, none loading: one more copy where most is free",
        [replica("a", "m", outstanding=9), replica("b", free=10), replica("c", free=500)],
        {},
        Route("forward", "busy:extra-copy", "a", extra_load="c"),
    ),
    (
        "busy, but a copy is already loading: no second extra copy",
        [replica("a", "m", outstanding=9), replica("b", loading="m")],
        {},
        Route("forward", "hot:least-outstanding", "a"),
    ),
    (
        "busy, but the fleet is at its load limit: just forward",
        [replica("a", "m", outstanding=9), replica("b", loading="x y")],
        {},
        Route("forward", "hot:least-outstanding", "a"),
    ),
    (
        "cold, one copy loading: wait for it",
        [replica("a", loading="m", outstanding=2), replica("b")],
        {},
        Route("wait", "cold:wait-loading", "a"),
    ),
    (
        "cold: load where the placement says",
        [replica("a", free=900), replica("b", free=1)],
        {"m": ("b",)},
        Route("load", "cold:load-placed", "b"),
    ),
    (
        "cold: the placement's replica is at its load limit, so most free",
        [replica("a", free=900), replica("b", free=1, loading="x"), replica("c", free=50)],
        {"m": ("b",)},
        Route("load", "cold:load-most-free", "a"),
    ),
    (
        "cold: a replica that refused it lately is skipped",
        [replica("a", free=900, refused="m"), replica("b", free=1)],
        {},
        Route("load", "cold:load-most-free", "b"),
    ),
    (
        "cold: every replica refused it",
        [replica("a", refused="m"), replica("b", refused="m")],
        {},
        Route("reject", "unavailable:no-room", status=503),
    ),
    (
        "cold: every replica at its per-replica limit",
        [
            replica("a", loading="x"),
            replica("b", loading="y", healthy=False),
            replica("c", loading="z"),
        ],
        {},
        Route("reject", "unavailable:load-limit", status=503),
    ),
    (
        "cold: the fleet-wide limit",
        [replica("a", loading="x"), replica("b", loading="y"), replica("c")],
        {},
        Route("reject", "unavailable:load-limit", status=503),
    ),
    (
        "no healthy replica",
        [replica("a", "m", healthy=False)],
        {},
        Route("reject", "unavailable:no-replica", status=503),
    ),
    (
        "no replica known yet: not 'unknown', unavailable",
        [],
        {},
        Route("reject", "unavailable:no-replica", status=503),
    ),
    (
        "a model no replica serves",
        [replica("a", models=frozenset({"other"}))],
        {},
        Route("reject", "unknown:model", status=404),
    ),
    (
        "served only by an unhealthy replica: unavailable, not unknown",
        [replica("a", healthy=False), replica("b", models=frozenset({"other"}))],
        {},
        Route("reject", "unavailable:no-replica", status=503),
    ),
]


@pytest.mark.parametrize(
    ("case", "replicas", "placement", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_choose_route_table(
    case: str,
    replicas: list[ReplicaView],
    placement: dict[str, tuple[str, ...]],
    expected: Route,
) -> None:
    assert choose_route("m", replicas, LIMITS, placement, busy_outstanding=8) == expected


def test_configured_models_bound_what_is_known() -> None:
    replicas = [replica("a", "m")]
    assert choose_route("m", replicas, LIMITS, known_models=frozenset({"other"})).status == 404
    assert choose_route("m", replicas, LIMITS, known_models=frozenset({"m"})).replica == "a"
    # Configured but not served (yet) by any replica: unavailable, not unknown.
    route = choose_route("x", replicas, LIMITS, known_models=frozenset({"x"}))
    assert (route.reason, route.status) == ("unavailable:no-replica", 503)


def test_a_new_copy_goes_first_where_it_fits_without_evictions() -> None:
    replicas = [replica("a", free=90), replica("b", free=120)]
    assert choose_route("m", replicas, LIMITS, model_bytes=100).replica == "b"
    replicas = [replica("a", free=90), replica("b", free=80)]
    assert choose_route("m", replicas, LIMITS, model_bytes=100).replica == "a"  # most free


def test_every_reason_is_in_the_vocabulary() -> None:
    assert {route.reason for _, _, _, route in CASES} <= set(REASONS)
    assert len(REASONS) == len(set(REASONS))


# -- properties -----------------------------------------------------------------------------

MODELS = ["m", "x", "y"]
model_sets = st.frozensets(st.sampled_from(MODELS))
views = st.builds(
    ReplicaView,
    name=st.sampled_from("abcdef"),
    healthy=st.booleans(),
    models=model_sets,
    hot=model_sets,
    loading=model_sets,
    outstanding=st.integers(0, 20),
    free_bytes=st.integers(0, 1000),
    budget_bytes=st.just(1000),
    loads_in_flight=st.integers(0, 3),
    refused=model_sets,
    load_slots=st.integers(1, 3),
)
fleets = st.lists(views, max_size=6, unique_by=lambda v: v.name).map(
    # A model is hot or loading only where the replica serves it.
    lambda vs: [
        dataclasses.replace(v, hot=v.hot & v.models, loading=(v.loading - v.hot) & v.models)
        for v in vs
    ]
)
limits = st.builds(LoadBudget, per_replica=st.integers(1, 3), total=st.integers(1, 6))
placements = st.dictionaries(
    st.sampled_from(MODELS), st.lists(st.sampled_from("abcdefz"), max_size=3).map(tuple)
)


@dataclasses.dataclass(frozen=True)
class Situation:
    replicas: list[ReplicaView]
    loads: LoadBudget
    placement: dict[str, tuple[str, ...]]
    model: str
    busy: int

    def route(self, replicas: list[ReplicaView] | None = None) -> Route:
        return choose_route(
            self.model,
            self.replicas if replicas is None else replicas,
            self.loads,
            self.placement,
            busy_outstanding=self.busy,
        )


situations = st.builds(
    Situation, fleets, limits, placements, st.sampled_from(MODELS), st.integers(0, 10)
)


@given(situations)
def test_a_healthy_hot_copy_is_always_chosen_when_one_exists(s: Situation) -> None:
    route = s.route()
    hot = [r for r in s.replicas if r.healthy and s.model in r.hot]
    if hot:
        assert route.action == "forward"
        chosen = next(r for r in s.replicas if r.name == route.replica)
        assert chosen in hot
        assert chosen.outstanding == min(r.outstanding for r in hot)
    else:
        assert route.action != "forward"


@given(situations)
def test_no_load_is_ever_started_beyond_the_limits(s: Situation) -> None:
    route = s.route()
    target = route.replica if route.action == "load" else route.extra_load
    if target is None:
        return
    chosen = next(r for r in s.replicas if r.name == target)
    assert chosen.healthy and s.model in chosen.models
    assert s.model not in chosen.hot and s.model not in chosen.refused
    assert chosen.loads_in_flight < s.loads.per_replica
    assert sum(r.loads_in_flight for r in s.replicas) < s.loads.total
    assert not any(s.model in r.loading for r in s.replicas if r.healthy)


@given(situations, st.randoms())
def test_routes_are_deterministic_whatever_the_order_of_replicas(s: Situation, rng: Any) -> None:
    route = s.route()
    shuffled = list(s.replicas)
    rng.shuffle(shuffled)
    assert s.route(shuffled) == route
    assert route.reason in REASONS
    if route.replica is not None:
        assert any(r.name == route.replica and r.healthy for r in s.replicas)


def test_a_cold_load_goes_where_unpinned_engines_can_make_room() -> None:
    # r0 has little free but its residents are unpinned (room 600); r1 more free, all pinned.
    r0 = dataclasses.replace(replica("r0", free=100), room_bytes=600)
    r1 = dataclasses.replace(replica("r1", free=300), room_bytes=300)
    route = choose_route("m", [r0, r1], LIMITS, model_bytes=500)
    assert (route.action, route.replica, route.reason) == ("load", "r0", "cold:load-most-free")
    # Where it fits either way, most free bytes still wins (no eviction at all).
    route = choose_route("m", [r0, r1], LIMITS, model_bytes=50)
    assert route.replica == "r1"
    # Unknown room (an older runtime): as before, by free bytes.
    unknown = [dataclasses.replace(r, room_bytes=None) for r in (r0, r1)]
    assert choose_route("m", unknown, LIMITS, model_bytes=500).replica == "r1"


def test_the_replica_view_leaves_background_pin_loads_out_of_the_load_limit() -> None:
    from tidal.gateway.core.views import Snapshot
    from tidal.gateway.replicas import Replica

    r = Replica(name="r0", url="http://r0", pool=None)  # type: ignore[arg-type]
    r.snapshot = Snapshot(
        budget_bytes=1000,
        resident_bytes=800,
        loading=frozenset({"pinned-one", "cold-one"}),
        pinned=frozenset({"pinned-one", "resident"}),
        sizes={"pinned-one": 300, "resident": 400, "cold-one": 100},
    )
    view = r.view()
    assert view.loading == {"pinned-one", "cold-one"}
    assert view.loads_in_flight == 1  # only the on-demand load counts
    assert view.room_bytes == 1000 - 300 - 400
    assert view.free_bytes == 200


@given(situations, st.integers(0, 1200))
def test_a_load_beyond_the_limits_only_into_free_bytes(s: Situation, size: int) -> None:
    """Issue 23, third pass: the limits bound loads that evict; a load of a known size that
    fits in a replica's free bytes evicts nothing and may go beyond them — and only such a
    load does."""
    route = choose_route(s.model, s.replicas, s.loads, s.placement, model_bytes=size)
    target = route.replica if route.action == "load" else route.extra_load
    if target is None:
        return
    chosen = next(r for r in s.replicas if r.name == target)
    assert chosen.healthy and s.model in chosen.models and s.model not in chosen.refused
    beyond = chosen.loads_in_flight >= s.loads.per_replica or (
        sum(r.loads_in_flight for r in s.replicas) >= s.loads.total
    )
    if beyond:
        assert 0 < size <= chosen.free_bytes, (route, chosen, s.loads)
        # ... and never beyond the replica's own load slots (issue 30).
        assert chosen.loads_in_flight < max(chosen.load_slots, s.loads.per_replica)
    strict = dataclasses.replace(s.loads, beyond_into_free=False)
    route = choose_route(s.model, s.replicas, strict, s.placement, model_bytes=size)
    target = route.replica if route.action == "load" else route.extra_load
    if target is not None:
        chosen = next(r for r in s.replicas if r.name == target)
        assert chosen.loads_in_flight < strict.per_replica, (route, chosen)
        assert sum(r.loads_in_flight for r in s.replicas) < strict.total


def test_a_load_that_fits_in_free_bytes_goes_beyond_the_load_limits() -> None:
    # Both replicas run a load (per-replica limit 1, fleet-wide 2 reached): a 300-byte model
    # fits in b's 400 free bytes without evicting anything and b has a second load slot, so it
    # loads there at once; a
    # 500-byte one would evict and waits for the limits.
    a = replica("a", loading="x", free=100)
    b = dataclasses.replace(replica("b", loading="y", free=400), load_slots=2)
    route = choose_route("m", [a, b], LIMITS, model_bytes=300)
    assert (route.action, route.replica, route.reason) == ("load", "b", "cold:load-most-free")
    route = choose_route("m", [a, b], LIMITS, model_bytes=500)
    assert route == Route("reject", "unavailable:load-limit", status=503)
    # Unknown size (0): never beyond the limits.
    assert choose_route("m", [a, b], LIMITS).reason == "unavailable:load-limit"
    strict = dataclasses.replace(LIMITS, beyond_into_free=False)
    assert choose_route("m", [a, b], strict, model_bytes=300).reason == "unavailable:load-limit"


def test_loads_into_free_bytes_stop_at_the_replicas_load_slots() -> None:
    """Issue 30: however many bytes are free, a replica running as many on-demand loads as it
    has load slots (maxConcurrentLoads) gets no more; the next load would only queue there."""
    a = dataclasses.replace(replica("a", loading="x y", free=10_000), load_slots=2)
    b = dataclasses.replace(replica("b", loading="z", free=300), load_slots=2)
    route = choose_route("m", [a, b], LIMITS, model_bytes=200)
    assert (route.action, route.replica) == ("load", "b"), route
    full_b = dataclasses.replace(b, loading=frozenset({"z", "w"}), loads_in_flight=2)
    route = choose_route("m", [a, full_b], LIMITS, model_bytes=200)
    assert route == Route("reject", "unavailable:load-limit", status=503)


# -- the burst buffer: request slots per replica (issue 40) -----------------------------------


def _hot(name: str, outstanding: int, slots: int) -> ReplicaView:
    return ReplicaView(
        name,
        True,
        frozenset({"m"}),
        frozenset({"m"}),
        outstanding=outstanding,
        request_slots=slots,
    )


def test_a_request_waits_when_every_hot_copy_has_its_slots_in_flight() -> None:
    full = [_hot("a", 4, 4), _hot("b", 5, 4)]
    assert choose_route("m", full, LoadBudget()) == Route("wait", "busy:wait-slot")
    # A call that cannot be held (metadata) goes to the least busy copy all the same.
    assert choose_route("m", full, LoadBudget(), wait_for_slot=False).replica == "a"


def test_a_free_slot_anywhere_takes_the_request_even_if_busier() -> None:
    replicas = [_hot("a", 4, 4), _hot("b", 7, 8)]
    assert choose_route("m", replicas, LoadBudget()) == Route(
        "forward", "hot:least-outstanding", "b"
    )


def test_no_slots_means_no_bound() -> None:
    assert choose_route("m", [_hot("a", 1000, 0)], LoadBudget()).replica == "a"


def test_request_slots_follow_the_runtime_concurrency_of_hot_models() -> None:
    from tidal.gateway.core.views import Snapshot, request_slots

    snapshot = Snapshot(hot=frozenset({"m", "n"}), concurrency={"m": 2, "n": 8, "cold": 64})
    assert request_slots(snapshot, 2.0) == 16
    assert request_slots(snapshot, 0.0) == 0  # the buffer off
    assert request_slots(Snapshot(hot=frozenset({"m"})), 2.0) == 0  # an older runtime: unknown


def _busy_fleet(n: int, loading: int, slots: int = 2) -> list[ReplicaView]:
    """`n` replicas with full caches (a load evicts), the first `loading` each with one
    evicting load under way."""
    return [
        dataclasses.replace(
            replica(f"r{i:02d}", free=0, loads=1 if i < loading else 0), load_slots=slots
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("budget", "replicas", "loading", "limit", "reason"),
    [
        # Issue 45: 12 replicas, 4 evicting loads under way. A fixed 4 holds the request; the
        # default sizes the limit from the fleet (one per replica) and loads on a free one.
        (LoadBudget(per_replica=1, total=4), 12, 4, 4, "unavailable:load-limit"),
        (LoadBudget(per_replica=1), 12, 4, 12, "cold:load-most-free"),
        (LoadBudget(per_replica=1), 12, 11, 12, "cold:load-most-free"),
        (LoadBudget(per_replica=1), 12, 12, 12, "unavailable:load-limit"),
        # ... never above the replicas' own load slots.
        (LoadBudget(per_replica=4), 3, 0, 6, "cold:load-most-free"),
        # ... and a small fleet gets a small limit.
        (LoadBudget(per_replica=1), 1, 1, 1, "unavailable:load-limit"),
    ],
)
def test_fleet_wide_load_limit_grows_with_the_fleet(
    budget: LoadBudget, replicas: int, loading: int, limit: int, reason: str
) -> None:
    fleet = _busy_fleet(replicas, loading)
    assert budget.fleet_limit(fleet) == limit, (budget, [r.load_slots for r in fleet])
    route = choose_route("m", fleet, budget, model_bytes=50)
    assert route.reason == reason, (route, budget, limit)
    if route.action == "load":
        assert route.replica is not None and int(route.replica[1:]) >= loading, route
