"""Per-model demand forecast: learned profile, short-term trend, persistence (time injected)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.forecast import (
    ForecastPolicy,
    ModelForecast,
    forecasts_from_json,
    forecasts_to_json,
    observe,
    observe_all,
    period_mean,
    predict,
    predict_peak,
)

DAY = 86400.0
HOUR = 3600.0
POLICY = ForecastPolicy()  # 96 slots of 15 min over a day, alphas per 5 s sample
STEP = 10.0  # seconds between samples in these tests


def office_hours(t: float) -> float:
    """100 req/s from 9:00 to 12:00 every day, 1 req/s otherwise."""
    hour = (t % DAY) / HOUR
    return 100.0 if 9 <= hour < 12 else 1.0


def run(
    state: ModelForecast | None,
    rate: Callable[[float], float],
    start: float,
    end: float,
    policy: ForecastPolicy = POLICY,
    step: float = STEP,
) -> ModelForecast:
    t = start
    while t < end:
        state = observe(policy, state, rate(t), t)
        t += step
    assert state is not None
    return state


@pytest.fixture(scope="module")
def learned() -> ModelForecast:
    """Three days of office hours, observed up to day 3, 00:00."""
    return run(None, office_hours, 0.0, 3 * DAY)


# ------------------------------------------------------------------------------------------
# Tables


def test_a_model_never_seen_is_forecast_at_zero() -> None:
    assert predict(POLICY, None, at=100.0, now=0.0) == 0.0
    assert predict_peak(POLICY, None, now=0.0, horizon_seconds=3600.0) == 0.0


def test_first_sample_sets_the_level() -> None:
    state = observe(POLICY, None, 12.0, 1000.0)
    assert state.level == 12.0
    assert state.trend == 0.0
    assert predict(POLICY, state, at=1000.0, now=1000.0) == 12.0
    assert len(state.profile) == POLICY.slots


def test_constant_rate_converges_to_that_rate() -> None:
    state = run(observe(POLICY, None, 500.0, 0.0), lambda t: 7.0, STEP, 2 * HOUR)
    assert state.level == pytest.approx(7.0, rel=1e-6)
    assert state.trend == pytest.approx(0.0, abs=1e-6)
    now = state.last_at
    assert predict(POLICY, state, at=now + 60.0, now=now) == pytest.approx(7.0, rel=1e-5)
    assert predict_peak(POLICY, state, now=now, horizon_seconds=600.0) == pytest.approx(
        7.0, rel=1e-3
    )


def test_daily_profile_predicts_the_rise_ahead_of_time(learned: ModelForecast) -> None:
    # Day 4 from midnight, live: the rate itself is still 1 req/s until 9:00.
    horizon = 90.0  # load time plus margin
    rise = 3 * DAY + 9 * HOUR
    state = run(learned, office_hours, 3 * DAY, rise - 120.0)
    early = predict_peak(POLICY, state, now=state.last_at, horizon_seconds=horizon)
    assert office_hours(state.last_at) == 1.0
    assert early == pytest.approx(1.0, abs=0.1), "no preload long before the rise"
    state = run(state, office_hours, rise - 120.0 + STEP / 2, rise - horizon + STEP)
    now = state.last_at
    assert now < rise and office_hours(now) == 1.0
    assert predict_peak(POLICY, state, now=now, horizon_seconds=horizon) >= 95.0
    # The point forecast sees it at 9:00, not before.
    assert predict(POLICY, state, at=rise - 1.0, now=now) == pytest.approx(1.0, abs=0.1)
    assert predict(POLICY, state, at=rise + 1.0, now=now) >= 95.0
    # And the fall at noon.
    state = run(state, office_hours, now + STEP, rise + 3 * HOUR - horizon + STEP)
    assert predict(POLICY, state, at=rise + 3 * HOUR + 1, now=state.last_at) < 10.0


def test_period_mean_is_the_days_average_lows_included(learned: ModelForecast) -> None:
    # 3 h at 100 req/s and 21 h at 1 req/s: 13.375 req/s a day, whatever the hour asked at.
    assert period_mean(learned) == pytest.approx((3 * 100 + 21 * 1) / 24, rel=0.02)
    low = predict_peak(POLICY, learned, 3 * DAY + 2 * HOUR, 60.0)
    assert low < 2.0 and period_mean(learned) > 6 * low


def test_period_mean_needs_a_whole_period_seen() -> None:
    # Half a day seen is no day to average: 0, not the mean of the busy half.
    assert period_mean(None) == 0.0
    assert period_mean(run(None, office_hours, 0.0, DAY / 2)) == 0.0
    almost = run(None, office_hours, 0.0, 0.95 * DAY)
    assert period_mean(almost) == pytest.approx((3 * 100 + 20 * 1) / 23, rel=0.05)


def test_after_a_restart_the_profile_alone_forecasts(learned: ModelForecast) -> None:
    # Saved at day 3, 00:00; the operator comes back at 9:30 on day 3 with no sample yet.
    text = forecasts_to_json(POLICY, {"m": learned})
    restored = forecasts_from_json(POLICY, text)["m"]
    now = 3 * DAY + 9.5 * HOUR
    assert predict(POLICY, restored, at=now, now=now) == pytest.approx(100.0, rel=0.01)
    assert predict(POLICY, restored, at=now + 3 * HOUR, now=now) == pytest.approx(1.0, rel=0.01)
    # The first sample after the gap restarts the short term from the rate seen.
    state = observe(POLICY, restored, 80.0, now)
    assert state.level == 80.0 and state.trend == 0.0


def test_a_slot_never_seen_falls_back_to_the_level() -> None:
    state = run(None, lambda t: 5.0, 0.0, 2 * HOUR)  # slots 0-7 of day 0 only
    now = state.last_at
    assert predict(POLICY, state, at=now + 6 * HOUR, now=now) == pytest.approx(5.0)
    assert predict(POLICY, state, at=now + 6 * HOUR, now=now + 6 * HOUR) == pytest.approx(5.0)


def test_a_slot_seen_once_is_half_trusted() -> None:
    # One day and an hour (default profile_min_periods = 2): every slot seen once.
    state = run(None, office_hours, 0.0, DAY + HOUR)
    now = state.last_at
    assert predict(POLICY, state, at=DAY + 9.5 * HOUR, now=now) == pytest.approx(50.5, rel=0.01)


def test_a_quieter_day_keeps_the_rise_additive(learned: ModelForecast) -> None:
    # Today at half the usual night rate: the forecast adds the usual rise to today's level.
    state = run(learned, lambda t: 0.5, 3 * DAY, 3 * DAY + 8.9 * HOUR)
    now = state.last_at
    peak = predict_peak(POLICY, state, now=now, horizon_seconds=0.2 * HOUR)
    assert peak == pytest.approx(99.5, rel=0.01)


def test_a_rising_model_is_extrapolated_within_bounds() -> None:
    state = observe(POLICY, None, 10.0, 0.0)
    for k in range(1, 30):  # +2 req/s every 5 s
        state = observe(POLICY, state, 10.0 + 2.0 * k, 5.0 * k)
    now = state.last_at
    assert state.trend > 0
    ahead = predict_peak(POLICY, state, now=now, horizon_seconds=60.0)
    assert ahead > state.level
    assert predict(POLICY, state, at=now + 60.0, now=now) == pytest.approx(ahead)
    # Never more than max_trend_factor times the level, however far ahead.
    far = predict(POLICY, state, at=now + DAY / 2, now=now)
    assert far <= POLICY.max_trend_factor * state.level + 1e-9


def test_a_falling_model_never_goes_negative() -> None:
    state = observe(POLICY, None, 100.0, 0.0)
    for k in range(1, 20):
        state = observe(POLICY, state, max(0.0, 100.0 - 10.0 * k), 5.0 * k)
    assert state.trend < 0
    assert predict(POLICY, state, at=state.last_at + 3600.0, now=state.last_at) == 0.0


def test_a_gap_restarts_the_short_term() -> None:
    state = run(None, lambda t: 20.0 + t / 10, 0.0, 300.0)
    assert state.trend > 0
    later = state.last_at + 2 * POLICY.max_gap_seconds
    after = observe(POLICY, state, 3.0, later)
    assert (after.level, after.trend, after.last_at) == (3.0, 0.0, later)
    assert after.samples == state.samples + 1


def test_duplicate_reordered_and_missing_samples_change_nothing() -> None:
    state = run(None, lambda t: 10.0, 0.0, 100.0)
    now = state.last_at
    assert observe(POLICY, state, 99.0, now) == state
    assert observe(POLICY, state, 99.0, now - 30.0) == state
    assert observe(POLICY, state, math.nan, now + 5.0) == state
    assert observe(POLICY, state, math.inf, now + 5.0) == state
    assert observe(POLICY, None, math.nan, now).samples == 0
    assert observe(POLICY, state, -4.0, now + 5.0).level < state.level  # negative counts as 0
    with pytest.raises(ValueError, match="finite time"):
        observe(POLICY, state, 1.0, math.nan)
    with pytest.raises(ValueError, match="must be finite"):
        predict(POLICY, state, at=math.inf, now=now)
    with pytest.raises(ValueError, match="must be finite"):
        predict_peak(POLICY, state, now=now, horizon_seconds=math.nan)


def test_the_clock_going_back_far_restarts_the_short_term() -> None:
    state = run(None, lambda t: 10.0, 10_000.0, 10_100.0)
    back = 10_000.0 - 2 * POLICY.max_gap_seconds
    after = observe(POLICY, state, 4.0, back)
    assert (after.level, after.last_at) == (4.0, back)


def test_a_period_change_resets_the_profile(learned: ModelForecast) -> None:
    hourly = ForecastPolicy(period_seconds=HOUR, slots=12)
    state = observe(hourly, learned, 1.0, learned.last_at + STEP)
    assert state.slots == 12
    assert state.counts == (0,) * 12
    assert state.period_seconds == HOUR
    assert state.level == pytest.approx(learned.level, rel=0.1)
    # Predicting with a policy of another shape ignores the profile instead of misreading it.
    now = learned.last_at
    assert predict(hourly, learned, at=now + 9.5 * HOUR, now=now) == pytest.approx(learned.level)


def test_observe_all_keeps_models_without_a_sample() -> None:
    states = observe_all(POLICY, {}, {"a": 1.0, "b": 2.0}, 0.0)
    states = observe_all(POLICY, states, {"a": 3.0}, 5.0)
    assert states["b"].last_at == 0.0
    assert states["a"].last_at == 5.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"period_seconds": 0.0}, "period_seconds must be > 0"),
        ({"slots": 0}, r"slots must be in \[1, 1440\]"),
        ({"slots": 5000}, r"slots must be in \[1, 1440\]"),
        ({"level_alpha": 0.0}, r"level_alpha must be in \(0, 1\]"),
        ({"trend_beta": 1.0}, r"trend_beta must be in \[0, 1\)"),
        ({"profile_alpha": 1.5}, r"profile_alpha must be in \(0, 1\]"),
        ({"profile_min_periods": 10}, r"profile_min_periods must be in \[1, 9\]"),
        ({"max_trend_factor": 0.5}, "max_trend_factor must be >= 1"),
        ({"max_gap_seconds": 1.0}, "max_gap_seconds must be >= sample_interval_seconds"),
        ({"max_rate": math.inf}, "max_rate must be finite"),
    ],
)
def test_policy_is_validated(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ForecastPolicy(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Persistence


def test_json_round_trip_is_exact(learned: ModelForecast) -> None:
    states = {"office": learned, "new": observe(POLICY, None, 3.25, 17.0)}
    text = forecasts_to_json(POLICY, states)
    assert forecasts_from_json(POLICY, text) == states
    assert forecasts_to_json(POLICY, forecasts_from_json(POLICY, text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        "null",
        '{"version": 2, "models": {}}',
        '{"version": 1, "models": []}',
        '{"version": 1}',
        "[" * 100_000,
    ],
)
def test_garbage_json_gives_no_forecasts(text: str) -> None:
    assert forecasts_from_json(POLICY, text) == {}


def test_bad_entries_are_dropped_and_bad_profiles_reset(learned: ModelForecast) -> None:
    doc = json.loads(forecasts_to_json(POLICY, {"good": learned, "bad": learned, "odd": learned}))
    doc["models"]["bad"]["l"] = "lots"
    doc["models"]["odd"]["p"] = [1.0, 2.0]
    doc["models"]["worse"] = 7
    restored = forecasts_from_json(POLICY, json.dumps(doc))
    assert set(restored) == {"good", "odd"}
    assert restored["good"] == learned
    assert restored["odd"].level == learned.level
    assert restored["odd"].counts == (0,) * POLICY.slots


def test_json_of_another_period_keeps_the_short_term_only(learned: ModelForecast) -> None:
    text = forecasts_to_json(POLICY, {"m": learned})
    hourly = ForecastPolicy(period_seconds=HOUR, slots=12)
    restored = forecasts_from_json(hourly, text)["m"]
    assert (restored.level, restored.trend, restored.last_at) == (
        learned.level,
        learned.trend,
        learned.last_at,
    )
    assert restored.counts == (0,) * 12


def test_two_hundred_models_fit_well_under_a_mebibyte() -> None:
    rng = random.Random(7)
    states: dict[str, ModelForecast] = {}
    # Every slot seen, with rates spanning six orders of magnitude (the longest numbers).
    for k in range(200):
        scale = 10 ** rng.uniform(-3, 3)
        state = None
        for slot in range(POLICY.slots):
            t = slot * POLICY.slot_seconds
            state = observe(POLICY, state, scale * rng.uniform(0.5, 1.5), t)
        assert state is not None
        states[f"model-{k:03d}-with-a-long-kubernetes-style-name"] = state
    text = forecasts_to_json(POLICY, states)
    assert len(text.encode()) < 300_000
    assert forecasts_from_json(POLICY, text) == states


# ------------------------------------------------------------------------------------------
# Properties

samples = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=3 * HOUR),  # seconds since the previous sample
        st.one_of(
            st.floats(min_value=0.0, max_value=1e4),
            st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e12]),
        ),
    ),
    min_size=1,
    max_size=60,
)
policies = st.builds(
    ForecastPolicy,
    period_seconds=st.sampled_from([DAY, HOUR, 7 * DAY]),
    slots=st.sampled_from([1, 24, 96]),
    level_alpha=st.sampled_from([0.1, 0.3, 1.0]),
    trend_beta=st.sampled_from([0.0, 0.1, 0.5]),
)


def replay(policy: ForecastPolicy, start: float, steps: list[tuple[float, float]]) -> ModelForecast:
    state = None
    t = start
    for dt, rate in steps:
        t += dt
        state = observe(policy, state, rate, t)
    assert state is not None
    return state


@settings(max_examples=150, deadline=None)
@given(
    policies,
    st.floats(min_value=0.0, max_value=2e9),
    samples,
    st.floats(min_value=-DAY, max_value=2 * DAY),
    st.floats(min_value=0.0, max_value=2 * DAY),
)
def test_property_forecasts_are_finite_and_never_negative(
    policy: ForecastPolicy,
    start: float,
    steps: list[tuple[float, float]],
    ahead: float,
    horizon: float,
) -> None:
    state = replay(policy, start, steps)
    now = state.last_at
    value = predict(policy, state, at=now + ahead, now=now)
    peak = predict_peak(policy, state, now=now, horizon_seconds=horizon)
    for v in (value, peak):
        assert math.isfinite(v) and v >= 0.0
    assert len(state.profile) == len(state.counts) == policy.slots
    assert all(0 <= c <= 9 for c in state.counts)
    assert all(math.isfinite(p) and p >= 0 for p in state.profile)


@settings(max_examples=150, deadline=None)
@given(policies, samples, st.floats(min_value=0.0, max_value=DAY), st.data())
def test_property_the_peak_bounds_every_point_of_its_window(
    policy: ForecastPolicy,
    steps: list[tuple[float, float]],
    horizon: float,
    data: st.DataObject,
) -> None:
    state = replay(policy, 1.7e9, steps)
    now = state.last_at + data.draw(st.floats(min_value=0.0, max_value=2 * HOUR))
    peak = predict_peak(policy, state, now=now, horizon_seconds=horizon)
    span = min(horizon, policy.period_seconds)
    for fraction in data.draw(st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=8)):
        at = now + fraction * span
        assert predict(policy, state, at=at, now=now) <= peak * (1 + 1e-12) + 1e-12


@settings(max_examples=100, deadline=None)
@given(policies, samples, st.floats(min_value=0.0, max_value=1e3))
def test_property_a_constant_rate_converges_to_it(
    policy: ForecastPolicy, steps: list[tuple[float, float]], rate: float
) -> None:
    state = replay(policy, 1.7e9, steps)
    t = state.last_at
    for _ in range(400):
        t += policy.sample_interval_seconds
        state = observe(policy, state, rate, t)
    # Right now (the profile's change from now to now is nil) the forecast is the rate.
    assert predict(policy, state, at=t, now=t) == pytest.approx(rate, rel=1e-3, abs=1e-3)


@settings(max_examples=150, deadline=None)
@given(policies, samples)
def test_property_json_round_trip_is_exact(
    policy: ForecastPolicy, steps: list[tuple[float, float]]
) -> None:
    state = replay(policy, 1.7e9, steps)
    text = forecasts_to_json(policy, {"m": state})
    assert forecasts_from_json(policy, text) == {"m": state}


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_property_arbitrary_text_never_raises(text: str) -> None:
    assert isinstance(forecasts_from_json(POLICY, text), dict)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(samples, st.dictionaries(st.sampled_from(["l", "t", "at", "n", "p", "c", "o"]), json_values))
def test_property_corrupt_entries_never_raise(
    steps: list[tuple[float, float]], patch: dict[str, object]
) -> None:
    state = replay(POLICY, 1.7e9, steps)
    doc = json.loads(forecasts_to_json(POLICY, {"m": state}))
    doc["models"]["m"].update(patch)
    restored = forecasts_from_json(POLICY, json.dumps(doc))
    for s in restored.values():
        assert s.slots == POLICY.slots
        value = predict(POLICY, s, at=s.last_at + 60.0, now=s.last_at)
        assert math.isfinite(value) and value >= 0
