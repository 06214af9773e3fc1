"""Which pods serve, wait as standby, or go first on scale-down."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidal.operator.core.autoscaler_pods import (
    PodView,
    choose_scale_down_victims,
    choose_standby,
    pod_deletion_cost,
)


def test_deletion_cost_orders_pending_not_ready_idle_cold_busy() -> None:
    pending = PodView("pending", ready=False, scheduled=False)
    warming = PodView("warming", ready=False)
    idle_cold = PodView("idle-cold", ready=True, cache_warmth=0.1)
    idle_warm = PodView("idle-warm", ready=True, cache_warmth=0.9)
    busy_cold = PodView("busy-cold", ready=True, in_flight=3, cache_warmth=0.0)
    busy_warm = PodView("busy-warm", ready=True, in_flight=1, cache_warmth=1.0)
    ordered = [pending, warming, idle_cold, idle_warm, busy_cold, busy_warm]
    costs = [pod_deletion_cost(p) for p in ordered]
    assert costs == sorted(costs)
    assert len(set(costs)) == len(costs)
    assert all(-(2**31) <= c < 2**31 for c in costs)  # the annotation is an int32


def test_victims_are_the_cheapest_and_ties_go_to_the_newest() -> None:
    pods = [
        PodView("a", ready=True, in_flight=2, cache_warmth=0.5, ready_for_seconds=900),
        PodView("b", ready=True, ready_for_seconds=900),
        PodView("c", ready=True, ready_for_seconds=30),
        PodView("d", ready=False),
    ]
    names = [p.name for p in choose_scale_down_victims(pods, 3)]
    assert names == ["d", "c", "b"]
    assert choose_scale_down_victims(pods, 0) == []


def test_standby_promoted_when_serving_is_short() -> None:
    pods = [
        PodView("s1", ready=True),
        PodView("s2", ready=True),
        PodView("sb-old", ready=True, standby=True, ready_for_seconds=500),
        PodView("sb-new", ready=True, standby=True, ready_for_seconds=5),
        PodView("warming", ready=False),
    ]
    roles = choose_standby(pods, desired_serving=3, standby=2)
    assert roles.promote == ("sb-old",)
    assert set(roles.serving) == {"s1", "s2", "sb-old"}
    assert roles.standby == ("sb-new",)
    assert roles.reason == "promote-standby"
    assert "warming" not in roles.serving + roles.standby


def test_surplus_serving_pods_are_demoted_cheapest_first() -> None:
    pods = [
        PodView("hot", ready=True, in_flight=4, cache_warmth=0.9),
        PodView("cold", ready=True, cache_warmth=0.0),
        PodView("warmish", ready=True, cache_warmth=0.5),
    ]
    roles = choose_standby(pods, desired_serving=2, standby=1)
    assert set(roles.serving) == {"hot", "warmish"}
    assert roles.demote == ("cold",)
    assert roles.reason == "demote-to-standby"


def test_unchanged_when_roles_fit() -> None:
    pods = [PodView("a", ready=True), PodView("b", ready=True, standby=True)]
    roles = choose_standby(pods, desired_serving=1, standby=1)
    assert (roles.serving, roles.standby, roles.promote, roles.demote) == (("a",), ("b",), (), ())
    assert roles.reason == "unchanged"


pod_lists = st.lists(
    st.builds(
        PodView,
        name=st.text("abcdefgh", min_size=1, max_size=6),
        ready=st.booleans(),
        standby=st.booleans(),
        in_flight=st.integers(0, 500),
        cache_warmth=st.floats(0, 1),
        ready_for_seconds=st.floats(0, 1e5),
    ),
    max_size=25,
    unique_by=lambda p: p.name,
)


@given(pod_lists, st.integers(0, 30), st.integers(0, 10))
def test_roles_partition_ready_pods(pods: list[PodView], serving: int, standby: int) -> None:
    roles = choose_standby(pods, serving, standby)
    ready = {p.name for p in pods if p.ready}
    assert set(roles.serving) | set(roles.standby) <= ready
    assert not set(roles.serving) & set(roles.standby)
    assert len(roles.serving) == min(serving, len(ready))
    assert len(roles.standby) <= standby
    assert set(roles.promote) <= set(roles.serving)
    assert set(roles.demote) <= set(roles.standby)


@given(pod_lists, st.integers(0, 30))
def test_victims_cost_no_more_than_survivors(pods: list[PodView], count: int) -> None:
    victims = choose_scale_down_victims(pods, count)
    assert len(victims) == min(count, len(pods))
    survivors = [p for p in pods if p not in victims]
    if victims and survivors:
        assert max(map(pod_deletion_cost, victims)) <= min(map(pod_deletion_cost, survivors))
