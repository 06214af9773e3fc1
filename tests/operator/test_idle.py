"""Scale to zero and wake ahead (``core.idle``): tables and properties with injected time."""

from __future__ import annotations

import functools
import json
import random
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
    FIRST_READY_WAIT_SECONDS,
    REASON_AT_ZERO,
    REASON_BUSY,
    REASON_HOLD_FORECAST,
    REASON_WAIT_FIRST_READY,
    REASON_WAIT_ZERO,
    REASON_WAKE_FORECAST,
    REASON_WAKE_REQUEST,
    REASON_ZERO_IDLE,
    REASON_ZERO_QUIET,
    REFUTE_PROBABILITY,
    IdleSignals,
    IdleState,
    ZeroMemory,
    ZeroPolicy,
    ZeroTick,
    count_arrivals,
    decide_scale_zero,
    decide_zero,
    dump_zero,
    forecast_peak,
    forecast_quiet_peak,
    hold_until_served,
    idle_window,
    is_quiet,
    learn_demand,
    load_zero,
    poisson_at_most,
    quick_zero_pays,
    step_zero,
    wake_lead,
    zero_cost,
    zero_persist_key,
)

ZERO = ZeroPolicy(after_seconds=300.0, wake_margin_seconds=30.0)
WAKE = ZERO.wake_threshold  # 1 request per 300 s


def _quiet(now: float, quiet: float | None = 0.0, lead: float | None = 90.0) -> IdleSignals:
    """An idle tick where the forecast (by default) vouches that the window is empty."""
    return IdleSignals(now, active=False, forecast_rate=0.0, quiet_rate=quiet, lead_seconds=lead)


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
        # The forecast vouches that the idle window is empty: zero after the wake lead.
        (False, IdleState(active_at=0.0), _quiet(89.0), 1, REASON_WAIT_ZERO),
        (False, IdleState(active_at=0.0), _quiet(90.0), 0, REASON_ZERO_QUIET),
        # ... not while a request is seen, held, or the forecast is due within the lead.
        (False, IdleState(active_at=0.0), replace(_quiet(200.0), active=True), 1, REASON_BUSY),
        (False, IdleState(active_at=0.0), replace(_quiet(200.0), held=1), 1, REASON_BUSY),
        (
            False,
            IdleState(active_at=0.0),
            replace(_quiet(200.0), forecast_rate=WAKE),
            1,
            REASON_HOLD_FORECAST,
        ),
        # A forecast that expects a request in the window, or does not vouch: after_seconds.
        (False, IdleState(active_at=0.0), _quiet(200.0, quiet=WAKE), 1, REASON_WAIT_ZERO),
        (False, IdleState(active_at=0.0), _quiet(200.0, quiet=None), 1, REASON_WAIT_ZERO),
        (False, IdleState(active_at=0.0), _quiet(300.0, quiet=None), 0, REASON_ZERO_IDLE),
        # A wake lead longer than after_seconds: after_seconds is the longest idle window.
        (False, IdleState(active_at=0.0), _quiet(300.0, lead=900.0), 0, REASON_ZERO_IDLE),
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


def test_idle_window_is_the_wake_lead_only_where_the_forecast_vouches_for_quiet() -> None:
    assert idle_window(ZERO, _quiet(0.0)) == 90.0
    # Below one request per GPU-hour (the default price of a late request): zero pays.
    assert idle_window(ZERO, _quiet(0.0, quiet=0.9 / 3600)) == 90.0
    # Issue 45: two requests an hour (and the old threshold's half) keep the timer.
    assert idle_window(ZERO, _quiet(0.0, quiet=2 / 3600)) == 300.0
    assert idle_window(ZERO, _quiet(0.0, quiet=WAKE / 2)) == 300.0
    assert idle_window(ZERO, _quiet(0.0, quiet=WAKE)) == 300.0
    assert idle_window(ZERO, _quiet(0.0, quiet=None)) == 300.0
    # No lead measured: the default time-to-routable + margin.
    assert idle_window(ZERO, _quiet(0.0, lead=None)) == ZERO.default_routable_seconds + 30.0
    with pytest.raises(ValueError, match="quiet_rate"):
        IdleSignals(0.0, active=False, quiet_rate=-1.0)
    with pytest.raises(ValueError, match="lead_seconds"):
        IdleSignals(0.0, active=False, lead_seconds=float("inf"))


