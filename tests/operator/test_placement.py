"""place: behaviour tables and properties (budgets, monotone copies, no churn)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.fleet import smooth_rates
from tidal.operator.core.placement import (
    REASON_COLD_BELOW_MIN,
    REASON_COLD_NO_REPLICAS,
    REASON_COLD_NO_ROOM,
    REASON_COLD_OVER_PIN_BUDGET,
    REASON_COLD_SIZE_UNKNOWN,
    REASON_COLD_STICKY,
    REASON_TOO_LARGE,
    ModelDemand,
    Placement,
    PlacementPolicy,
    PlacementSummary,
    ReplicaSlot,
    place,
    placement_summary,
)

GB = 10**9
POLICY = PlacementPolicy()  # 50 req/s per copy, min 0.1 req/s, 20 % headroom


def model(name: str, rate: float = 0.0, size_gb: float = 1.0, forecast: float = 0.0) -> ModelDemand:
    return ModelDemand(
        name=name,
        size_bytes=int(size_gb * GB),
        load_seconds=2.0 * size_gb,
        rate=rate,
        forecast_rate=forecast,
    )


def replica(
    name: str, budget_gb: float = 10.0, resident: Sequence[str] = (), pinned: Sequence[str] = ()
) -> ReplicaSlot:
    return ReplicaSlot(
        name=name,
        budget_bytes=int(budget_gb * GB),
        resident=frozenset(resident),
        pinned=frozenset(pinned),
    )


def replicas(count: int, budget_gb: float = 10.0) -> list[ReplicaSlot]:
    return [replica(f"r{k}", budget_gb) for k in range(count)]


def follow(placement: Placement, slots: Sequence[ReplicaSlot]) -> list[ReplicaSlot]:
    """The replicas once the runtimes have applied `placement` (pins loaded, now resident)."""
    return [
        replace(
            s,
            pinned=placement.pinned[s.name],
            resident=s.resident | placement.pinned[s.name],
            landing=s.name in placement.landing,
        )
        for s in slots
    ]


def same_placement(a: Placement, b: Placement) -> bool:
    return a.assignments == b.assignments and a.pinned == b.pinned and a.cold == b.cold


# ------------------------------------------------------------------------------------------
# Tables


def test_hot_model_on_several_replicas_rare_on_one_rest_cold() -> None:
    models = [
        model("hot", rate=180.0),
        model("warm", rate=12.0),
        model("rare", rate=0.5),
        model("idle", rate=0.01),
        model("never"),
    ]
    p = place(POLICY, models, replicas(4), now=100.0)
    assert p.copies("hot") == 4  # ceil(180 / 50)
    assert p.reasons["hot"] == "copies=4:rate"
    assert p.copies("warm") == 2  # one copy's worth, but hot enough for a spare
    assert p.reasons["warm"] == "copies=2:available"
    assert p.copies("rare") == 1
    assert p.reasons["rare"] == "copies=1:rate"
    assert p.cold == ("idle", "never")
    assert p.reasons["idle"] == REASON_COLD_BELOW_MIN
    assert p.assignments["idle"] == ()
    assert set(p.pinned) == {"r0", "r1", "r2", "r3"}
    assert p.at == 100.0
    assert placement_summary(p, models) == PlacementSummary(
        hot_models=3, total_models=5, copies=7, cold_models=2, too_large_models=0
    )


def test_model_too_large_for_every_budget_names_the_gap() -> None:
    models = [model("huge", rate=100.0, size_gb=15), model("big", rate=5.0, size_gb=11)]
    absolute = replace(POLICY, hot_share=0.0)  # "big" is not hot (5 < hot_rate)
    p = place(absolute, models, [replica("a", 10), replica("b", 12)], now=0.0)
    assert p.too_large == {"huge": 3 * GB}
    assert p.reasons["huge"] == REASON_TOO_LARGE
    # 11 GB fits b's budget but not its pinnable 80 %: cold, served on demand, not Degraded.
    assert p.reasons["big"] == REASON_COLD_OVER_PIN_BUDGET
    assert "big" not in p.too_large
    assert p.cold == ("big", "huge")
    assert placement_summary(p, models).too_large_models == 1


def test_hot_model_larger_than_the_pinnable_share_pins_into_the_headroom() -> None:
    # Issue 23, seed 23: the busiest model is larger than 80 % of every budget. Hot (its share
    # of all demand is above hot_share), it is pinned into the headroom; a colder model of the
    # same size is not.
    models = [
        model("busy", rate=2.5, size_gb=9),
        model("tail", rate=0.2, size_gb=9),
        *(model(f"m{k}", rate=2.0, size_gb=0.5) for k in range(10)),
    ]
    p = place(POLICY, models, replicas(4), now=0.0)
    assert p.copies("busy") >= 1, p.reasons["busy"]
    assert p.reasons["tail"] == REASON_COLD_OVER_PIN_BUDGET
    off = place(replace(POLICY, hot_in_headroom=False), models, replicas(4), now=0.0)
    assert off.reasons["busy"] == REASON_COLD_OVER_PIN_BUDGET


def test_forecast_preloads_before_the_rise() -> None:
    models = [model("morning", rate=1.0, forecast=120.0)]
    p = place(POLICY, models, replicas(4), now=0.0)
    assert p.copies("morning") == 3
    assert p.reasons["morning"] == "copies=3:forecast"


def test_viral_model_gains_copies() -> None:
    slots = replicas(8)
    quiet = [model(f"m{k}", rate=0.5) for k in range(6)] + [model("viral", rate=0.5)]
    before = place(POLICY, quiet, slots, now=0.0)
    assert before.copies("viral") == 1
    slots = follow(before, slots)
    surge = [*quiet[:-1], model("viral", rate=300.0)]
    after = place(POLICY, surge, slots, now=5.0)
    assert after.copies("viral") == 6
    assert after.reasons["viral"] == "copies=6:rate"
    # Only the viral model moves: its five new copies are the whole churn.
    assert sorted(m for _, m in after.loads()) == ["viral"] * 5
    assert all(after.assignments[m.name] == before.assignments[m.name] for m in quiet[:-1])
    assert after.bytes_to_load({"viral": GB}) == 5 * GB


def test_replica_going_away_rehomes_its_pins() -> None:
    slots = replicas(3)  # 8 GB pinnable each
    models = [model(f"m{k}", rate=1.0 + k / 10) for k in range(9)]
    first = place(POLICY, models, slots, now=0.0)
    assert not first.cold
    lost = set(first.pinned["r2"])
    assert lost
    survivors = follow(first, slots)[:2]
    after = place(POLICY, models, survivors, now=10.0)
    assert set(after.pinned) == {"r0", "r1"}
    for name in lost:
        assert after.copies(name) == 1, name
    # Nothing pinned on a surviving replica moves away.
    for s in survivors:
        assert s.pinned <= after.pinned[s.name]
    assert not after.cold


def test_stickiness_keeps_resident_model_under_small_ranking_change() -> None:
    # One replica with room for one 6 GB model (a hot model may pin the whole 10 GB).
    slot = replica("r0", 10, resident=["b"], pinned=["b"])
    small_change = [model("a", rate=11.0, size_gb=6), model("b", rate=10.0, size_gb=6)]
    p = place(POLICY, small_change, [slot], now=0.0)
    assert p.assignments["b"] == ("r0",)
    assert p.reasons["a"] == REASON_COLD_NO_ROOM
    assert p.loads() == []
    # A challenger well beyond the stickiness band takes the place.
    big_change = [model("a", rate=20.0, size_gb=6), model("b", rate=10.0, size_gb=6)]
    p = place(POLICY, big_change, [slot], now=0.0)
    assert p.assignments["a"] == ("r0",)
    assert p.reasons["b"] == REASON_COLD_NO_ROOM
    assert p.loads() == [("r0", "a")]


def test_first_placement_ranks_by_score_without_stickiness() -> None:
    models = [model("a", rate=11.0, size_gb=5), model("b", rate=10.0, size_gb=5)]
    p = place(POLICY, models, [replica("r0", 10, resident=["b"])], now=0.0)
    assert p.assignments["a"] == ("r0",)


def test_copies_have_hysteresis() -> None:
    slots = replicas(6)
    base = place(POLICY, [model("m", rate=100.0)], slots, now=0.0)
    assert base.copies("m") == 2
    slots = follow(base, slots)
    # 12 % more would ask for a third copy from scratch; within the band it stays at 2.
    up = place(POLICY, [model("m", rate=112.0)], slots, now=1.0)
    assert up.copies("m") == 2
    assert up.reasons["m"] == "copies=2:sticky"
    down = place(POLICY, [model("m", rate=90.0)], slots, now=1.0)
    assert down.copies("m") == 2
    # A real change re-sizes.
    assert place(POLICY, [model("m", rate=140.0)], slots, now=1.0).copies("m") == 3
    assert place(POLICY, [model("m", rate=40.0)], slots, now=1.0).copies("m") == 2  # hot spare
    assert place(POLICY, [model("m", rate=5.0)], slots, now=1.0).copies("m") == 1


def test_cold_model_must_clear_the_band_to_be_pinned() -> None:
    slots = [replica("r0", pinned=["other"], resident=["other"]), replica("r1")]
    others = [model("other", rate=1.0)]
    edge = place(POLICY, [*others, model("m", rate=0.105)], slots, now=0.0)
    assert edge.copies("m") == 0
    assert edge.reasons["m"] == REASON_COLD_STICKY
    clear = place(POLICY, [*others, model("m", rate=0.12)], slots, now=0.0)
    assert clear.copies("m") == 1
    # Without any placement yet the plain threshold applies ...
    fresh = place(POLICY, [model("m", rate=0.105)], replicas(2), now=0.0)
    assert fresh.copies("m") == 1
    # ... unless the shell says that the empty pins are an earlier placement's.
    after_empty = place(POLICY, [model("m", rate=0.105)], replicas(2), now=0.0, history=True)
    assert after_empty.copies("m") == 0


def test_copies_capped_by_max_copies_and_replicas() -> None:
    capped = place(replace(POLICY, max_copies=3), [model("m", rate=1000.0)], replicas(8), now=0.0)
    assert capped.copies("m") == 3
    assert capped.reasons["m"] == "copies=3:max"
    few = place(POLICY, [model("m", rate=1000.0)], replicas(2), now=0.0)
    assert few.copies("m") == 2
    assert few.reasons["m"] == "copies=2:max"


def test_hot_spare_needs_two_replicas() -> None:
    assert place(POLICY, [model("m", rate=20.0)], replicas(1), now=0.0).copies("m") == 1
    assert place(POLICY, [model("m", rate=20.0)], replicas(2), now=0.0).copies("m") == 2
    single = replace(POLICY, hot_min_copies=1)
    assert place(single, [model("m", rate=20.0)], replicas(2), now=0.0).copies("m") == 1


def test_prefers_a_replica_where_the_model_is_resident() -> None:
    slots = [replica("r0"), replica("r1"), replica("r2", resident=["m"])]
    p = place(POLICY, [model("m", rate=1.0)], slots, now=0.0)
    assert p.assignments["m"] == ("r2",)
    assert p.loads() == []


def test_spreads_demand_over_replicas() -> None:
    policy = replace(POLICY, hot_min_copies=1)
    models = [model(f"m{rate}", rate=float(rate)) for rate in (40, 30, 20, 10)]
    p = place(policy, models, replicas(2), now=0.0)
    load = {r: sum(m.rate for m in models if m.name in p.pinned[r]) for r in p.pinned}
    assert load == {"r0": 50.0, "r1": 50.0}


def test_headroom_is_left_unpinned() -> None:
    models = [model(f"m{k}", rate=1.0) for k in range(9)]
    p = place(POLICY, models, [replica("r0", 10)], now=0.0)
    assert len(p.pinned["r0"]) == 8  # 8 GB of 10 pinnable
    assert p.cold == ("m8",)  # equal demand: ties go by name
    assert p.reasons["m8"] == REASON_COLD_NO_ROOM


def test_partial_copies_say_no_room() -> None:
    models = [model("m", rate=200.0, size_gb=5)]
    p = place(POLICY, models, [replica("a", 10), replica("b", 10), replica("c", 4)], now=0.0)
    assert p.copies("m") == 2
    assert p.wanted["m"] == 3
    assert p.reasons["m"] == "copies=2/3:no-room"


def test_models_gone_from_the_spec_are_unpinned() -> None:
    slots = [replica("r0", pinned=["gone", "m"], resident=["gone", "m"])]
    p = place(POLICY, [model("m", rate=1.0)], slots, now=0.0)
    assert p.pinned == {"r0": frozenset({"m"})}


def test_no_replicas_leaves_every_model_cold() -> None:
    models = [model("a", rate=100.0), model("b", rate=100.0, size_gb=1000)]
    p = place(POLICY, models, [], now=0.0)
    assert p.cold == ("a", "b")
    assert p.reasons == {"a": REASON_COLD_NO_REPLICAS, "b": REASON_COLD_NO_REPLICAS}
    assert p.too_large == {}
    assert p.pinned == {}


def test_loads_are_pins_not_yet_resident() -> None:
    slots = [replica("r0", resident=["a"]), replica("r1")]
    models = [model("a", rate=20.0), model("b", rate=1.0, size_gb=2)]
    p = place(POLICY, models, slots, now=0.0)
    assert p.assignments["a"][0] in {"r0", "r1"}
    assert set(p.loads()) == {("r1", "a"), (p.assignments["b"][0], "b")}
    assert p.bytes_to_load({"a": GB, "b": 2 * GB}) == 3 * GB


def test_zero_size_models_are_placed() -> None:
    p = place(POLICY, [ModelDemand("m", size_bytes=0, rate=1.0)], [replica("r", 0)], now=0.0)
    assert p.copies("m") == 1


def test_fleet_of_200_models_on_50_replicas() -> None:
    models = [
        model(f"m{k:03d}", rate=1000.0 / (k + 1) ** 1.1, size_gb=1 + k % 7) for k in range(200)
    ]
    slots = replicas(50, budget_gb=40)
    p = place(POLICY, models, slots, now=0.0)
    check_invariants(POLICY, models, slots, p)
    summary = placement_summary(p, models)
    assert summary.total_models == 200
    assert summary.hot_models + summary.cold_models == 200
    assert p.copies("m000") == 20
    assert p.copies("m000") >= p.copies("m001") >= p.copies("m002") >= p.copies("m199")
    again = place(POLICY, models, follow(p, slots), now=1.0)
    assert same_placement(again, p)
    assert again.loads() == []


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate model names: a"):
        place(POLICY, [model("a"), model("a")], replicas(1), now=0.0)
    with pytest.raises(ValueError, match="duplicate replica names: r"):
        place(POLICY, [], [replica("r"), replica("r")], now=0.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate_per_copy": 0.0}, "rate_per_copy must be > 0"),
        ({"max_copies": 0}, "max_copies must be >= 1"),
        ({"min_rate": -1.0}, "min_rate must be >= 0"),
        ({"headroom_fraction": 1.0}, r"headroom_fraction must be in \[0, 1\)"),
        ({"tolerance": 1.0}, r"tolerance must be in \[0, 1\)"),
        ({"stickiness": -0.1}, "stickiness must be >= 0"),
        ({"hot_min_copies": 0}, "hot_min_copies must be >= 1"),
        ({"landing_share": 1.5}, r"landing_share must be in \[0, 1\]"),
    ],
)
def test_policy_is_validated(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlacementPolicy(**fields)  # type: ignore[arg-type]


def test_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="size_bytes"):
        ModelDemand("m", size_bytes=-1)
    with pytest.raises(ValueError, match="rate must be finite"):
        ModelDemand("m", size_bytes=1, rate=math.nan)
    with pytest.raises(ValueError, match="forecast_rate"):
        ModelDemand("m", size_bytes=1, forecast_rate=-1.0)
    with pytest.raises(ValueError, match="budget_bytes"):
        ReplicaSlot("r", budget_bytes=-1)


# ------------------------------------------------------------------------------------------
# Properties


def check_invariants(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    slots: Sequence[ReplicaSlot],
    p: Placement,
) -> None:
    sizes = {m.name: m.size_bytes for m in models}
    scores = {m.name: m.score for m in models}
    threshold = policy.hot_threshold(sum(m.rate for m in models))
    names = set(sizes)
    assert set(p.pinned) == {s.name for s in slots}
    assert set(p.assignments) == set(p.reasons) == set(p.wanted) == names
    for s in slots:
        pinned_bytes = sum(sizes[m] for m in p.pinned[s.name])
        assert pinned_bytes <= s.budget_bytes
        # Only hot models (or ones pinned before: hot status has hysteresis) pin into the
        # headroom: the others keep within the pinnable share.
        colder = sum(
            sizes[m]
            for m in p.pinned[s.name]
            if scores[m] < threshold and not any(m in r.pinned for r in slots)
        )
        assert colder <= s.budget_bytes * (1.0 - policy.headroom_fraction)
        assert p.pinned[s.name] <= names
    limit = len(slots) if policy.max_copies is None else min(policy.max_copies, len(slots))
    for name, where in p.assignments.items():
        assert len(set(where)) == len(where), "a model twice on one replica"
        assert len(where) <= limit
        assert len(where) <= p.wanted[name]
        for r in where:
            assert name in p.pinned[r]
    for r, pinned in p.pinned.items():
        for name in pinned:
            assert r in p.assignments[name]
    assert p.cold == tuple(sorted(n for n in names if not p.assignments[n]))
    largest = max((s.budget_bytes for s in slots), default=0)
    for name, gap in p.too_large.items():
        assert gap == sizes[name] - largest > 0
        assert p.reasons[name] == REASON_TOO_LARGE


rates = st.one_of(
    st.just(0.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=600.0),
)


@st.composite
def fleets(
    draw: st.DrawFn, history: bool = True, max_models: int = 14
) -> tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]]:
    policy = PlacementPolicy(
        rate_per_copy=draw(st.sampled_from([10.0, 50.0, 100.0])),
        max_copies=draw(st.sampled_from([None, 1, 3])),
        min_rate=draw(st.sampled_from([0.0, 0.1, 1.0])),
        headroom_fraction=draw(st.sampled_from([0.0, 0.2, 0.5])),
        hot_rate=draw(st.sampled_from([10.0, 1e9])),
        landing_follows_tail=draw(st.booleans()),
    )
    count = draw(st.integers(min_value=0, max_value=max_models))
    models = [
        ModelDemand(
            name=f"m{k:02d}",
            size_bytes=draw(st.integers(min_value=0, max_value=8)) * GB,
            load_seconds=1.0,
            rate=draw(rates),
            forecast_rate=draw(rates),
        )
        for k in range(count)
    ]
    names = [m.name for m in models]
    subsets = st.frozensets(st.sampled_from(names)) if names else st.just(frozenset[str]())
    slots = [
        ReplicaSlot(
            name=f"r{k}",
            budget_bytes=draw(st.integers(min_value=0, max_value=20)) * GB,
            resident=draw(subsets) if history else frozenset(),
            pinned=draw(subsets) if history else frozenset(),
        )
        for k in range(draw(st.integers(min_value=0, max_value=6)))
    ]
    return policy, models, slots


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_property_budgets_and_consistency(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]],
) -> None:
    policy, models, slots = fleet
    check_invariants(policy, models, slots, place(policy, models, slots, now=0.0))


@settings(max_examples=200, deadline=None)
@given(fleets(history=False))
def test_property_hotter_models_never_get_fewer_copies(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]],
) -> None:
    policy, models, slots = fleet
    p = place(policy, models, slots, now=0.0)
    for a in models:
        for b in models:
            if a.score > b.score:
                assert p.wanted[a.name] >= p.wanted[b.name] or a.name in p.too_large
                if a.size_bytes <= b.size_bytes:
                    assert p.copies(a.name) >= p.copies(b.name), (a, b, p.reasons)


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_property_monotone_outside_the_bands_with_history(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]],
) -> None:
    policy, models, slots = fleet
    p = place(policy, models, slots, now=0.0)
    band = (1 + policy.tolerance) / (1 - policy.tolerance) * (1 + policy.stickiness)
    # The large-model hysteresis (a model pinned now, larger than every pinnable share, keeps
    # the hot cap while anyone asks for it: issue 23) is a band of its own, reaching down to any
    # score above 0: such a model may keep a pin in the headroom a hotter, smaller one cannot
    # use.
    threshold = policy.hot_threshold(sum(m.rate for m in models))
    share = max(
        (math.floor(s.budget_bytes * (1 - policy.headroom_fraction)) for s in slots), default=0
    )
    pinned = {n for s in slots for n in s.pinned}
    held_hot = {
        m.name
        for m in models
        if m.name in pinned and 0 < m.score < threshold and m.size_bytes > share
    }
    for a in models:
        for b in models:
            if b.name in held_hot:
                continue
            if a.score > b.score * band and a.name not in p.too_large:
                assert p.wanted[a.name] >= p.wanted[b.name]
                if a.size_bytes <= b.size_bytes:
                    assert p.copies(a.name) >= p.copies(b.name), (a, b, p.reasons)


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_property_ample_room_grants_every_wanted_copy(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]],
) -> None:
    policy, models, slots = fleet
    total = sum(m.size_bytes for m in models)
    roomy = [
        replace(s, budget_bytes=math.ceil(total / (1 - policy.headroom_fraction)) + 1)
        for s in slots
    ]
    p = place(policy, models, roomy, now=0.0)
    for m in models:
        assert p.copies(m.name) == p.wanted[m.name]


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_property_fed_its_own_output_nothing_moves(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]],
) -> None:
    policy, models, slots = fleet
    first = place(policy, models, slots, now=0.0)
    slots = follow(first, slots)
    second = place(policy, models, slots, now=1.0, history=True)
    assert same_placement(second, first)
    assert second.loads() == []
    third = place(policy, models, follow(second, slots), now=2.0, history=True)
    assert replace(third, at=1.0) == second


@pytest.mark.parametrize("pinned_before", [frozenset(), frozenset({"m04"})])
def test_a_model_short_of_copies_keeps_its_landing_room_when_fed_its_own_output(
    pinned_before: frozenset[str],
) -> None:
    # Found by the property above: two hot models want a copy on both replicas, but only the
    # landing replica r0 has a budget. m04 gets r0's reserve in the first placement (wanted on
    # every replica); fed its own output, the hysteresis band kept m04 at the 1 copy it had,
    # so it no longer counted as wanted everywhere and lost its pin: a load, then an eviction,
    # with nothing changed.
    policy = PlacementPolicy(rate_per_copy=10.0, min_rate=0.0, headroom_fraction=0.0)
    models = [
        ModelDemand("m00", size_bytes=3 * GB, load_seconds=1.0, forecast_rate=10.0),
        ModelDemand("m04", size_bytes=1 * GB, load_seconds=1.0, forecast_rate=10.0),
        *(ModelDemand(f"z{k}", size_bytes=0, load_seconds=1.0) for k in range(3)),
    ]
    slots = [
        ReplicaSlot("r0", budget_bytes=6 * GB),
        ReplicaSlot("r1", budget_bytes=0, pinned=pinned_before),
    ]
    first = place(policy, models, slots, now=0.0)
    assert first.pinned["r0"] >= {"m00", "m04"}
    second = place(policy, models, follow(first, slots), now=1.0, history=True)
    assert second.pinned == first.pinned
    assert second.loads() == []


@settings(max_examples=200, deadline=None)
@given(fleets(history=False), st.data())
def test_property_ten_percent_noise_moves_nothing(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]], data: st.DataObject
) -> None:
    policy, models, slots = fleet
    base = place(policy, models, slots, now=0.0)
    factors = st.floats(min_value=0.9, max_value=1.1)
    noisy = [
        replace(
            m, rate=m.rate * data.draw(factors), forecast_rate=m.forecast_rate * data.draw(factors)
        )
        for m in models
    ]
    after = place(policy, noisy, follow(base, slots), now=1.0, history=True, hot_before=base.hot)
    # Nothing moves (the order of a model's replicas follows their load and may change).
    assert after.pinned == base.pinned, (base.reasons, after.reasons, base.hot, after.hot)
    assert after.loads() == []


@settings(max_examples=100, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_property_deterministic_whatever_the_input_order(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]], rng: object
) -> None:
    import random

    assert isinstance(rng, random.Random)
    policy, models, slots = fleet
    p = place(policy, models, slots, now=0.0)
    assert place(policy, models, slots, now=0.0) == p
    shuffled_models, shuffled_slots = list(models), list(slots)
    rng.shuffle(shuffled_models)
    rng.shuffle(shuffled_slots)
    assert place(policy, shuffled_models, shuffled_slots, now=0.0) == p


# -- landing room: a cold request for the largest model always finds room -----------------------


def _room(placement: Placement, slots: Sequence[ReplicaSlot], sizes: dict[str, int]) -> dict:
    return {r.name: r.budget_bytes - sum(sizes[m] for m in placement.pinned[r.name]) for r in slots}


def test_one_replica_keeps_room_for_the_largest_cold_model() -> None:
    # Six hot 4 GB models fill 8 of every 10 GB; a 6 GB tail model is larger than any headroom.
    hot = [model(f"h{k}", rate=5.0, size_gb=4.0) for k in range(6)]
    big = model("big", rate=0.0, size_gb=6.0)
    slots = replicas(3)
    sizes = {m.name: m.size_bytes for m in [*hot, big]}
    without = place(replace(POLICY, landing_share=0.0), [*hot, big], slots, now=0.0)
    assert max(_room(without, slots, sizes).values()) < big.size_bytes
    placement = place(POLICY, [*hot, big], slots, now=0.0)
    room = _room(placement, slots, sizes)
    assert room["r0"] >= big.size_bytes  # the landing replica: largest budget, then name
    assert sum(placement.copies(m.name) for m in hot) == 5  # one hot model fewer pinned
    assert placement.copies("big") == 0


@pytest.mark.parametrize(
    ("share", "counts"),
    # replicas:  1  2  3  4  5  8  9  16
    [
        (0.25, [0, 1, 1, 1, 2, 2, 3, 4]),
        (0.0, [0, 0, 0, 0, 0, 0, 0, 0]),
        (0.01, [0, 1, 1, 1, 1, 1, 1, 1]),
        (1.0, [0, 2, 3, 4, 5, 8, 9, 16]),
    ],
)
def test_landing_replicas_are_a_share_rounded_up_at_least_one(
    share: float, counts: list[int]
) -> None:
    policy = replace(POLICY, landing_share=share)
    assert [policy.landing_replicas(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == counts


@pytest.mark.parametrize(
    ("tail_share", "follows", "count"),
    [
        (0.0, True, 2),  # never below landing_share's count (a quarter of 8)
        (0.2, True, 2),
        (0.26, True, 3),  # ceil(8 x 0.26)
        (0.5, True, 4),
        (0.95, True, 7),  # all but one: the hot set keeps a replica
        (1.0, True, 7),
        (0.95, False, 2),  # the earlier rule: landing_share alone
    ],
)
def test_landing_replicas_follow_the_tails_share_when_asked(
    tail_share: float, follows: bool, count: int
) -> None:
    policy = replace(POLICY, landing_follows_tail=follows)
    assert policy.landing_replicas(8, tail_share) == count
    assert policy.landing_replicas(1, tail_share) == 0


def test_a_busy_tail_gets_more_landing_replicas_than_a_quarter() -> None:
    # Two hot 2 GB models carry 40 % of the demand, 30 tail models (1 GB, 0.1 req/s each: 3%
    # of the demand each, under the 5 % hot share here) the other 60 %: 60 % of 8 replicas,
    # rounded up, keep landing room (5), where the fixed quarter (the earlier rule) keeps 2.
    hot = [model(f"h{k}", rate=1.0, size_gb=2.0) for k in range(2)]
    tail = [model(f"t{k:02d}", rate=0.1, size_gb=1.0) for k in range(30)]
    slots = replicas(8)
    policy = replace(POLICY, hot_share=0.05, min_rate=0.01)
    fixed = place(replace(policy, landing_follows_tail=False), [*hot, *tail], slots, now=0.0)
    follows = place(policy, [*hot, *tail], slots, now=0.0)
    assert len(fixed.landing) == 2, fixed.landing
    assert len(follows.landing) == 5, follows.landing
    assert fixed.landing <= follows.landing
    # The hot models are pinned either way.
    assert all(follows.copies(h.name) >= 1 for h in hot), follows.reasons


def test_the_landing_count_in_use_holds_within_the_band_and_follows_a_larger_move() -> None:
    # As in test_a_busy_tail_gets_more_landing_replicas_than_a_quarter: tail share 0.6, 5 of 8.
    policy = replace(POLICY, hot_share=0.05, min_rate=0.01)
    hot = [model(f"h{k}", rate=1.0, size_gb=2.0) for k in range(2)]
    slots = replicas(8)

    def tail(rate: float) -> list[ModelDemand]:
        return [model(f"t{k:02d}", rate=rate, size_gb=1.0) for k in range(30)]

    first = place(policy, [*hot, *tail(0.1)], slots, now=0.0)
    assert len(first.landing) == 5, first.landing
    # Tail share 0.66 asks for 6 on a first placement, but lies within the band of 5's.
    busier = [*hot, *tail(0.13)]
    assert len(place(policy, busier, slots, now=0.0).landing) == 6
    held = place(policy, busier, follow(first, slots), now=2.0, history=True, hot_before=first.hot)
    assert len(held.landing) == 5, held.landing
    assert held.pinned == first.pinned
    # The hot models at a fifth of their rate (tail share 0.91): out of the band, one more.
    cooler = [replace(h, rate=0.2) for h in hot] + tail(0.13)
    moved = place(policy, cooler, follow(first, slots), now=2.0, history=True, hot_before=first.hot)
    assert len(moved.landing) == 6, moved.landing
    assert moved.hot == first.hot == {"h0", "h1"}  # still hot: within the band below


def test_hot_status_has_a_band_once_the_previous_hot_set_is_known() -> None:
    # Threshold 0.05 x 10 = 0.5 req/s. x at 0.55 is hot on a first placement, but not for a
    # placement whose previous hot set lacks it (it needs 1.35 x 0.5); y at 0.45 stays hot
    # when it was (down to 0.5 / 1.35).
    policy = replace(POLICY, hot_share=0.05)
    x, y = model("x", rate=0.55), model("y", rate=0.45)
    rest = [model(f"t{k}", rate=0.9, size_gb=0.5) for k in range(10)]
    slots = replicas(4)
    assert "x" in place(policy, [x, y, *rest], slots, now=0.0).hot
    later = place(policy, [x, y, *rest], slots, now=0.0, hot_before=frozenset({"y"}))
    assert "x" not in later.hot
    assert "y" in later.hot
    gone = place(
        policy, [x, replace(y, rate=0.3), *rest], slots, now=0.0, hot_before=frozenset({"y"})
    )
    assert "y" not in gone.hot


def test_a_hot_newcomer_that_must_displace_goes_where_it_displaces_no_hot_model() -> None:
    # Four 4.7 GB replicas (usable 3.76 GB), r0 landing. r1 holds the hot 4.0 GB model alone;
    # r2 and r3 a hot 1.6 GB model and a 2.0 GB tail model each. The hot newcomer (1.3 GB,
    # granted first at 2.0 req/s) fits nowhere without displacing someone. It displaces a tail
    # model (r2), not the 4.0 GB model that fits nowhere else (least load first chose r1: the
    # busiest model of the fleet simulator's seed 23 lost its pin this way, hot P99 360 ms).
    policy = replace(POLICY, hot_share=0.1, landing_follows_tail=False)
    big, s1, s3 = model("big", 1.0, 4.0), model("s1", 1.2, 1.6), model("s3", 1.2, 1.6)
    t1, t3 = model("t1", 0.3, 2.0), model("t3", 0.3, 2.0)
    newcomer = model("n", 2.0, 1.3)
    slots = [
        replica("r0", 4.7),
        replica("r1", 4.7, resident=["big"], pinned=["big"]),
        replica("r2", 4.7, resident=["s1", "t1"], pinned=["s1", "t1"]),
        replica("r3", 4.7, resident=["s3", "t3"], pinned=["s3", "t3"]),
    ]
    p = place(policy, [big, s1, s3, t1, t3, newcomer], slots, now=0.0, history=True)
    assert p.landing == {"r0"}
    assert p.hot == {"big", "s1", "s3", "n"}, p.hot
    assert p.assignments["big"] == ("r1",), p.reasons
    assert p.assignments["n"] == ("r2",), p.reasons
    assert p.assignments["s1"] == ("r2",) and p.assignments["s3"] == ("r3",), p.reasons


def test_a_quarter_of_eight_replicas_keep_landing_room() -> None:
    # Hot 4 GB models would fill 8 of every 10 GB; a 6 GB tail model needs a landing replica.
    hot = [model(f"h{k}", rate=5.0, size_gb=4.0) for k in range(16)]
    big = model("big", rate=0.0, size_gb=6.0)
    slots = replicas(8)
    sizes = {m.name: m.size_bytes for m in [*hot, big]}
    room = _room(place(POLICY, [*hot, big], slots, now=0.0), slots, sizes)
    # The largest budgets, then by name: all budgets are equal, so r0 and r1.
    assert sorted(r for r, free in room.items() if free >= big.size_bytes) == ["r0", "r1"]


def test_no_landing_room_is_kept_when_every_model_is_pinned_everywhere() -> None:
    models = [model("a", rate=200.0, size_gb=3.0)]  # wants a copy on each of 2 replicas
    placement = place(POLICY, models, replicas(2), now=0.0)
    assert placement.copies("a") == 2


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.floats(min_value=0.1, max_value=9.5), min_size=1, max_size=12),
    rates=st.lists(st.floats(min_value=0.0, max_value=200.0), min_size=12, max_size=12),
    count=st.integers(min_value=2, max_value=5),
)
def test_some_replica_can_always_load_the_largest_unpinned_model(
    sizes: list[float], rates: list[float], count: int
) -> None:
    models = [model(f"m{k}", rate=rates[k], size_gb=s) for k, s in enumerate(sizes)]
    slots = replicas(count)
    placement = place(POLICY, models, slots, now=0.0)
    by_name = {m.name: m.size_bytes for m in models}
    usable = 0.8 * 10 * GB
    loadable = [
        m
        for m in models
        if placement.copies(m.name) == 0
        and (placement.wanted[m.name] < count or m.size_bytes > usable)
    ]
    if loadable:
        largest = max(m.size_bytes for m in loadable)
        assert max(_room(placement, slots, by_name).values()) >= largest


# -- lead (c): a model nobody measured may be the largest ------------------------------------


def test_a_model_of_unknown_size_is_pinned_nowhere_and_a_whole_budget_stays_free() -> None:
    # Eight 1 GB models would be pinned on every replica; a never-measured model, guessed at
    # 1 GB, may really be 9 GB: one replica (the first landing one) keeps its whole budget.
    known = [model(f"k{k}", rate=5.0, size_gb=1.0) for k in range(8)]
    guess = replace(model("new", rate=5.0, size_gb=1.0), size_known=False)
    slots = replicas(4)
    placement = place(POLICY, [*known, guess], slots, now=0.0)
    assert placement.copies("new") == 0 and placement.reasons["new"] == REASON_COLD_SIZE_UNKNOWN
    assert placement.pinned["r0"] == frozenset()
    assert all(placement.copies(m.name) == 1 for m in known)
    # Once measured, it is pinned by its rate and r0 keeps only room for the largest model.
    measured = place(POLICY, [*known, model("new", rate=5.0, size_gb=1.0)], slots, now=2.0)
    assert measured.copies("new") == 1 and measured.pinned["r0"]


def test_a_guessed_size_over_every_budget_is_not_reported_too_large() -> None:
    # Before any model is measured the guess is the default size, which can exceed small
    # budgets: the operator reported every model of a fresh fleet as too large (Degraded and
    # a Warning Event, e2e fleet test) until the first measurements came. Only a measured or
    # declared size is a reason to refuse.
    guess = replace(model("new", rate=5.0, size_gb=12.0), size_known=False)
    slots = replicas(2)
    placement = place(POLICY, [guess], slots, now=0.0)
    assert "new" not in placement.too_large, placement.too_large
    assert placement.reasons["new"] == REASON_COLD_SIZE_UNKNOWN, placement.reasons
    measured = place(POLICY, [model("new", rate=5.0, size_gb=12.0)], slots, now=2.0)
    assert measured.too_large == {"new": 2 * GB}, measured.too_large


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.floats(min_value=0.1, max_value=9.5), min_size=2, max_size=12),
    rates=st.lists(st.floats(min_value=0.0, max_value=200.0), min_size=12, max_size=12),
    unknown=st.lists(st.booleans(), min_size=12, max_size=12),
    count=st.integers(min_value=2, max_value=5),
)
def test_property_a_model_of_unknown_size_always_finds_a_whole_budget(
    sizes: list[float], rates: list[float], unknown: list[bool], count: int
) -> None:
    """Whatever its real size (up to a budget), a model nobody has measured can be loaded on
    some replica by evicting only unpinned engines, and it is pinned nowhere until measured."""
    models = [
        replace(model(f"m{k}", rate=rates[k], size_gb=s), size_known=not unknown[k])
        for k, s in enumerate(sizes)
    ]
    slots = replicas(count)
    placement = place(POLICY, models, slots, now=0.0)
    guessed = [m.name for m in models if not m.size_known]
    assert all(placement.copies(name) == 0 for name in guessed)
    if guessed:
        assert any(not pins for pins in placement.pinned.values()), placement.pinned


# -- issue 23: protection of hot models ------------------------------------------------------


def _landing_names(
    policy: PlacementPolicy, slots: Sequence[ReplicaSlot], placement: Placement
) -> set[str]:
    """The landing replicas: the placement's own, which are the first of the fixed order
    (largest budgets, then by name), at least `landing_share` of them."""
    ranked = sorted(slots, key=lambda r: (-r.budget_bytes, r.name))
    count = len(placement.landing)
    assert placement.landing == {r.name for r in ranked[:count]}, placement.landing
    assert policy.landing_replicas(len(slots)) <= count <= max(len(slots) - 1, 0) or (
        count == policy.landing_replicas(len(slots))
    ), (count, len(slots))
    return set(placement.landing)


@settings(max_examples=300, deadline=None)
@given(fleets(), st.sampled_from([0.0, 0.02, 0.2]))
def test_property_a_hot_models_copy_is_never_given_up_for_a_colder_model(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]], hot_share: float
) -> None:
    """A hot model that keeps wanting its copies keeps each one, unless hotter models alone
    fill that replica: a colder model never takes a hot model's place (landing replicas, which
    keep room for the tail by rule, are left out)."""
    policy, models, slots = fleet
    policy = replace(policy, hot_share=hot_share)
    p = place(policy, models, slots, now=0.0, history=True)
    sizes = {m.name: m.size_bytes for m in models}
    scores = {m.name: m.score for m in models}
    threshold = policy.hot_threshold(sum(m.rate for m in models))
    into_headroom = policy.hot_in_headroom and policy.landing_replicas(len(slots)) > 0
    landing = _landing_names(policy, slots, p)
    for h in models:
        if h.score < threshold or h.name in p.too_large or h.score < policy.min_rate:
            continue

        def cap(r: ReplicaSlot) -> int:
            if into_headroom:
                return r.budget_bytes
            return math.floor(r.budget_bytes * (1.0 - policy.headroom_fraction))

        hosts = [r for r in slots if h.name in r.pinned and h.size_bytes <= cap(r)]
        if p.wanted[h.name] < len(hosts):
            continue  # it wants fewer copies: some go by design
        for r in hosts:
            if r.name in landing or h.name in p.pinned[r.name]:
                continue
            hotter = sum(sizes[m] for m in p.pinned[r.name] if m != h.name and scores[m] >= h.score)
            assert hotter + h.size_bytes > cap(r), (h, r, p.pinned[r.name], p.reasons)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=2, max_value=6),
    st.lists(st.integers(min_value=1, max_value=8), min_size=3, max_size=14),
    st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=14, max_size=14),
    st.integers(min_value=0, max_value=13),
)
def test_property_a_viral_rise_gets_a_copy_within_one_interval(
    replica_count: int, sizes_gb: list[int], rates_before: list[float], pick: int
) -> None:
    """A cold model whose rate jumps above every other model's (and the hot threshold) has a
    copy at the very next placement: the smoothing takes a rise to the hot threshold at once,
    so the copy does not wait for the rate window."""
    policy = PlacementPolicy(rate_per_copy=50.0, min_rate=0.1)
    budget = 10 * GB
    slots = [ReplicaSlot(f"r{k}", budget) for k in range(replica_count)]
    names = [f"m{k:02d}" for k in range(len(sizes_gb))]
    viral = names[pick % len(names)]
    before = {n: (0.0 if n == viral else rates_before[k]) for k, n in enumerate(names)}

    def demands(rates: dict[str, float]) -> list[ModelDemand]:
        return [ModelDemand(n, sizes_gb[k] * GB, 1.0, rates[n], 0.0) for k, n in enumerate(names)]

    smoothed = smooth_rates({}, before, 2.0, 60.0)
    first = place(policy, demands(smoothed), slots, now=0.0)
    settled = [
        ReplicaSlot(r.name, r.budget_bytes, first.pinned[r.name], first.pinned[r.name])
        for r in slots
    ]
    # One interval later the viral model is the busiest by a wide margin.
    now_rates = dict(before)
    now_rates[viral] = 2.0 * (1.0 + policy.stickiness) * (1.0 + max(before.values())) + 1.0
    rise_to = policy.hot_threshold(sum(now_rates.values()))
    assert now_rates[viral] >= rise_to
    smoothed = smooth_rates(smoothed, now_rates, 2.0, 60.0, rise_to=rise_to)
    assert smoothed[viral] == now_rates[viral]
    after = place(policy, demands(smoothed), settled, now=2.0, history=True, hot_before=first.hot)
    assert after.copies(viral) >= 1, (after.reasons[viral], after.pinned)


def test_a_viral_model_above_the_threshold_displaces_a_colder_incumbent_at_once() -> None:
    # r0 is the landing replica; r1 and r2 hold two 8 GB incumbents at 1.0 req/s. The viral
    # 8 GB model at 1.1 req/s is hot (threshold 0.35 x 3.1 = 1.085), the incumbents are not:
    # it is granted first, though 1.1 < 1.25 x 1.0 (the incumbents' sticky priority).
    policy = replace(POLICY, hot_share=0.35)
    a, b = model("a", rate=1.0, size_gb=8.0), model("b", rate=1.0, size_gb=8.0)
    viral = model("viral", rate=1.1, size_gb=8.0)
    slots = [
        replica("r0"),
        replica("r1", resident=["a"], pinned=["a"]),
        replica("r2", resident=["b"], pinned=["b"]),
    ]
    placement = place(policy, [a, b, viral], slots, now=0.0, history=True)
    assert placement.copies("viral") == 1, placement.reasons
    without_tiers = place(replace(policy, hot_in_headroom=False), [a, b, viral], slots, now=0.0)
    assert without_tiers.copies("viral") == 0  # the earlier rule: it waited for 1.25x


@settings(max_examples=300, deadline=None)
@given(fleets(), st.sampled_from([0.02, 0.2]))
def test_property_a_hot_model_is_never_left_cold_for_a_colder_incumbent(
    fleet: tuple[PlacementPolicy, list[ModelDemand], list[ReplicaSlot]], hot_share: float
) -> None:
    """A model at or above the hot threshold that wants a copy and gets none: on every replica
    that could hold it (landing replicas aside), hot models alone leave too little room. A
    colder incumbent's stickiness never keeps a viral model out (it would wait until its score
    were 1 + stickiness times the incumbent's)."""
    policy, models, slots = fleet
    policy = replace(policy, hot_share=hot_share)
    p = place(policy, models, slots, now=0.0, history=True)
    if policy.landing_replicas(len(slots)) == 0:
        return
    sizes = {m.name: m.size_bytes for m in models}
    threshold = policy.hot_threshold(sum(m.rate for m in models))
    hot = {m.name for m in models if m.score >= threshold}
    landing = _landing_names(policy, slots, p)
    for h in models:
        if h.name not in hot or p.wanted[h.name] == 0 or p.copies(h.name) > 0:
            continue
        if h.name in p.too_large:
            continue
        for r in slots:
            if r.name in landing or h.size_bytes > r.budget_bytes:
                continue
            hot_bytes = sum(sizes[m] for m in p.pinned[r.name] if m in hot)
            assert hot_bytes + h.size_bytes > r.budget_bytes, (h, r, p.pinned[r.name], p.reasons)
