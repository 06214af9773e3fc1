"""decide_scale: behaviour tables and properties, with injected time (no sleeping)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.autoscaler import (
    NOTE_PROMETHEUS_UNAVAILABLE,
    REASON_CAPPED_MAX,
    REASON_DOWN_IDLE,
    REASON_DOWN_LOW,
    REASON_FLOOR_MIN,
    REASON_HOLD_MISSING,
    REASON_HOLD_STALE,
    REASON_P99,
    REASON_RATE_LIMITED,
    REASON_STEADY,
    REASON_SURGE_QUEUE,
    REASON_SURGE_RATE,
    REASON_SURGE_TREND,
    REASON_UNSCHEDULABLE,
    REASON_WAIT_DOWN,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
)

SPR = 0.05  # seconds of concurrency per request in these tests (a 50 ms request)
TARGET = 4.0  # target queue depth per replica, so one replica carries 80 req/s at target
PER_REPLICA = TARGET / SPR

POLICY = ScalingPolicy(
    min_replicas=1,
    max_replicas=100,
    target_queue_depth=TARGET,
    target_p99_ms=200.0,
    scale_down_delay_seconds=60.0,
    default_warmup_seconds=20.0,
)


def obs(now: float, ready: int, rate: float, **kw: object) -> Observation:
    """A fresh observation of a pool carrying `rate` req/s without queueing."""
    fields: dict[str, object] = {
        "queue_depth": rate * SPR,
        "arrival_rate": rate,
        "hot_p99_ms": 60.0,
        "warmup_seconds": 20.0,
    }
    fields.update(kw)
    return Observation(now=now, ready_serving=ready, **fields)  # type: ignore[arg-type]


def settle(
    policy: ScalingPolicy, ready: int, rate: float, seconds: int = 30, start: float = 0.0
) -> tuple[ScaleDecision, ScalerState]:
    """Run `seconds` one-second ticks of a steady pool (learns seconds-per-request)."""
    state = ScalerState(desired_serving=ready)
    decision = None
    for k in range(seconds):
        decision, state = decide_scale(policy, obs(start + k, ready, rate), state)
    assert decision is not None
    return decision, state


class Plant:
    """A pool whose new replicas are ready `warmup` seconds after they are asked for."""

    def __init__(self, policy: ScalingPolicy, ready: int, warmup: float = 20.0) -> None:
        self.policy = policy
        self.warmup = warmup
        self.ready = ready
        self.arrivals: list[float] = []  # ready times of warming replicas
        self.state = ScalerState(desired_serving=ready)
        self.decisions: list[ScaleDecision] = []

    def tick(self, now: float, rate: float, **kw: object) -> ScaleDecision:
        self.ready += sum(1 for t in self.arrivals if t <= now)
        self.arrivals = [t for t in self.arrivals if t > now]
        capacity = self.ready * PER_REPLICA
        queue = rate * SPR + max(0.0, rate - capacity) * 2.0
        fields: dict[str, object] = {"queue_depth": queue, "warming": len(self.arrivals)}
        fields.update(kw)
        o = obs(now, self.ready, rate, **fields)
        decision, self.state = decide_scale(self.policy, o, self.state)
        want = decision.desired_serving
        pods = self.ready + len(self.arrivals)
        if want > pods:
            self.arrivals += [now + self.warmup] * (want - pods)
        elif want < pods:
            drop = pods - want
            cut = min(drop, len(self.arrivals))
            self.arrivals = self.arrivals[cut:]
            self.ready -= drop - cut
        self.decisions.append(decision)
        return decision


# ------------------------------------------------------------------------------------------
# Tables


def test_steady_load_holds_replicas() -> None:
    decision, _ = settle(POLICY, ready=10, rate=10 * PER_REPLICA * 0.95)
    assert decision.desired_serving == 10
    assert decision.reason == REASON_STEADY
    assert not decision.hold


def test_surge_reacts_within_one_tick() -> None:
    policy = replace(POLICY, max_replicas=1000, max_scale_up_rate=20.0)
    _, state = settle(policy, ready=10, rate=800)
    decision, _ = decide_scale(policy, obs(30, 10, 4000, queue_depth=250.0), state)
    # The flow of 4000 req/s at the target depth, plus draining what 10 replicas fall behind
    # by during the warm-up (3200 req/s for 20 s) over backlog_drain_seconds.
    flow = 4000 / PER_REPLICA
    backlog = (250 - 4000 * SPR + 3200 * 20) * SPR / policy.backlog_drain_seconds / TARGET
    assert decision.desired_serving == math.ceil(flow + backlog)
    assert decision.reason == REASON_SURGE_RATE


def test_surge_without_arrival_rate_scales_on_queue() -> None:
    state = ScalerState(desired_serving=5)
    o = Observation(now=0, ready_serving=5, queue_depth=100.0)
    decision, _ = decide_scale(POLICY, o, state)
    assert decision.desired_serving == 25
    assert decision.reason == REASON_SURGE_QUEUE


def test_warming_replicas_count_as_capacity_on_the_way() -> None:
    plant = Plant(POLICY, ready=10)
    for k in range(30):
        plant.tick(k, 800)
    first = plant.tick(30, 4000)
    asked = first.desired_serving
    later = [plant.tick(31 + k, 4000).desired_serving for k in range(15)]
    # While the first batch warms the backlog grows, but the pool is not re-sized for it.
    assert max(later) <= asked * 1.25
    assert plant.arrivals, "replicas are still warming"


def test_sizes_for_demand_when_new_replicas_are_warm() -> None:
    _, state = settle(POLICY, ready=10, rate=600)
    decision = None
    # A ramp of +20 req/s every second for 10 s: rising in both halves of the trend window.
    for k in range(11):
        rate = 600 + 20 * k
        decision, state = decide_scale(POLICY, obs(30 + k, 10, rate), state)
    assert decision is not None
    now_demand = math.ceil(800 / PER_REPLICA)
    assert decision.inputs.projected_rate is not None
    assert decision.inputs.projected_rate > 800
    assert decision.desired_serving > now_demand
    assert decision.reason == REASON_SURGE_TREND


def test_a_step_is_not_extrapolated_as_a_trend() -> None:
    _, state = settle(POLICY, ready=10, rate=800)
    decision = None
    for k in range(10):
        decision, state = decide_scale(POLICY, obs(30 + k, 60, 4000), state)
    assert decision is not None
    assert decision.inputs.projected_rate == pytest.approx(4000)


def test_p99_approaching_target_scales_up_with_quiet_queues() -> None:
    _, state = settle(POLICY, ready=10, rate=600)
    decision, _ = decide_scale(POLICY, obs(30, 10, 600, hot_p99_ms=180.0), state)
    assert decision.reason == REASON_P99
    assert decision.desired_serving == math.ceil(10 * 180 / (0.8 * 200))


def test_p99_waits_for_previous_additions_to_show() -> None:
    _, state = settle(POLICY, ready=10, rate=600)
    state = replace(state, last_scale_up_at=25.0)
    decision, _ = decide_scale(POLICY, obs(30, 10, 600, hot_p99_ms=180.0), state)
    assert decision.desired_serving == 10


def test_scale_down_waits_for_delay_then_takes_window_max() -> None:
    _, state = settle(POLICY, ready=20, rate=20 * PER_REPLICA)
    low = 5 * PER_REPLICA * 0.9
    seen = []
    # Recommendations of 20 were made up to t=29; the window (t-60, t] is free of them at 89.
    for k in range(60):
        decision, state = decide_scale(POLICY, obs(30 + k, 20, low), state)
        seen.append(decision)
    assert all(d.desired_serving == 20 for d in seen[:59])
    assert seen[0].reason == REASON_WAIT_DOWN
    assert seen[-1].desired_serving == 5
    assert seen[-1].reason == REASON_DOWN_LOW


def test_scale_down_to_idle() -> None:
    _, state = settle(POLICY, ready=4, rate=4 * PER_REPLICA)
    decisions = []
    for k in range(100):
        decision, state = decide_scale(
            POLICY, obs(30 + k, 4, 0.0, queue_depth=0.0, hot_p99_ms=None), state
        )
        decisions.append(decision)
    assert decisions[-1].desired_serving == POLICY.min_replicas
    downs = [d for d in decisions if d.desired_serving < 4]
    assert downs[0].reason == REASON_DOWN_IDLE


def test_p99_near_target_blocks_scale_down() -> None:
    # A long P99 window keeps the P99 term itself from adding replicas in this test.
    policy = replace(POLICY, p99_window_seconds=10_000)
    _, state = settle(policy, ready=20, rate=20 * PER_REPLICA)
    state = replace(state, last_scale_up_at=0.0)
    decision = None
    for k in range(120):
        decision, state = decide_scale(policy, obs(30 + k, 20, 100.0, hot_p99_ms=170.0), state)
        assert decision.desired_serving == 20
    assert decision is not None
    assert "p99 does not agree to scale down" in decision.notes


@pytest.mark.parametrize(
    ("observation", "reason"),
    [
        (Observation(now=5, ready_serving=8, queue_depth=None), REASON_HOLD_MISSING),
        (Observation(now=5, ready_serving=8, metrics_age_seconds=None), REASON_HOLD_STALE),
        (Observation(now=5, ready_serving=8, metrics_age_seconds=60.0), REASON_HOLD_STALE),
    ],
)
def test_missing_or_stale_metrics_hold(observation: Observation, reason: str) -> None:
    decision, state = decide_scale(POLICY, observation, ScalerState(desired_serving=12))
    assert decision.hold
    assert decision.reason == reason
    assert decision.desired_serving == 12
    assert state.agreed_since is None
    assert state.down_window == ()


def test_scale_down_needs_a_full_delay_of_fresh_metrics_after_a_hold() -> None:
    _, state = settle(POLICY, ready=20, rate=20 * PER_REPLICA, seconds=100)
    _, state = decide_scale(POLICY, Observation(now=100, ready_serving=20, queue_depth=None), state)
    # Fresh again from t=101: scale-down may come at t=161, not before.
    for k in range(60):
        decision, state = decide_scale(POLICY, obs(101 + k, 20, 200), state)
        assert decision.desired_serving == 20
    decision, state = decide_scale(POLICY, obs(161, 20, 200), state)
    assert decision.desired_serving < 20


def test_max_bound_and_standby_gives_way() -> None:
    policy = replace(POLICY, max_replicas=12, standby_replicas=3)
    decision, _ = decide_scale(
        policy, Observation(now=0, ready_serving=5, queue_depth=400.0), ScalerState()
    )
    assert decision.desired_serving == 12
    assert decision.desired_standby == 0
    assert decision.desired_total == 12
    assert decision.reason == REASON_CAPPED_MAX


def test_min_bound() -> None:
    policy = replace(POLICY, min_replicas=3)
    decision, _ = decide_scale(
        policy, Observation(now=0, ready_serving=1, queue_depth=0.0), ScalerState()
    )
    assert decision.desired_serving == 3
    assert decision.reason == REASON_FLOOR_MIN


def test_max_scale_up_rate() -> None:
    policy = replace(POLICY, max_scale_up_rate=2.0, max_scale_up_step=1)
    decision, _ = decide_scale(
        policy,
        Observation(now=0, ready_serving=4, queue_depth=400.0),
        ScalerState(desired_serving=4),
    )
    assert decision.desired_serving == 8
    assert decision.reason == REASON_RATE_LIMITED


def test_unschedulable_pods_stop_additions_and_are_reported() -> None:
    _, state = settle(POLICY, ready=10, rate=800)
    decision, _ = decide_scale(
        POLICY, obs(30, 10, 4000, queue_depth=250.0, pending_unschedulable=2), state
    )
    assert decision.unschedulable
    assert decision.reason == REASON_UNSCHEDULABLE
    assert decision.desired_serving == 10
    assert any("unschedulable" in n for n in decision.notes)


def test_standby_is_promoted_first_on_a_surge() -> None:
    policy = replace(POLICY, standby_replicas=3, max_replicas=1000, max_scale_up_rate=20.0)
    _, state = settle(policy, ready=10, rate=800)
    decision, _ = decide_scale(policy, obs(30, 10, 4000, ready_standby=3), state)
    assert decision.promote_standby == 3
    assert decision.desired_standby == 3  # the pool is refilled by new pods
    steady, _ = decide_scale(policy, obs(30, 10, 800, ready_standby=3), state)
    assert steady.promote_standby == 0


def test_state_stays_bounded() -> None:
    plant = Plant(POLICY, ready=10)
    for k in range(2000):
        plant.tick(k, 800 + 700 * math.sin(k / 37) + (k % 7) * 30)
    assert len(plant.state.down_window) <= POLICY.max_replicas + 1
    assert len(plant.state.trend_samples) <= POLICY.trend_window_seconds + 1


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        ScalingPolicy(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="tick_seconds"):
        ScalingPolicy(tick_seconds=5)
    with pytest.raises(ValueError):
        Observation(now=0, ready_serving=-1)


def test_policy_from_the_spec() -> None:
    from tidal.operator.core import api

    spec = api.Autoscaling.model_validate(
        {"minReplicas": 2, "maxReplicas": 40, "targetQueueDepth": 6, "standbyReplicas": 2}
    )
    policy = ScalingPolicy.from_spec(spec, tick_seconds=0.5)
    assert (policy.min_replicas, policy.max_replicas, policy.standby_replicas) == (2, 40, 2)
    assert policy.target_queue_depth == 6
    assert policy.scale_down_delay_seconds == spec.scale_down_delay_seconds
    assert policy.tick_seconds == 0.5


# ------------------------------------------------------------------------------------------
# Properties

policies = st.builds(
    ScalingPolicy,
    min_replicas=st.integers(0, 5),
    max_replicas=st.integers(5, 60),
    target_queue_depth=st.floats(0.5, 20),
    target_p99_ms=st.one_of(st.none(), st.floats(50, 2000)),
    standby_replicas=st.integers(0, 4),
    scale_down_delay_seconds=st.floats(0, 120),
    max_scale_up_rate=st.floats(1, 10),
    max_scale_up_step=st.integers(1, 8),
)

observation_parts = st.fixed_dictionaries(
    {
        "ready_serving": st.integers(0, 80),
        "warming": st.integers(0, 20),
        "ready_standby": st.integers(0, 5),
        "pending_unschedulable": st.integers(0, 3),
        "queue_depth": st.one_of(st.none(), st.floats(0, 5000)),
        "hot_p99_ms": st.one_of(st.none(), st.floats(0, 5000)),
        "arrival_rate": st.one_of(st.none(), st.floats(0, 20000)),
        "warmup_seconds": st.one_of(st.none(), st.floats(0, 120)),
        "metrics_age_seconds": st.one_of(st.none(), st.floats(0, 20)),
        "dt": st.floats(0.1, 5),
    }
)


def replay(
    policy: ScalingPolicy, parts: list[dict[str, object]]
) -> tuple[list[tuple[float, ScaleDecision]], float, ScalerState]:
    """Feed generated observations one after another: the decisions, last time and state."""
    state = ScalerState()
    now = 0.0
    out = []
    for p in parts:
        fields = dict(p)
        now += float(fields.pop("dt"))  # type: ignore[arg-type]
        decision, state = decide_scale(policy, Observation(now=now, **fields), state)  # type: ignore[arg-type]
        out.append((now, decision))
    return out, now, state


def run(policy: ScalingPolicy, parts: list[dict[str, object]]) -> list[tuple[float, ScaleDecision]]:
    return replay(policy, parts)[0]


@settings(max_examples=80, deadline=None)
@given(policies, st.lists(observation_parts, min_size=1, max_size=40))
def test_bounds_always_hold(policy: ScalingPolicy, parts: list[dict[str, object]]) -> None:
    for _, d in run(policy, parts):
        assert policy.min_replicas <= d.desired_serving <= policy.max_replicas
        assert 0 <= d.desired_standby <= policy.standby_replicas
        assert d.desired_total <= policy.max_replicas
        assert 0 <= d.promote_standby <= d.inputs.ready_standby
        assert d.reason


@settings(max_examples=80, deadline=None)
@given(policies, st.lists(observation_parts, min_size=1, max_size=60))
def test_no_scale_down_inside_the_delay(
    policy: ScalingPolicy, parts: list[dict[str, object]]
) -> None:
    """A decrease comes at least `delay` after the last increase or hold (or the start)."""
    decisions = run(policy, parts)
    # The first decision may floor/cap what it found; measure from it.
    blocker = decisions[0][0]
    previous = decisions[0][1].desired_serving
    for now, d in decisions[1:]:
        if d.desired_serving < previous:
            assert now - blocker >= policy.scale_down_delay_seconds
        if d.desired_serving > previous or d.hold:
            blocker = now
        previous = d.desired_serving


@settings(max_examples=40, deadline=None)
@given(
    policy=policies,
    load=st.floats(0.2, 30),
    start=st.integers(1, 40),
    wobble=st.lists(st.floats(-0.04, 0.04), min_size=8, max_size=8),
)
def test_no_flapping_under_steady_load(
    policy: ScalingPolicy, load: float, start: int, wobble: list[float]
) -> None:
    """Under a steady load (noise within the tolerance) the pool settles and stays.

    The scale-down delay is what absorbs noise that crosses a whole replica, so it is at least
    the noise's period here (with no delay at all, a demand of 5.19 wobbling to 4.98 does flap
    between 5 and 6 replicas).
    """
    policy = replace(
        policy,
        target_p99_ms=None,
        target_queue_depth=TARGET,
        scale_down_delay_seconds=max(policy.scale_down_delay_seconds, 10.0),
    )
    rate = load * PER_REPLICA
    start = min(max(start, policy.min_replicas), policy.max_replicas)
    plant = Plant(policy, ready=start, warmup=10.0)
    for k in range(400):
        plant.tick(float(k), rate * (1 + wobble[k % len(wobble)]))
    sizes = [d.desired_serving for d in plant.decisions]
    # After the transient (a warm-up, a backlog drained, one scale-down delay) it stays put.
    settled = sizes[250:]
    assert min(settled) == max(settled), sizes


@settings(max_examples=120, deadline=None)
@given(
    policy=policies,
    history=st.lists(observation_parts, max_size=20),
    base=observation_parts,
    more_queue=st.floats(0, 2000),
    more_rate=st.floats(0, 5000),
    more_p99=st.floats(0, 2000),
)
def test_more_load_never_yields_fewer_replicas(
    policy: ScalingPolicy,
    history: list[dict[str, object]],
    base: dict[str, object],
    more_queue: float,
    more_rate: float,
    more_p99: float,
) -> None:
    _, now, state = replay(policy, history)
    fields = dict(base)
    now += float(fields.pop("dt"))  # type: ignore[arg-type]
    low = Observation(now=now, **fields)  # type: ignore[arg-type]
    high = replace(
        low,
        queue_depth=None if low.queue_depth is None else low.queue_depth + more_queue,
        arrival_rate=None if low.arrival_rate is None else low.arrival_rate + more_rate,
        hot_p99_ms=None if low.hot_p99_ms is None else low.hot_p99_ms + more_p99,
    )
    d_low, _ = decide_scale(policy, low, state)
    d_high, _ = decide_scale(policy, high, state)
    assert d_high.desired_serving >= d_low.desired_serving


@settings(max_examples=80, deadline=None)
@given(
    policies,
    st.lists(observation_parts, max_size=20),
    st.one_of(st.none(), st.floats(5.01, 1000)),
)
def test_stale_metrics_never_scale_down(
    policy: ScalingPolicy, history: list[dict[str, object]], age: float | None
) -> None:
    policy = replace(policy, max_metrics_age_seconds=5.0)
    decisions, now, state = replay(policy, history)
    before = decisions[-1][1].desired_serving if decisions else None
    decision, after = decide_scale(
        policy,
        Observation(now=now + 1, ready_serving=0, queue_depth=0.0, metrics_age_seconds=age),
        state,
    )
    assert decision.hold
    assert decision.reason == REASON_HOLD_STALE
    if before is not None:
        assert decision.desired_serving == before
    assert after.desired_serving == decision.desired_serving


def test_prometheus_unavailable_holds_scale_down_but_not_scale_up() -> None:
    """Prometheus down (issue 14): the pods' own queue still drives scale-up; nothing is
    removed, however long the quiet lasts, and the delay starts over once Prometheus answers."""
    policy = replace(POLICY, target_p99_ms=None)
    _, state = settle(policy, ready=20, rate=20 * PER_REPLICA)
    down = {"prometheus_unavailable": True, "hot_p99_ms": None}
    for k in range(200):
        decision, state = decide_scale(policy, obs(30 + k, 20, 0.0, queue_depth=0.0, **down), state)
        assert decision.desired_serving == 20
    assert NOTE_PROMETHEUS_UNAVAILABLE in decision.notes
    surge, _ = decide_scale(policy, obs(230, 20, 60 * PER_REPLICA, **down), state)
    assert surge.desired_serving > 20
    # Back: a whole scale-down delay of agreeing signals first.
    for k in range(60):
        decision, state = decide_scale(policy, obs(231 + k, 20, 0.0, queue_depth=0.0), state)
        assert decision.desired_serving == 20
    decision, state = decide_scale(policy, obs(291, 20, 0.0, queue_depth=0.0), state)
    assert decision.desired_serving < 20