@pytest.mark.parametrize(
    ("rate", "window", "price", "pays"),
    [
        (0.0, 210.0, 3600.0, True),  # nothing expected: every second saved is free
        (0.5 / 3600, 210.0, 3600.0, True),  # a request every two hours
        (0.99 / 3600, 210.0, 3600.0, True),
        (1.01 / 3600, 210.0, 3600.0, False),
        (2 / 3600, 210.0, 3600.0, False),  # issue 45's sparse night
        (2 / 3600, 5.0, 3600.0, False),  # ... whatever the window left
        (2 / 3600, 210.0, 1000.0, True),  # a user who prices GPU time over lateness
        (1 / 300, 210.0, 300.0, False),  # the old rule: one request per after_seconds
        (1 / 400, 210.0, 300.0, True),
        (0.5 / 3600, 0.0, 3600.0, False),  # no window left: nothing to save
    ],
)
def test_quick_zero_pays_on_expected_cost(
    rate: float, window: float, price: float, pays: bool
) -> None:
    cost = zero_cost(rate, window)
    policy = ZeroPolicy(after_seconds=300.0, late_request_gpu_seconds=price)
    assert quick_zero_pays(rate, window, policy) is pays, (cost, price)


@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=86_400.0),
)
def test_zero_cost_is_bounded_by_the_window(rate: float, window: float) -> None:
    cost = zero_cost(rate, window)
    assert 0.0 <= cost.gpu_seconds_saved <= window + 1e-9, cost
    assert 0.0 <= cost.late_requests <= min(1.0, rate * window) + 1e-9, cost


def test_late_request_price_must_be_positive() -> None:
    with pytest.raises(ValueError, match="late_request_gpu_seconds"):
        ZeroPolicy(late_request_gpu_seconds=0.0)


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


def test_burst_held_at_zero_wakes_at_once() -> None:
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
    st.sampled_from([None, None, 0.0, WAKE / 10, WAKE]),  # its peak over the idle window
    st.sampled_from([None, 5.0, 90.0, 400.0]),  # the wake lead
)

Tick = tuple[float, bool | None, int, float | None, float | None, float | None]


def _run(trace: list[Tick]) -> list[tuple[float, int, str, IdleSignals]]:
    scaler, idle = ScalerState(desired_serving=1), IdleState()
    now, out = 0.0, []
    for dt, active, held, forecast, quiet, lead in trace:
        now += dt
        ready = 0 if scaler.desired_serving == 0 else 1
        rate = 1.0 if active else 0.0
        o = Observation(now=now, ready_serving=ready, queue_depth=0.0, arrival_rate=rate)
        sig = IdleSignals(now, active, held, forecast, quiet_rate=quiet, lead_seconds=lead)
        decision, scaler, idle = decide_scale_zero(POLICY, ZERO, o, scaler, sig, idle)
        out.append((now, decision.desired_serving, decision.reason, sig))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(tick, min_size=1, max_size=80))
def test_never_zero_while_a_request_is_held_or_forecast_demand_is_due(trace: list[Tick]) -> None:
    for now, desired, reason, sig in _run(trace):
        due = sig.forecast_rate is not None and sig.forecast_rate >= WAKE
        if sig.held > 0 or due or sig.active:
            assert desired >= 1, (now, desired, reason, sig)


@settings(max_examples=200, deadline=None)
@given(st.lists(tick, min_size=1, max_size=80))
def test_never_flaps_between_zero_and_one(trace: list[Tick]) -> None:
    """Once up from zero, a pool stays up at least `after_seconds`, or the wake lead where the
    forecast vouches that the window is empty (and only then); at zero it only leaves on a
    request or a due forecast."""
    out = _run(trace)
    up_since: float | None = None
    prev = 1
    for now, desired, reason, sig in out:
        if prev == 0 and desired > 0:
            assert reason in (REASON_WAKE_REQUEST, REASON_WAKE_FORECAST) or sig.held > 0, reason
            up_since = now
        if prev > 0 and desired == 0:
            if reason == REASON_ZERO_QUIET:
                assert sig.quiet_rate is not None, (now, sig)
                assert sig.quiet_rate < 1 / ZERO.late_request_gpu_seconds, (now, sig)
                dwell = min(ZERO.after_seconds, idle_window(ZERO, sig))
            else:
                assert reason == REASON_ZERO_IDLE, (now, reason)
                dwell = ZERO.after_seconds
            if up_since is not None:
                assert now - up_since >= dwell, (now, up_since, reason, sig)
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


