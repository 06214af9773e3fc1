"""Cache admission and eviction policies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.runtime.core.cache import (
    CacheEntry,
    CostAwarePolicy,
    LFUPolicy,
    LRUPolicy,
    make_policy,
    plan_admission,
)


def entry(
    name: str, size: int, last_used: float, uses: int = 0, in_use: bool = False
) -> CacheEntry:
    return CacheEntry(name, size, last_used, loaded_at=0.0, uses=uses, in_use=in_use)


RESIDENT = [entry("a", 40, 1.0, uses=9), entry("b", 40, 3.0, uses=1), entry("c", 20, 2.0, uses=5)]


@pytest.mark.parametrize(
    ("incoming", "policy", "admit", "evict", "reason"),
    [
        (0, LRUPolicy(), True, (), "fits"),
        (30, LRUPolicy(), True, ("a",), "evict:lru"),
        (50, LRUPolicy(), True, ("a", "c"), "evict:lru"),
        (30, LFUPolicy(), True, ("b",), "evict:lfu"),
        (101, LRUPolicy(), False, (), "too-large"),
    ],
)
def test_plan_admission_table(
    incoming: int, policy: LRUPolicy | LFUPolicy, admit: bool, evict: tuple[str, ...], reason: str
) -> None:
    plan = plan_admission(RESIDENT, incoming, budget_bytes=100, policy=policy, now=10.0)
    assert (plan.admit, plan.evict) == (admit, evict)
    assert plan.reason.startswith(reason)


def test_engines_in_use_are_never_evicted() -> None:
    resident = [entry("a", 60, 1.0, in_use=True), entry("b", 30, 2.0)]
    plan = plan_admission(resident, 50, budget_bytes=100, policy=LRUPolicy(), now=5.0)
    assert not plan.admit
    assert plan.reason.startswith("blocked") and "'a'" in plan.reason


def test_pinned_engines_are_never_evicted_and_the_refusal_names_them() -> None:
    resident = [
        CacheEntry("pinned", 60, last_used=1.0, loaded_at=0.0, pinned=True),
        CacheEntry("idle", 30, last_used=2.0, loaded_at=0.0),
    ]
    plan = plan_admission(resident, 30, budget_bytes=100, policy=LRUPolicy(), now=5.0)
    assert (plan.admit, plan.evict) == (True, ("idle",))
    plan = plan_admission(resident, 50, budget_bytes=100, policy=LRUPolicy(), now=5.0)
    assert not plan.admit
    assert plan.reason.startswith("blocked") and "pinned: ['pinned']" in plan.reason


def test_cost_aware_policy_keeps_engines_that_are_slow_to_reload() -> None:
    slow = CacheEntry("slow", 100, last_used=1.0, loaded_at=0, uses=1, load_seconds=30.0)
    quick = CacheEntry("quick", 100, last_used=2.0, loaded_at=0, uses=1, load_seconds=0.1)
    assert [e.name for e in CostAwarePolicy().order([slow, quick], now=3.0)] == ["quick", "slow"]


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="lru"):
        make_policy("random")


entries = st.lists(
    st.builds(
        CacheEntry,
        name=st.text("abcdefgh", min_size=1, max_size=3),
        size_bytes=st.integers(0, 100),
        last_used=st.floats(0, 100),
        loaded_at=st.just(0.0),
        uses=st.integers(0, 10),
        in_use=st.booleans(),
        pinned=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda e: e.name,
)


@given(entries, st.integers(0, 300), st.sampled_from(["lru", "lfu", "cost"]))
def test_an_admitted_engine_fits_and_only_idle_engines_go(
    resident: list[CacheEntry], incoming: int, policy_name: str
) -> None:
    budget = max(300, sum(e.size_bytes for e in resident))
    plan = plan_admission(resident, incoming, budget, make_policy(policy_name), now=100.0)
    by_name = {e.name: e for e in resident}
    assert all(not by_name[name].in_use and not by_name[name].pinned for name in plan.evict)
    if plan.admit:
        kept = sum(e.size_bytes for e in resident if e.name not in plan.evict)
        assert kept + incoming <= budget


@given(entries, st.integers(1, 200))
def test_lru_evicts_in_order_of_last_use(resident: list[CacheEntry], incoming: int) -> None:
    plan = plan_admission(
        resident, incoming, 200 + sum(e.size_bytes for e in resident) // 2, LRUPolicy(), now=100.0
    )
    idle = sorted((e for e in resident if e.evictable), key=lambda e: (e.last_used, e.name))
    assert list(plan.evict) == [e.name for e in idle[: len(plan.evict)]]


@pytest.mark.parametrize(
    ("resident", "incoming", "waiting_on"),
    [
        # Issue 45: room exists once the in-use engine's requests end: say which.
        ([entry("busy", 60, 1.0, in_use=True)], 80, ("busy",)),
        (
            [entry("a", 30, 1.0, in_use=True), entry("b", 30, 1.0, in_use=True)],
            90,
            ("a", "b"),
        ),
        # Pinned bytes hold the room: no end of a request frees it.
        ([CacheEntry("pin", 60, 1.0, loaded_at=0.0, pinned=True)], 80, ()),
        (
            [
                CacheEntry("pin", 50, 1.0, loaded_at=0.0, pinned=True),
                entry("busy", 30, 1.0, in_use=True),
            ],
            80,
            (),
        ),
    ],
)
def test_a_refused_admission_names_the_requests_that_hold_the_room(
    resident: list[CacheEntry], incoming: int, waiting_on: tuple[str, ...]
) -> None:
    plan = plan_admission(resident, incoming, 100, LRUPolicy(), now=5.0)
    assert not plan.admit and plan.waiting_on == waiting_on, plan
