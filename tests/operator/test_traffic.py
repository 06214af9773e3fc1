"""Make-before-break traffic moves (``core.traffic``): tables for each kind of move, and a
simulation in which the EndpointSlices follow the written routing with an arbitrary lag per pod:
the slices never go from some ready endpoint to none, and what leaves goes only after what stays
is listed ready. The same simulation run with a one-phase move (write the target at once) does
empty the slices: the property is not true by construction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.api import PoolName
from tidal.operator.core.traffic import (
    RoutePod,
    TrafficPolicy,
    TrafficStep,
    TrafficWant,
    plan_traffic,
    routed,
)

P, B = PoolName.PRIMARY, PoolName.BASELINE
BOTH = frozenset({P, B})
ONLY_P, ONLY_B = frozenset({P}), frozenset({B})


def pod(name: str, pool: PoolName = P, serving: bool = True, ready: bool = True) -> RoutePod:
    return RoutePod(name, pool, serving, ready)


# A flip (rollback): two primary pods serve, the baseline's two warm pods are to take over.
FLIP = [pod("p1"), pod("p2"), pod("b1", B), pod("b2", B)]


@pytest.mark.parametrize(
    ("endpoints", "pools", "complete", "reason"),
    [
        # The slices still list only the primary: select both pools, drop nothing.
        (frozenset({"p1", "p2"}), BOTH, False, "waiting-for-endpoints"),
        # One baseline pod listed, the other not yet: still both.
        (frozenset({"p1", "p2", "b1"}), BOTH, False, "waiting-for-endpoints"),
        # Both baseline pods listed ready: the primary goes.
        (frozenset({"p1", "p2", "b1", "b2"}), ONLY_B, True, "endpoints-ready"),
        # No slice seen yet (an operator just started): wait for one.
        (None, BOTH, False, "endpoints-unseen"),
    ],
)
def test_flip_selects_both_pools_until_the_new_one_is_listed_ready(
    endpoints: frozenset[str] | None, pools: frozenset[PoolName], complete: bool, reason: str
) -> None:
    step = plan_traffic(TrafficWant(ONLY_B), FLIP, ONLY_P, endpoints, None, now=10.0)
    assert (step.pools, step.complete, step.reason) == (pools, complete, reason)
    if not complete:
        assert step.waiting_since == 10.0
        assert not step.shrink


def test_promotion_is_written_at_once_and_the_demotion_waits_for_it() -> None:
    # s1 is promoted in place of p1 (choose_standby's swap): s1 serves at once; p1 keeps its
    # label until the slices list s1.
    pods = [pod("p1"), pod("s1", serving=False)]
    want = TrafficWant(ONLY_P, promote=frozenset({"s1"}), demote=frozenset({"p1"}))
    held = plan_traffic(want, pods, ONLY_P, frozenset({"p1"}), None, now=0.0)
    assert (held.promote, held.demote, held.complete) == (frozenset({"s1"}), frozenset(), False)
    assert held.missing == ("s1",)
    done = plan_traffic(want, pods, ONLY_P, frozenset({"p1", "s1"}), 0.0, now=1.0)
    assert (done.promote, done.demote, done.complete) == (
        frozenset({"s1"}),
        frozenset({"p1"}),
        True,
    )


def test_demotion_waits_until_every_ready_pod_that_stays_is_listed() -> None:
    # Scale-down by demotion: p3 goes to standby; p2 turned Ready a moment ago, not listed yet.
    pods = [pod("p1"), pod("p2"), pod("p3")]
    want = TrafficWant(ONLY_P, demote=frozenset({"p3"}))
    step = plan_traffic(want, pods, ONLY_P, frozenset({"p1", "p3"}), None, now=0.0)
    assert step.demote == frozenset() and step.missing == ("p2",)
    step = plan_traffic(want, pods, ONLY_P, frozenset({"p1", "p2", "p3"}), 0.0, now=0.5)
    assert step.demote == frozenset({"p3"}) and step.complete


def test_a_pod_no_slice_lists_leaves_at_once() -> None:
    # p2 was promoted a moment ago and is demoted again before any slice listed it: it carries
    # no traffic, nothing waits.
    pods = [pod("p1"), pod("p2")]
    step = plan_traffic(
        TrafficWant(ONLY_P, demote=frozenset({"p2"})), pods, ONLY_P, frozenset({"p1"}), None, 0.0
    )
    assert step.complete and step.demote == frozenset({"p2"})
    assert step.reason == "leaving-not-listed"


def test_scale_down_of_the_routed_pool_waits_for_its_pods_to_be_listed() -> None:
    pods = [pod("p1"), pod("p2")]
    want = TrafficWant(ONLY_P, shrink=True)
    assert not plan_traffic(want, pods, ONLY_P, frozenset({"p1"}), None, 0.0).shrink
    assert plan_traffic(want, pods, ONLY_P, frozenset({"p1", "p2"}), None, 0.0).shrink


def test_adding_never_waits() -> None:
    # Entering a staged rollout step (primary -> both) and a plain promotion.
    step = plan_traffic(TrafficWant(BOTH), FLIP, ONLY_P, frozenset(), None, 0.0)
    assert (step.pools, step.complete, step.reason) == (BOTH, True, "unchanged")
    pods = [pod("p1"), pod("s1", serving=False)]
    step = plan_traffic(TrafficWant(ONLY_P, promote=frozenset({"s1"})), pods, ONLY_P, None, None, 0)
    assert step.promote == frozenset({"s1"}) and step.complete


def test_leaving_a_rollout_step_waits_for_the_pool_that_keeps_the_traffic() -> None:
    # The 100 % step: both -> primary; the primary's new pod p2 is not listed yet.
    step = plan_traffic(TrafficWant(ONLY_P), FLIP, BOTH, frozenset({"p1", "b1", "b2"}), None, 0.0)
    assert step.pools == BOTH and step.missing == ("p2",)


def test_a_long_wait_completes_once_one_pod_that_stays_is_listed_and_says_so() -> None:
    policy = TrafficPolicy(wait_seconds=60.0)
    listed = frozenset({"p1", "p2", "b1"})  # b2 never shows up
    step = plan_traffic(TrafficWant(ONLY_B), FLIP, ONLY_P, listed, 0.0, 59.0, policy)
    assert not step.complete and not step.overdue
    step = plan_traffic(TrafficWant(ONLY_B), FLIP, ONLY_P, listed, 0.0, 60.0, policy)
    assert step.complete and step.overdue and step.reason == "endpoints-slow"
    assert step.missing == ("b2",) and step.waiting_since == 0.0


def test_traffic_never_moves_onto_a_pool_no_slice_lists() -> None:
    # The baseline's pods never appear: the primary keeps serving, however long, and the step
    # says it is overdue (the shell posts a Warning).
    listed = frozenset({"p1", "p2"})
    step = plan_traffic(TrafficWant(ONLY_B), FLIP, ONLY_P, listed, 0.0, 3600.0)
    assert step.pools == BOTH and not step.complete
    assert step.overdue and step.reason == "endpoints-not-ready"
    assert step.missing == ("b1", "b2")
    # Nor onto a pool with no Ready pod at all.
    cold = [pod("p1"), pod("b1", B, ready=False)]
    step = plan_traffic(TrafficWant(ONLY_B), cold, ONLY_P, frozenset({"p1"}), 0.0, 3600.0)
    assert step.pools == BOTH and not step.complete


def test_when_no_slice_is_ever_seen_the_move_completes_after_the_wait() -> None:
    # An operator that may not read EndpointSlices (an older chart's RBAC) is no worse off than
    # before, only slower.
    step = plan_traffic(TrafficWant(ONLY_B), FLIP, ONLY_P, None, 0.0, 60.0)
    assert step.complete and step.overdue and step.reason == "endpoints-unseen"


def test_routing_to_nothing_is_not_held() -> None:
    # The way to zero: every pod leaves (the Service then selects the gateway).
    pods = [pod("p1")]
    step = plan_traffic(TrafficWant(ONLY_P, demote=frozenset({"p1"})), pods, ONLY_P, None, None, 0)
    assert step.complete and step.demote == frozenset({"p1"})


# -- simulation ---------------------------------------------------------------------------------

Planner = Callable[
    [TrafficWant, Sequence[RoutePod], frozenset[PoolName], frozenset[str] | None, float | None],
    TrafficStep,
]


@dataclass
class World:
    """What the operator wrote (the Service's selector, the pods' role labels), one write per
    tick, and what the EndpointSlices show. The EndpointSlice controller sees the Service as one
    object, so the selector it applies to every pod is that of one earlier write (its lag);
    each pod's labels are their own object, each as of some earlier write of its own."""

    pods: dict[str, RoutePod]
    writes: list[tuple[frozenset[PoolName], dict[str, RoutePod]]]  # after each write

    def labelled(self) -> list[RoutePod]:
        return list(self.pods.values())

    def write(self, selected: frozenset[PoolName]) -> None:
        self.writes.append((selected, dict(self.pods)))

    def endpoints(self, service_seen: int, seen: dict[str, int]) -> frozenset[str]:
        pools = self.writes[service_seen][0]
        return frozenset(
            n
            for n, p in self.pods.items()
            if p.ready and routed([self.writes[seen[n]][1][n]], pools)
        )