@functools.lru_cache(maxsize=8)
def _learn_days(days: int) -> ZeroMemory:  # (frozen: safe to share between tests)
    memory = ZeroMemory()
    t = 0.0
    while t < days * DAY:
        memory = learn_demand(FORECAST, memory, _morning(t - 60.0) * 60.0, t)
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


def test_quiet_is_vouched_only_for_learned_hours_and_one_bucket_ahead_of_a_rise() -> None:
    # One day learned: no bucket trusted yet, so nothing is known to be quiet.
    assert forecast_quiet_peak(FORECAST, _learn_days(1), 1 * DAY + 3 * 3600.0, 300.0) is None
    assert forecast_quiet_peak(FORECAST, ZeroMemory(), 0.0, 300.0) is None
    memory = _learn_days(3)
    night = 3 * DAY + 3 * 3600.0
    quiet = forecast_quiet_peak(FORECAST, memory, night, 300.0)
    assert quiet is not None and quiet < WAKE, quiet
    # The evening's fall: quiet once the busy buckets are behind.
    evening = 3 * DAY + 17 * 3600.0 + 60.0
    quiet = forecast_quiet_peak(FORECAST, memory, evening, 300.0)
    assert quiet is not None and quiet < WAKE, quiet
    # 20 minutes before the rise: the idle window (5 min) misses it, the bucket to spare
    # (the profile's resolution, 15 min) does not, so no quick zero there.
    rise = 3 * DAY + 9 * 3600.0
    near = forecast_quiet_peak(FORECAST, memory, rise - 20 * 60.0, 300.0)
    assert near is not None and near >= WAKE, near
    far = forecast_quiet_peak(FORECAST, memory, rise - 40 * 60.0, 300.0)
    assert far is not None and far < WAKE, far


def test_a_night_wake_goes_back_to_zero_after_the_lead_a_day_one_after_the_full_window() -> None:
    """A pool woken by a night request: quiet learned hours, zero after the wake lead; an
    hour not learned (a new service): the full `after_seconds`."""
    lead = wake_lead(ZERO, 40.0)
    for memory, window in ((_learn_days(3), lead), (_learn_days(1), ZERO.after_seconds)):
        base = (3 if window == lead else 1) * DAY + 3 * 3600.0
        idle = IdleState(active_at=base)
        t, zero_at = base, None
        while zero_at is None and t < base + 1000.0:
            t += 5.0
            sig = IdleSignals(
                t,
                active=False,
                forecast_rate=forecast_peak(FORECAST, memory, t, lead),
                quiet_rate=forecast_quiet_peak(FORECAST, memory, t, ZERO.after_seconds),
                lead_seconds=lead,
            )
            verdict, idle = decide_zero(ZERO, sig, idle, at_zero=False)
            if verdict.to_zero:
                zero_at = t
        assert zero_at is not None and window <= zero_at - base < window + 5.0, (zero_at, window)


def _rise_at(minutes_after_nine: float) -> Any:
    def rate(t: float) -> float:
        hour = (t % DAY) / 3600.0
        return 5.0 if 9.0 + minutes_after_nine / 60.0 <= hour < 17.0 else 0.0

    return rate


def _learn(memory: ZeroMemory, start: float, end: float, rate: Any, step: float) -> ZeroMemory:
    t = start
    while t < end:
        memory = learn_demand(FORECAST, memory, rate(t - step) * step, t, WAKE)
        t += step
    return memory


