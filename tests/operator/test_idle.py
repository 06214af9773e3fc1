"""Scale to zero and wake ahead (``core.idle``): tables and properties with injected time."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.api import PoolName
from tidal.operator.core.autoscaler import Observation, ScalerState, ScalingPolicy, decide_scale
from tidal.operator.core.control import autoscaler_status, scale_event, stored_zero_memory
from tidal.operator.core.forecast import ForecastPolicy
from tidal.operator.core.idle import (
    REASON_AT_ZERO,
    REASON_BUSY,
    REASON_HOLD_FORECAST,
    REASON_WAIT_ZERO,
    REASON_WAKE_FORECAST,
    REASON_WAKE_REQUEST,
    REASON_ZERO_IDLE,
    IdleSignals,
    IdleState,
    ZeroMemory,
    ZeroPolicy,
    decide_scale_zero,
    decide_zero,
    dump_zero,
    forecast_peak,
    is_quiet,
    learn_demand,
    load_zero,
    wake_lead,
    zero_persist_key,
)

ZERO = ZeroPolicy(after_seconds=300.0, wake_margin_seconds=30.0)
WAKE = ZERO.wake_threshold  # 1 request per 300 s


@pytest.mark.parametrize(
    ("at_zero", "state", "signals", "floor", "reason"),
    [
        # Awake: the idle timer runs from the last request.
        (False, IdleState(active_at=0.0), IdleSignals(299.0, active=False), 1, REASON_WAIT_ZERO),
        (False, IdleState(active_at=0.0), IdleSignals(300.0, active=False), 0, REASON_ZERO_IDLE),
        (False, IdleState(active_at=0.0), IdleSignals(400.0, active=True), 1, REASON_BUSY),
        # Unknown metrics count as busy; a held request or a due forecast blocks zero.
        (False, IdleState(active_at=0.0), IdleSignals(400.0, active=None), 1, REASON_BUSY),
        (False, IdleState(active_at=0.0), IdleSignals(400.0, False, held=1), 1, REASON_BUSY),
        (
            False,
            IdleState(active_at=0.0),
            IdleSignals(400.0, False, forecast_rate=WAKE),
            1,
            REASON_HOLD_FORECAST,
        ),
        # A forecast below the wake rate is no demand.
        (
            False,
            IdleState(active_at=0.0),
            IdleSignals(400.0, False, forecast_rate=WAKE / 2),
            0,
            REASON_ZERO_IDLE,
        ),
        # First tick (or a lost state): the timer starts now, nothing goes to zero at once.
        (False, IdleState(), IdleSignals(1000.0, active=False), 1, REASON_WAIT_ZERO),
        # At zero: quiet stays; a held request or arrivals wake at once; a due forecast wakes.
        (True, IdleState(0.0, 300.0), IdleSignals(5000.0, active=False), 0, REASON_AT_ZERO),
        (True, IdleState(0.0, 300.0), IdleSignals(5000.0, False, held=1), 1, REASON_WAKE_REQUEST),
        (True, IdleState(0.0, 300.0), IdleSignals(5000.0, active=True), 1, REASON_WAKE_REQUEST),
        (
            True,
            IdleState(0.0, 300.0),
            IdleSignals(5000.0, False, forecast_rate=2 * WAKE),
            1,
            REASON_WAKE_FORECAST,
        ),
        # At zero an unknown tick is not a request: nothing is served, nothing to measure.
        (True, IdleState(0.0, 300.0), IdleSignals(5000.0, active=None), 0, REASON_AT_ZERO),
    ],
)
def test_zero_verdict_table(
    at_zero: bool, state: IdleState, signals: IdleSignals, floor: int, reason: str
) -> None:
    verdict, _ = decide_zero(ZERO, signals, state, at_zero)
    assert (verdict.floor, verdict.reason) == (floor, reason), verdict


def test_wake_lead_is_measured_time_to_routable_plus_margin() -> None:
    assert wake_lead(ZERO, 42.0) == 72.0
    assert wake_lead(ZERO, None) == ZERO.default_routable_seconds + 30.0
    assert wake_lead(ZERO, float("nan")) == ZERO.default_routable_seconds + 30.0


def test_wake_rate_defaults_to_one_request_per_idle_window() -> None:
    assert ZeroPolicy(after_seconds=600.0).wake_threshold == pytest.approx(1 / 600)
    assert ZeroPolicy(wake_rate=0.5).wake_threshold == 0.5
    with pytest.raises(ValueError, match="after_seconds"):
        ZeroPolicy(after_seconds=-1.0)


# ------------------------------------------------------------------------------------------
# Through decide_scale: a pool with minReplicas 0.

POLICY = ScalingPolicy(min_replicas=0, max_replicas=8, scale_down_delay_seconds=60.0)


def obs(now: float, ready: int, rate: float = 0.0, queue: float = 0.0) -> Observation:
    return Observation(now=now, ready_serving=ready, queue_depth=queue, arrival_rate=rate)


def test_quiet_pool_goes_to_zero_releases_standby_and_stays() -> None:
    policy = ScalingPolicy(
        min_replicas=0, max_replicas=8, standby_replicas=2, scale_down_delay_seconds=60.0
    )
    scaler, idle = ScalerState(desired_serving=1), IdleState()
    reasons = []
    for t in range(0, 700, 10):
        ready = 0 if scaler.desired_serving == 0 else 1
        sig = IdleSignals(float(t), active=False)
        decision, scaler, idle = decide_scale_zero(
            policy, ZERO, obs(float(t), ready), scaler, sig, idle
        )
        reasons.append((t, decision.desired_serving, decision.desired_standby, decision.reason))
    went = [r for r in reasons if r[3] == REASON_ZERO_IDLE]
    assert went and went[0][0] == 300, reasons
    assert all(r[1:3] == (0, 0) for r in reasons if r[0] >= 300), reasons
    assert all(r[1] == 1 for r in reasons if r[0] < 300), reasons
    assert reasons[-1][3] == REASON_AT_ZERO


def test_burst_held_at_zero_wakes_at_once_sized_by_the_held_requests() -> None:
    scaler, idle = ScalerState(desired_serving=0), IdleState(0.0, 300.0)
    sig = IdleSignals(1000.0, active=False, held=100)
    decision, scaler, idle = decide_scale_zero(POLICY, ZERO, obs(1000.0, 0), scaler, sig, idle)
    assert decision.desired_serving >= 1, decision
    assert decision.reason.startswith(("wake:", "surge:", "rate-limited")), decision
    assert idle.active_at == 1000.0 and idle.zero_since is None


def test_single_held_request_wakes_one_replica_with_the_wake_reason() -> None:
    scaler, idle = ScalerState(desired_serving=0), IdleState(0.0, 300.0)
    sig = IdleSignals(1000.0, active=False, held=1)
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, fallback_queue_depth=4.0)
    decision, _, _ = decide_scale_zero(policy, ZERO, obs(1000.0, 0), scaler, sig, idle)
    assert (decision.desired_serving, decision.reason) == (1, REASON_WAKE_REQUEST), decision


def test_forecast_wake_comes_before_the_rise_by_the_lead() -> None:
    """A daily rise at t=10,000 s, forecast by its bucket: the pool wakes once the rise is within
    the lead (time-to-routable 40 s + 30 s) and is routable before it."""
    rise_at, routable = 10_000.0, 40.0
    lead = wake_lead(ZERO, routable)
    scaler, idle = ScalerState(desired_serving=0), IdleState(0.0, 300.0)
    woke_at = None
    for t in range(9_000, 10_001, 5):
        now = float(t)
        peak = 1.0 if now + lead >= rise_at else 0.0  # the forecast's peak over the lead
        sig = IdleSignals(now, active=False, forecast_rate=peak)
        ready = 0 if scaler.desired_serving == 0 else 1
        decision, scaler, idle = decide_scale_zero(POLICY, ZERO, obs(now, ready), scaler, sig, idle)
        if woke_at is None and decision.desired_serving > 0:
            woke_at = now
            assert decision.reason == REASON_WAKE_FORECAST, decision
    assert woke_at is not None
    assert rise_at - lead <= woke_at <= rise_at - routable, woke_at


def test_min_replicas_one_is_decide_scale_unchanged() -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=8)
    scaler, idle = ScalerState(desired_serving=1), IdleState(0.0)
    sig = IdleSignals(10_000.0, active=False)
    decision, _, idle2 = decide_scale_zero(policy, ZERO, obs(10_000.0, 1), scaler, sig, idle)
    assert decision.desired_serving == 1 and idle2 == idle


# ------------------------------------------------------------------------------------------
# Properties over random traces of ticks.

tick = st.tuples(
    st.floats(min_value=0.5, max_value=200.0),  # seconds since the previous tick
    st.sampled_from([True, False, False, False, None]),  # requests seen
    st.sampled_from([0, 0, 0, 0, 1, 50]),  # held at the gateway
    st.sampled_from([None, 0.0, 0.0, WAKE / 10, WAKE, 1.0]),  # forecast peak over the lead
)


def _run(
    trace: list[tuple[float, bool | None, int, float | None]],
) -> list[tuple[float, int, str, IdleSignals]]:
    scaler, idle = ScalerState(desired_serving=1), IdleState()
    now, out = 0.0, []
    for dt, active, held, forecast in trace:
        now += dt
        ready = 0 if scaler.desired_serving == 0 else 1
        rate = 1.0 if active else 0.0
        o = Observation(now=now, ready_serving=ready, queue_depth=0.0, arrival_rate=rate)
        sig = IdleSignals(now, active=active, held=held, forecast_rate=forecast)
        decision, scaler, idle = decide_scale_zero(POLICY, ZERO, o, scaler, sig, idle)
        out.append((now, decision.desired_serving, decision.reason, sig))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(tick, min_size=1, max_size=80))
def test_never_zero_while_a_request_is_held_or_forecast_demand_is_due(
    trace: list[tuple[float, bool | None, int, float | None]],
) -> None:
    for now, desired, reason, sig in _run(trace):
        due = sig.forecast_rate is not None and sig.forecast_rate >= WAKE
        if sig.held > 0 or due or sig.active:
            assert desired >= 1, (now, desired, reason, sig)


@settings(max_examples=200, deadline=None)
@given(st.lists(tick, min_size=1, max_size=80))
def test_never_flaps_between_zero_and_one(
    trace: list[tuple[float, bool | None, int, float | None]],
) -> None:
    """Once up from zero, a pool stays up at least `after_seconds`; at zero it only leaves on a
    request or a due forecast."""
    out = _run(trace)
    up_since: float | None = None
    prev = 1
    for now, desired, reason, sig in out:
        if prev == 0 and desired > 0:
            assert reason in (REASON_WAKE_REQUEST, REASON_WAKE_FORECAST) or sig.held > 0, reason
            up_since = now
        if prev > 0 and desired == 0 and up_since is not None:
            assert now - up_since >= ZERO.after_seconds, (now, up_since, reason)
        prev = desired


quiet_tick = st.tuples(
    st.floats(min_value=0.5, max_value=5000.0),
    st.sampled_from([False, None]),  # no request seen (or nothing to measure at zero)
    st.sampled_from([None, 0.0, WAKE / 10, WAKE * 0.99]),  # a forecast below the wake rate
)


@settings(max_examples=100, deadline=None)
@given(st.lists(quiet_tick, min_size=1, max_size=40))
def test_a_quiet_pool_at_zero_stays_at_zero(
    trace: list[tuple[float, bool | None, float | None]],
) -> None:
    scaler, idle, now = ScalerState(desired_serving=0), IdleState(0.0, 0.0), 0.0
    for dt, active, forecast in trace:
        now += dt
        sig = IdleSignals(now, active=active, forecast_rate=forecast)
        decision, scaler, idle = decide_scale_zero(POLICY, ZERO, obs(now, 0), scaler, sig, idle)
        assert (decision.desired_serving, decision.desired_standby) == (0, 0), (now, decision)
        assert decision.reason == REASON_AT_ZERO, decision
    assert idle.zero_since == 0.0


# ------------------------------------------------------------------------------------------
# The service's own forecast: learned from the arrival history, kept across restarts.

DAY = 86_400.0
FORECAST = ForecastPolicy()


def _morning(t: float) -> float:
    """A daily trace: quiet (0 req/s) until 9:00, then 5 req/s until 17:00."""
    hour = (t % DAY) / 3600.0
    return 5.0 if 9.0 <= hour < 17.0 else 0.0


def _learn_days(days: int) -> ZeroMemory:
    memory = ZeroMemory()
    t = 0.0
    while t < days * DAY:
        memory = learn_demand(FORECAST, memory, _morning(t), t)
        t += 60.0
    return memory


def test_learned_daily_rise_wakes_ahead_by_the_lead_and_not_at_night() -> None:
    memory = _learn_days(3)
    lead = wake_lead(ZERO, 40.0)
    rise = 3 * DAY + 9 * 3600.0
    # Night: the quiet profile and a stale short term say nothing is due.
    night = 3 * DAY + 3 * 3600.0
    assert (forecast_peak(FORECAST, memory, night, lead) or 0.0) < WAKE
    # Within the lead of the rise: due, so a pool at zero wakes.
    before = rise - lead + 1.0
    peak = forecast_peak(FORECAST, memory, before, lead)
    assert peak is not None and peak >= WAKE, peak
    verdict, _ = decide_zero(ZERO, IdleSignals(0.0, False, forecast_rate=peak), IdleState(), True)
    assert verdict.reason == REASON_WAKE_FORECAST


def test_learn_demand_samples_at_most_once_per_interval_and_skips_missing_rates() -> None:
    m1 = learn_demand(FORECAST, ZeroMemory(), 1.0, 100.0)
    assert m1.forecast is not None
    assert learn_demand(FORECAST, m1, 2.0, 101.0) is m1
    assert learn_demand(FORECAST, m1, None, 200.0) is m1
    assert learn_demand(FORECAST, m1, 2.0, 100.0 + FORECAST.sample_interval_seconds) is not m1


def test_zero_memory_survives_a_restart() -> None:
    """Dumped on one process's clocks (offset 1,000), loaded on another's (offset 5,000)."""
    memory = replace(_learn_days(2), idle=IdleState(active_at=10.0, zero_since=20.0))
    data = json.loads(json.dumps(dump_zero(FORECAST, memory, 1_000.0)))
    back = load_zero(FORECAST, data, 5_000.0)
    assert back.forecast == memory.forecast
    # At zero since the same wall time; the idle timer of an awake pool restarts.
    assert back.idle == IdleState(active_at=None, zero_since=20.0 + 1_000.0 - 5_000.0)
    assert zero_persist_key(back) == zero_persist_key(memory)
    assert load_zero(FORECAST, "garbage", 0.0) == ZeroMemory()
    assert load_zero(FORECAST, {"forecast": "{", "zeroSince": "x"}, 0.0) == ZeroMemory()


def test_status_keeps_the_zero_memory_and_events_name_zero() -> None:
    policy = ScalingPolicy(min_replicas=0, max_replicas=4)
    memory = ZeroMemory(idle=IdleState(zero_since=5.0))
    stored = autoscaler_status(
        policy,
        (PoolName.PRIMARY,),
        ScalerState(desired_serving=0),
        100.0,
        1_000.0,
        dump_zero(FORECAST, memory, 900.0),
    )
    assert load_zero(FORECAST, stored_zero_memory(stored), 900.0) == memory
    assert stored_zero_memory(None) is None
    scaler, idle = ScalerState(desired_serving=1), IdleState(0.0)
    down, _, _ = decide_scale_zero(
        POLICY, ZERO, obs(400.0, 1), scaler, IdleSignals(400.0, False), idle
    )
    event = scale_event(PoolName.PRIMARY, 1, down)
    assert event is not None and event[:2] == ("Normal", "ScaledToZero"), event
    up, _, _ = decide_scale_zero(
        POLICY,
        ZERO,
        obs(500.0, 0),
        ScalerState(desired_serving=0),
        IdleSignals(500.0, False, held=1),
        IdleState(0.0, 400.0),
    )
    event = scale_event(PoolName.PRIMARY, 0, up)
    assert event is not None and event[:2] == ("Normal", "ScaledFromZero"), event


def test_a_replica_still_starting_is_not_idle() -> None:
    """Woken (or new) and still warming for longer than the idle window: not sent to zero."""
    scaler, idle = ScalerState(desired_serving=1), IdleState(active_at=0.0)
    warming = Observation(now=1000.0, ready_serving=0, warming=1, queue_depth=0.0)
    sig = IdleSignals(1000.0, active=False)
    decision, _, idle = decide_scale_zero(POLICY, ZERO, warming, scaler, sig, idle)
    assert decision.desired_serving == 1 and idle.active_at == 1000.0, decision


# ------------------------------------------------------------------------------------------
# Quiet pools: ticked on events and a slow timer.


@pytest.mark.parametrize(
    ("change", "quiet"),
    [
        ({}, True),
        ({"arrival_rate": 0.5}, False),  # traffic
        ({"queue_depth": 1.0}, False),
        ({"queue_depth": None}, False),  # metrics missing: not known to be quiet
        ({"metrics_age_seconds": 30.0}, False),  # stale
        ({"warming": 1}, False),  # a replica beyond the one asked for, on its way
        ({"pending_unschedulable": 1}, False),
    ],
)
def test_quiet_pool_table(change: dict[str, Any], quiet: bool) -> None:
    fields: dict[str, Any] = {"queue_depth": 0.0, "arrival_rate": 0.0, **change}
    o = Observation(now=10_000.0, ready_serving=1, **fields)
    policy = ScalingPolicy(min_replicas=1, max_replicas=8)
    decision, _ = decide_scale(policy, o, ScalerState(desired_serving=1))
    assert is_quiet(decision, o, policy.max_metrics_age_seconds) is quiet, (decision, o)


@pytest.mark.parametrize(
    ("ready", "warming", "quiet"),
    [
        (0, 0, True),  # a new service: its children not written yet (their events wake it)
        (0, 2, True),  # both replicas warming, nothing can be served yet
        (1, 1, True),
        (2, 0, True),
        (2, 1, False),  # a replica beyond those asked for (a rollout's surge): under way
        (3, 0, False),  # one to remove
    ],
)
def test_replicas_on_their_way_leave_a_pool_without_traffic_quiet(
    ready: int, warming: int, quiet: bool
) -> None:
    o = Observation(
        now=10.0, ready_serving=ready, warming=warming, queue_depth=0.0, arrival_rate=0.0
    )
    policy = ScalingPolicy(min_replicas=2, max_replicas=2)
    decision, _ = decide_scale(policy, o, ScalerState(desired_serving=2))
    assert decision.desired_serving == 2, decision
    assert is_quiet(decision, o, policy.max_metrics_age_seconds) is quiet, (decision, o)


def test_pending_scale_down_is_not_quiet_an_idle_timer_and_zero_are() -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=8, scale_down_delay_seconds=60.0)
    o = obs(10_000.0, 3)
    decision, _ = decide_scale(policy, o, ScalerState(desired_serving=3))
    assert decision.reason == "wait:scale-down-delay" and not is_quiet(decision, o, 5.0)
    waiting, _, _ = decide_scale_zero(
        POLICY,
        ZERO,
        obs(100.0, 1),
        ScalerState(desired_serving=1),
        IdleSignals(100.0, False),
        IdleState(active_at=0.0),
    )
    # The idle timer towards zero runs on the slow tick: late by at most its period.
    assert REASON_WAIT_ZERO in waiting.notes and is_quiet(waiting, obs(100.0, 1), 5.0), waiting
    at_zero, _, _ = decide_scale_zero(
        POLICY,
        ZERO,
        obs(900.0, 0),
        ScalerState(desired_serving=0),
        IdleSignals(900.0, False),
        IdleState(0.0, 400.0),
    )
    assert at_zero.reason == REASON_AT_ZERO and is_quiet(at_zero, obs(900.0, 0), 5.0)