def simulate(
    planner: Planner,
    pods: list[RoutePod],
    selected: frozenset[PoolName],
    wants: list[TrafficWant],
    lags: list[list[int]],
) -> list[tuple[frozenset[str], TrafficStep, list[RoutePod], frozenset[PoolName]]]:
    """Each tick: the slices advance the Service and each pod by its lag draw (never backwards,
    never past the last write), the planner decides from them, the world applies what it
    writes."""
    world = World({p.name: p for p in pods}, [])
    world.write(selected)
    service_seen = 0
    seen = {p.name: 0 for p in pods}
    since: float | None = None
    history = []
    for tick, want in enumerate(wants):
        draws = lags[tick % len(lags)]
        last = len(world.writes) - 1
        service_seen = max(service_seen, last - draws[0])
        for i, name in enumerate(sorted(seen), 1):
            seen[name] = max(seen[name], last - draws[i % len(draws)])
        endpoints = world.endpoints(service_seen, seen)
        labelled = world.labelled()
        step = planner(want, labelled, selected, endpoints, since)
        since = step.waiting_since
        history.append((endpoints, step, labelled, selected))
        for name, p in world.pods.items():
            if name in step.demote:
                world.pods[name] = RoutePod(name, p.pool, False, p.ready)
            elif name in step.promote:
                world.pods[name] = RoutePod(name, p.pool, True, p.ready)
        selected = step.pools
        world.write(selected)
    return history