def test_a_day_without_the_usual_rise_refutes_the_forecast_until_the_busy_hours_end() -> None:
    """A weekend under a weekday profile: the usual rate holds the pool up to the rise,
    then the first seconds past it with no request refute it (the forecast says nothing,
    requests still wake the pool), and the evening's quiet buckets restore it."""
    memory = _learn(ZeroMemory(), 0.0, 3 * DAY, _morning, 60.0)
    lead = wake_lead(ZERO, 40.0)
    sat = 3 * DAY
    rise = sat + 9 * 3600.0
    quiet = _learn(memory, sat, rise, lambda t: 0.0, 5.0)
    assert not quiet.refuted
    peak = forecast_peak(FORECAST, quiet, rise - 5.0, lead)
    assert peak is not None and peak >= WAKE, peak  # the rise is due
    # The 9:00 bucket is the first learned at the day's peak (5 req/s): a day may rise late
    # within it. From 9:15 on (it and the one before at the peak) ten seconds with no request
    # are 50 expected, none seen: refuted at once, not when a bucket closes.
    quiet = _learn(quiet, rise, rise + 900.0, lambda t: 0.0, 5.0)
    assert not quiet.refuted, quiet.evidence
    quiet = _learn(quiet, rise + 900.0, rise + 915.0, lambda t: 0.0, 5.0)
    assert quiet.refuted, quiet.evidence
    assert forecast_peak(FORECAST, quiet, rise + 915.0, lead) is None
    # One sporadic request (a bucket well under the wake rate) does not end it ...
    lone = _learn(quiet, rise + 915.0, sat + 12 * 3600.0, _one_request(sat + 10 * 3600), 5.0)
    assert lone.refuted
    # ... the usual busy hours' end does; the next morning the forecast wakes the pool again.
    night = _learn(lone, sat + 12 * 3600.0, sat + 17.5 * 3600.0, lambda t: 0.0, 5.0)
    assert not night.refuted
    sun = _learn(night, sat + 17.5 * 3600.0, sat + DAY + 9 * 3600.0 - lead, lambda t: 0.0, 60.0)
    peak = forecast_peak(FORECAST, sun, sat + DAY + 9 * 3600.0 - lead + 1.0, lead)
    assert peak is not None and peak >= WAKE, peak


def _one_request(at: float) -> Any:
    return lambda t: 0.2 if at <= t < at + 5.0 else 0.0


def test_a_rise_late_within_the_learned_spread_is_not_refuted_and_demand_clears_it() -> None:
    """Learned rises at 9:00 and 9:20: the 9:00 bucket is learned less busy than the next, so
    a day whose rise is at 9:20 again does not refute the forecast when it closes empty."""
    memory = ZeroMemory()
    for d in range(4):
        memory = _learn(memory, d * DAY, (d + 1) * DAY, _rise_at(0.0 if d % 2 else 20.0), 60.0)
    day = 4 * DAY
    late = _rise_at(20.0)
    memory = _learn(memory, day, day + 9 * 3600.0 + 16 * 60.0, late, 5.0)
    assert not memory.refuted
    peak = forecast_peak(FORECAST, memory, day + 9 * 3600.0 + 16 * 60.0, wake_lead(ZERO, 40.0))
    assert peak is not None and peak >= WAKE, peak
    # A refuted forecast is cleared by a bucket of demand at the wake rate or more.
    refuted = replace(memory, refuted=True)
    back = _learn(refuted, day + 9 * 3600.0 + 16 * 60.0, day + 9 * 3600.0 + 31 * 60.0, late, 5.0)
    assert not back.refuted


def test_recent_early_rises_do_not_make_the_rising_edge_refute_a_late_day() -> None:
    """Three days rising at 9:20, then two at 8:45 and 8:35: the 8:45 and 9:00 buckets are
    learned alike (as flat as a plateau) but well under the day's peak, so a day rising at
    9:25 keeps the forecast through its empty 8:45 and 9:00 buckets."""
    memory = ZeroMemory()
    for d, minutes in enumerate((20.0, 20.0, 20.0, -15.0, -25.0)):
        memory = _learn(memory, d * DAY, (d + 1) * DAY, _rise_at(minutes), 60.0)
    day = 5 * DAY
    memory = _learn(memory, day, day + 9 * 3600.0 + 16 * 60.0, _rise_at(25.0), 5.0)
    assert not memory.refuted
    peak = forecast_peak(FORECAST, memory, day + 9 * 3600.0 + 16 * 60.0, wake_lead(ZERO, 40.0))
    assert peak is not None and peak >= WAKE, peak


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.5, max_value=2000.0), st.sampled_from([0, 0, 0, 1, 40])),
        min_size=1,
        max_size=200,
    )
)
def test_refuted_only_on_improbably_few_requests_and_never_in_usual_quiet_hours(
    reports: list[tuple[float, int]],
) -> None:
    """Over any sequence of counts after three learned days: `refuted` turns on only when the
    requests seen since the usual rise are fewer than the wake rate brings and at most 1 %
    likely under the usual rate, and is never on in a trusted bucket learned quiet."""
    memory = _learn_days(3)
    t = 3 * DAY
    for dt, count in reports:
        t += dt
        before = memory
        memory = learn_demand(FORECAST, memory, float(count), t, WAKE)
        expected, seen, span, _ = memory.evidence
        if memory.refuted and not before.refuted:
            assert seen < WAKE * span, memory.evidence
            assert poisson_at_most(seen, expected) <= REFUTE_PROBABILITY, memory.evidence
        f = memory.forecast
        assert f is not None
        slot = f.open_slot % FORECAST.slots
        if f.counts[slot] >= FORECAST.profile_min_periods and f.profile[slot] < WAKE:
            assert not memory.refuted, (t, slot)
        # Without a wake rate nothing is refuted.
        assert not learn_demand(FORECAST, before, float(count), t).refuted


def test_poisson_at_most() -> None:
    assert poisson_at_most(0, 4.6) == pytest.approx(0.01, rel=0.01)
    assert poisson_at_most(2, 2.0) == pytest.approx(5 * 2.718281828**-2)
    assert poisson_at_most(3, 0.0) == 1.0 and poisson_at_most(1e9, 5.0) == 1.0
    # A busy bucket's thousands (e^-1835 underflows: summed in log space).
    assert poisson_at_most(3000, 1835.0) == 1.0 and poisson_at_most(1500, 1835.0) < 1e-10


def _counted(times: list[float], calls: list[float], wake: float | None = None) -> ZeroMemory:
    """`learn_demand` called at `calls` with the arrivals among `times` since the last call
    (what `count_arrivals` makes of the gateway's cumulative count)."""
    memory, done = ZeroMemory(), 0
    for at in sorted(calls):
        now = sum(1 for x in times if x <= at)
        memory = learn_demand(FORECAST, memory, float(now - done), at, wake)
        done = now
    return memory


def test_every_arrival_is_learned_once_whatever_the_cadence_of_the_calls() -> None:
    """The issue's sparse evening (60 requests over 17:00-19:00): under the quiet loop each
    request's tick is a poke a fraction of a second after a slow tick, and one rate sample per
    5 s dropped it (1 of 1,407 samples above zero). Counted, every request lands in the
    learned rate of its bucket, for the quiet loop's cadence and for a 60 s one alike."""
    rng = random.Random(7)
    start = 17 * 3600.0
    times = sorted(start + rng.uniform(0.0, 7200.0) for _ in range(60))
    quiet_loop = [start + 5.0 * k for k in range(1 + 9000 // 5)] + [x + 0.3 for x in times]
    slow = [start + 60.0 * k for k in range(1 + 9000 // 60)]
    width = FORECAST.slot_seconds
    first = int(start // width)
    for calls in (quiet_loop, slow):
        memory = _counted(times, calls)
        f = memory.forecast
        assert f is not None
        learned = [f.profile[first + k] * width for k in range(8)]
        truth = [sum(1 for x in times if start + k * width <= x < start + (k + 1) * width)
                 for k in range(8)]  # fmt: skip
        # Each bucket within one request of the truth (a request reported after its bucket
        # ended is spread over the call's interval), the two hours' total exact.
        assert all(abs(a - b) <= 1.0 for a, b in zip(learned, truth, strict=True)), (
            learned,
            truth,
        )
        assert sum(f.profile[first + k] * width for k in range(9)) == pytest.approx(60, rel=2e-3)


def test_count_arrivals_takes_each_gateway_pods_growth_and_survives_restarts() -> None:
    seen, new = count_arrivals((), {"gw-a": 500})
    assert new == 0  # a pod seen first is the baseline, not 500 arrivals now
    seen, new = count_arrivals(seen, {"gw-a": 503, "gw-b": 7})
    assert new == 3
    seen, new = count_arrivals(seen, {"gw-a": 2, "gw-b": 9})  # gw-a restarted
    assert new == 4 and dict(seen) == {"gw-a": 2, "gw-b": 9}
    seen, new = count_arrivals(seen, {"gw-b": 9})
    assert new == 0 and dict(seen) == {"gw-b": 9}


def test_learn_demand_carries_what_is_too_short_for_a_sample_and_keeps_unknown_counts() -> None:
    m0 = learn_demand(FORECAST, ZeroMemory(), 0.0, 100.0)
    assert m0.counted_to == 100.0 and m0.forecast is None
    m1 = learn_demand(FORECAST, m0, 2.0, 101.0)  # too short for a sample: carried
    assert m1.forecast is None and m1.uncounted == 2.0
    assert learn_demand(FORECAST, m1, None, 200.0) is m1  # unknown: the next count covers it
    m2 = learn_demand(FORECAST, m1, 1.0, 107.5)  # one 5 s sample, half an interval carried
    assert m2.counted_to == 105.0 and m2.forecast is not None
    assert m2.forecast.open_sum * 5.0 + m2.uncounted == pytest.approx(3.0)


def test_a_request_that_wakes_the_pool_from_zero_is_learned() -> None:
    """At zero, the request the gateway holds wakes the pool and is in its arrival count:
    the glue (`step_zero`) counts it, so the bucket learns it."""
    zero = ZeroPolicy(after_seconds=300.0)
    memory = ZeroMemory(idle=IdleState(0.0, 300.0))
    scaler = ScalerState(desired_serving=0)
    t0 = 10 * 900.0

    def tick(t: float, held: int, count: int) -> Any:
        observation = Observation(now=t, ready_serving=0, queue_depth=0.0, arrival_rate=0.0)
        return ZeroTick(t, t, observation, held=held, arrivals={"gw": count})

    step = step_zero(POLICY, zero, FORECAST, memory, scaler, tick(t0, 0, 0))
    step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 5.0, 0, 0))
    step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 7.2, 1, 1))
    assert step.decision.desired_serving == 1 and step.decision.reason == REASON_WAKE_REQUEST
    for k in range(2, 183):  # the loop ticks on (every 5 s) into the next bucket
        step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 5.0 * k, 0, 1))
    f = step.memory.forecast
    assert f is not None
    assert f.profile[10] * 900.0 == pytest.approx(1.0, rel=1e-3), f.profile[10]