def two_phase(
    want: TrafficWant,
    pods: Sequence[RoutePod],
    selected: frozenset[PoolName],
    endpoints: frozenset[str] | None,
    since: float | None,
) -> TrafficStep:
    return plan_traffic(want, pods, selected, endpoints, since, now=0.0)  # never overdue


def one_phase(
    want: TrafficWant,
    pods: Sequence[RoutePod],
    selected: frozenset[PoolName],
    endpoints: frozenset[str] | None,
    since: float | None,
) -> TrafficStep:
    """The operator before make-before-break: the target written at once."""
    return TrafficStep(want.pools, want.promote, want.demote, want.shrink, True, "at-once")


NAMES = ["p1", "p2", "p3", "b1", "b2", "b3"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[RoutePod], frozenset[PoolName], list[TrafficWant]]:
    pods = [
        RoutePod(n, P if n[0] == "p" else B, draw(st.booleans()), draw(st.booleans()))
        for n in NAMES
    ]
    pools = st.sampled_from([ONLY_P, ONLY_B, BOTH])
    selected = draw(pools)
    names = st.frozensets(st.sampled_from(NAMES))
    wants = [
        TrafficWant(draw(pools), draw(names), draw(names)) for _ in range(draw(st.integers(1, 3)))
    ]
    # A pod's role changes once in a move: no want promotes a pod an earlier one demoted, or
    # the other way round. (A pod demoted and promoted again while the slices still show its
    # first labels looks, from the slices alone, like one that never left: nothing stateless
    # can tell them apart; the operator's delays keep such a pod out of a move.)
    demoted: set[str] = set()
    promoted: set[str] = set()
    for i, w in enumerate(wants):
        promote, demote = w.promote - demoted, w.demote - promoted
        wants[i] = TrafficWant(w.pools, promote, demote)
        promoted |= promote - demote
        demoted |= demote
    ticks = draw(st.integers(1, 6))
    return pods, selected, [w for w in wants for _ in range(ticks)]


LAGS = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=6), min_size=1, max_size=8)


# The same 400 scenarios every run (conftest.py's "ci" profile). Searched wider
# (hypothesis.find over 200,000 scenarios), the planner has a known limit: when the slices lag
# by more writes than a decision lasts and the pools flip back within that lag, a listing left
# from an older write can be taken for the current one, and the slices can list nothing for
# as long as they lag (2 of 120 random runs of 400 found one). Nothing stateless tells the two
# apart from the slices alone; the operator's traffic decisions last seconds (SLO windows,
# step and drain times), the slices' lag a fraction of one.
@settings(max_examples=400, deadline=None)
@given(scenarios(), LAGS)
def test_simulated_moves_never_empty_the_endpoints(
    scenario: tuple[list[RoutePod], frozenset[PoolName], list[TrafficWant]],
    lags: list[list[int]],
) -> None:
    pods, selected, wants = scenario
    start = frozenset(p.name for p in pods if p.ready) & routed(pods, selected)
    history = simulate(two_phase, pods, selected, wants, lags)
    timeline = [sorted(e) for e, *_ in history]
    # From a Service that lists a ready pod, the slices never list none. (From one that lists
    # none, a view that mixes an older selector with newer labels can list a pod for a while
    # that no write routed with that selector; its going again is not a move's doing.)
    chose_nothing = False  # a decision routed to no pod at all (the way to zero)
    for endpoints, step, labelled, selected_then in history:
        chose_nothing |= step.reason == "to-nothing"
        assert endpoints or not start or chose_nothing, f"endpoints emptied: {timeline}"
        stays = routed(labelled, step.pools, step.promote, step.demote)
        leaves = routed(labelled, selected_then | step.pools, step.promote) - stays
        if leaves & endpoints and stays:
            ready = {p.name for p in labelled if p.ready} & stays
            assert ready <= endpoints and stays & endpoints, f"removed too soon: {timeline}"


def test_the_simulation_catches_a_one_phase_flip() -> None:
    # The same world and lag (the slices see the selector flip, not yet the new pool's pods):
    # writing the target at once empties the endpoints; two phases never do.
    pods = [pod("p1"), pod("b1", B, serving=False)]
    wants = [TrafficWant(ONLY_B, promote=frozenset({"b1"}))] * 4
    # The Service's selector reaches the slices at once, b1's (sorted first) labels a write
    # late, p1's at once.
    lags = [[0, 1, 0]]

    def emptied(planner: Planner) -> bool:
        return any(not e for e, *_ in simulate(planner, pods, ONLY_P, wants, lags)[1:])

    assert emptied(one_phase)
    assert not emptied(two_phase)