def test_first_wake_is_sized_by_the_held_requests_rate_not_held_over_the_queue_target() -> None:
    """A service's first wake, nothing learned: 23 requests held while its first replica
    starts are a burst one replica serves (the issue: held / 4 asked for 6 replicas)."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, fallback_queue_depth=4.0)
    scaler, idle = ScalerState(desired_serving=0), IdleState(0.0, 300.0)
    sizes = []
    for k, held in enumerate((1, 5, 12, 23)):
        t = 1000.0 + 15.0 * k
        ready = Observation(now=t, ready_serving=0, warming=1 if k else 0, queue_depth=0.0)
        sig = IdleSignals(t, active=False, held=held, lead_seconds=90.0)
        decision, scaler, idle = decide_scale_zero(policy, ZERO, ready, scaler, sig, idle)
        sizes.append(decision.desired_serving)
    assert sizes == [1, 1, 1, 1], sizes


def test_a_known_capacity_sizes_a_wake_by_the_held_rate() -> None:
    """With a learned per-request time the held rate (held / the wake lead) is served at the
    target: 90 held over a 90 s lead is 1 req/s; at 1.4 s a request and a target queue of 1
    a replica serves ~0.71 req/s, so two replicas."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=8, target_queue_depth=1.0)
    scaler = ScalerState(desired_serving=0, seconds_per_request=1.4)
    sig = IdleSignals(1000.0, active=False, held=90, lead_seconds=90.0)
    observation = Observation(now=1000.0, ready_serving=0, queue_depth=0.0)
    decision, _, _ = decide_scale_zero(
        policy, ZERO, observation, scaler, sig, IdleState(0.0, 300.0)
    )
    assert decision.desired_serving == 2, decision


def test_a_stray_request_in_every_bucket_does_not_hold_off_the_refutation() -> None:
    """A weekend day with one sporadic request every ten minutes (0.0017 req/s, under the wake
    rate) under a 5 req/s weekday profile: far fewer than usual, so refuted by 9:15 and a
    bit; a rule that needs a bucket with no request at all never refutes it."""
    memory = _learn(ZeroMemory(), 0.0, 3 * DAY, _morning, 60.0)
    sat = 3 * DAY
    rise = sat + 9 * 3600.0

    def stray(t: float) -> float:
        return 1.0 / 5.0 if int(t) % 600 < 5 else 0.0  # one request in a 5 s step

    memory = _learn(memory, sat, rise + 1200.0, stray, 5.0)
    assert memory.refuted, memory.evidence


def test_sparse_weekend_demand_does_not_restore_a_refuted_forecast() -> None:
    """A weekend's late morning at 40 requests an hour (0.011 req/s: above the wake rate,
    far under the weekday's 5 req/s): its buckets do not bring the usual demand back, so the
    refuted forecast stays refuted and holds no replica for those hours."""
    memory = _learn(ZeroMemory(), 0.0, 3 * DAY, _morning, 60.0)
    sat = 3 * DAY
    memory = _learn(memory, sat, sat + 9.5 * 3600.0, lambda t: 0.0, 5.0)
    assert memory.refuted, memory.evidence

    def brunch(t: float) -> float:
        return 1.0 / 5.0 if int(t) % 90 < 5 else 0.0  # a request every 90 s

    memory = _learn(memory, sat + 9.5 * 3600.0, sat + 11 * 3600.0, brunch, 5.0)
    assert memory.refuted, memory.evidence


def test_evidence_accumulates_across_buckets_too_quiet_to_refute_alone() -> None:
    """A service whose busy hours bring 0.003 req/s (2.7 requests a bucket, under the old
    rule's 3 for one bucket) learned over three days: on a day without them, the evidence of
    consecutive empty buckets adds up and refutes (4.6 expected from 9:15, none seen: 9:40)."""
    wake = 0.002

    def usual(t: float) -> float:
        hour = (t % DAY) / 3600.0
        return 0.003 if 9.0 <= hour < 13.0 else 0.0

    memory = ZeroMemory()
    t = 0.0
    while t < 3 * DAY:
        memory = learn_demand(FORECAST, memory, usual(t) * 60.0, t + 60.0, wake)
        t += 60.0
    rise = 3 * DAY + 9 * 3600.0
    t, refuted_at = 3 * DAY, None
    while t < rise + 3600.0 and refuted_at is None:
        t += 5.0
        memory = learn_demand(FORECAST, memory, 0.0, t, wake)
        if memory.refuted:
            refuted_at = t
    assert refuted_at is not None and 900.0 <= refuted_at - rise <= 2700.0, (refuted_at, rise)


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
        # The rate unknown (a pod's counters just reset): looked at again next tick, not on the
        # slow one, which would find it moved and write the status in a quiet minute.
        ({"arrival_rate": None}, False),
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


@pytest.mark.parametrize(
    ("served", "waited", "serving", "reason"),
    [
        (False, 2.0, 1, REASON_WAIT_FIRST_READY),  # issue 31: not to zero 2 s after creation
        (False, FIRST_READY_WAIT_SECONDS - 1, 1, REASON_WAIT_FIRST_READY),
        (False, FIRST_READY_WAIT_SECONDS, 0, REASON_ZERO_IDLE),  # a broken service lets go
        (True, 2.0, 0, REASON_ZERO_IDLE),  # once a replica was Ready, zero as decided
    ],
)
def test_a_new_service_keeps_its_first_replica_until_one_was_ready(
    served: bool, waited: float, serving: int, reason: str
) -> None:
    """scaleToZeroAfterSeconds 0: the idle verdict says zero at once; until a replica has
    been Ready (or the wait is over) the first one stays, and the next tick decides again."""
    zero = ZeroPolicy(after_seconds=0.0, wake_margin_seconds=30.0)
    idle = IdleState(active_at=0.0)
    scaler = ScalerState(desired_serving=1)
    decision, new_scaler, idle = decide_scale_zero(
        POLICY, zero, obs(2.0, 1), scaler, IdleSignals(2.0, False), idle
    )
    assert (decision.desired_serving, decision.reason) == (0, REASON_ZERO_IDLE)
    held, kept = hold_until_served(decision, new_scaler, served, waited)
    assert (held.desired_serving, held.reason) == (serving, reason)
    assert kept.desired_serving == serving
    if serving:  # not "at zero" next tick: the verdict is asked again, not a wake
        again, _, _ = decide_scale_zero(
            POLICY, zero, obs(3.0, 1), kept, IdleSignals(3.0, False), idle
        )
        assert again.desired_serving == 0 and again.reason == REASON_ZERO_IDLE


def test_a_service_that_wants_replicas_is_never_held_back() -> None:
    held = IdleSignals(5.0, False, held=3)  # requests held at zero: a wake
    at_zero = ScalerState(desired_serving=0)
    decision, scaler, _ = decide_scale_zero(POLICY, ZERO, obs(5.0, 0), at_zero, held, IdleState())
    assert decision.desired_serving >= 1
    assert hold_until_served(decision, scaler, False, 1.0) == (decision, scaler)


def test_counts_are_learned_up_to_when_they_were_read_not_up_to_the_tick() -> None:
    """The gateway's long-poll answers at a change of the held count, else every 25 s: the
    ticks in between know nothing yet of the arrivals since its last answer and must not
    learn that interval as empty (a 10-request burst would be learned 25 s late)."""
    zero = ZeroPolicy(after_seconds=300.0)
    memory, scaler = ZeroMemory(), ScalerState(desired_serving=1)
    t0 = 100 * 900.0

    def tick(t: float, count: int, read_at: float) -> Any:
        observation = Observation(now=t, ready_serving=1, queue_depth=0.0, arrival_rate=0.0)
        return ZeroTick(t, t, observation, arrivals={"gw": count}, arrivals_at=read_at)

    step = step_zero(POLICY, zero, FORECAST, memory, scaler, tick(t0, 0, t0))
    step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 1.0, 0, t0))
    for k in range(2, 25):
        step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + k, 0, t0))
    assert step.memory.counted_to == t0 and step.memory.forecast is None, step.memory
    step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 25, 10, t0 + 25))
    f = step.memory.forecast
    assert f is not None and f.open_n == 5 and f.open_sum * 5.0 == pytest.approx(10.0), f


def test_arrivals_reported_late_at_zero_do_not_wake_the_pool() -> None:
    """The gateway's long-poll reports its arrival count up to 25 s late: requests forwarded
    just before the pool went to zero arrive in a count read at zero, with nothing held. They
    are learned, but do not wake the pool (on the real node each scale to zero was followed
    by a `wake:request` with no request held)."""
    zero = ZeroPolicy(after_seconds=8.0)
    t0 = 10 * 900.0

    def tick(t: float, count: int, ready: int) -> Any:
        observation = Observation(now=t, ready_serving=ready, queue_depth=0.0, arrival_rate=0.0)
        return ZeroTick(t, t, observation, held=0, arrivals={"gw": count}, arrivals_at=t)

    at_zero = ZeroMemory(idle=IdleState(0.0, 8.0))
    step = step_zero(
        POLICY, zero, FORECAST, at_zero, ScalerState(desired_serving=0), tick(t0, 0, 0)
    )
    step = step_zero(POLICY, zero, FORECAST, step.memory, step.scaler, tick(t0 + 1.0, 12, 0))
    assert step.decision.desired_serving == 0, step.decision


@pytest.mark.parametrize(
    ("served", "waited", "serving", "reason"),
    [
        (False, 2.0, 1, REASON_WAIT_FIRST_READY),
        (False, FIRST_READY_WAIT_SECONDS, 0, REASON_ZERO_IDLE),
        (True, 2.0, 0, REASON_ZERO_IDLE),
    ],
)
def test_step_zero_keeps_the_first_replica_until_one_was_ready(
    served: bool, waited: float, serving: int, reason: str
) -> None:
    """The glue holds the idle verdict until the service has served (`hold_until_served`,
    from the tick's `served` and `waited_seconds`); the memory is the idle verdict's."""
    zero = ZeroPolicy(after_seconds=0.0, wake_margin_seconds=30.0)
    memory = ZeroMemory(idle=IdleState(active_at=0.0))
    scaler = ScalerState(desired_serving=1)
    tick = ZeroTick(2.0, 2.0, obs(2.0, 1))
    idle = step_zero(POLICY, zero, None, memory, scaler, tick)
    assert (idle.decision.desired_serving, idle.decision.reason) == (0, REASON_ZERO_IDLE)
    step = step_zero(
        POLICY, zero, None, memory, scaler, replace(tick, served=served, waited_seconds=waited)
    )
    assert (step.decision.desired_serving, step.decision.reason) == (serving, reason)
    assert step.scaler.desired_serving == serving
    assert (step.memory, step.wake_soon) == (idle.memory, idle.wake_soon)
