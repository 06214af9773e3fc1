"""Per-model demand forecast for predictive preloading (pure).

Owns `observe` (fold one arrival-rate sample into a model's `ModelForecast`), `predict` (the
rate expected at a wall time), `predict_peak` (the largest rate expected over a horizon: what
placement asks for with horizon = the model's load time plus a margin, so that a model is loaded
at least its load time before its predicted rise) and `period_mean` (the profile's average
over a whole period, lows included: the shell gives placement at least that as a model's rate;
see `tidal.operator.shell.fleet`), plus the JSON form the shell keeps in a
ConfigMap so that what was learned survives an operator restart. Time is always an argument
(epoch seconds from the shell's clock); nothing here reads a clock or does I/O.

Method: a seasonal profile learned per model, plus Holt's linear smoothing for the short term.

* Profile: `slots` buckets over `period_seconds` (96 x 15 min over a day by default), aligned on
  the epoch. While the clock is inside a bucket the samples are averaged; when it leaves, that
  visit's mean is folded into the bucket with an EWMA of weight `profile_alpha` per period (the
  first visit sets it). So one bucket moves once per day whatever the sampling rate, a busy or
  quiet day shifts it by `profile_alpha`, and a bucket not observed (operator down, gap in the
  samples) is simply not updated. Each bucket counts its visits (capped at 9) and is trusted in
  proportion up to `profile_min_periods`.
* Short term: Holt's level + trend over the raw rate, with the smoothing weights defined per
  `sample_interval_seconds` and adjusted to the actual interval (irregular or missing samples
  weigh what their interval is worth). The trend is projected at most `trend_horizon_seconds`
  ahead and by at most `max_trend_factor` times the level, so noise cannot run away. After a gap
  of more than `max_gap_seconds` the short term restarts from the next sample.
* Forecast at time t: short-term(t) + w * (profile[slot(t)] - profile[slot(last sample)]), w the
  trust in both buckets: the profile supplies how the rate *changes* from now to t (the daily
  rise at 9:00) and the short term where it *is* now (today busier or quieter than usual; a model
  going viral). When the short term is stale (no sample for `max_gap_seconds`, e.g. just after
  a restart) the forecast is the profile itself, falling back to the last level. It is never
  negative.

Why not full Holt-Winters: its seasonal terms are deviations from a deseasonalised level that
needs several clean periods to initialise and goes wrong for models that are idle most of the
day (most of a power-law fleet); an additive change over a profile of plain rates degrades
gracefully to Holt alone for a model never seen at this hour, and to the profile alone when the
recent past is unknown. The profile is piecewise constant per bucket (not interpolated), so the
forecast for a bucket's rise is reached a full horizon before the bucket starts: preloading
errs on the early side. Additive rather than multiplicative: a ratio explodes for models whose
usual rate is near zero, which is most of them.

State per model is bounded: a few floats plus `slots` quantised floats (4 significant digits)
and visit counts; for 200 models and 96 slots the JSON is about 200 KB.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

# Visit counts are capped so that they fit one character each in JSON.
_COUNT_CAP = 9
_SAMPLES_CAP = 1 << 30
# Profile values below this (one request every ~3 hours) are stored as 0.
_PROFILE_FLOOR = 1e-4
_JSON_VERSION = 1
_MAX_SLOTS = 1440


@dataclass(frozen=True, slots=True)
class ForecastPolicy:
    """How forecasts are learned. Smoothing weights are per `sample_interval_seconds`."""

    period_seconds: float = 86400.0
    slots: int = 96
    # The interval the operator nominally samples at; alphas and betas are per this interval.
    sample_interval_seconds: float = 5.0
    # Weight of one sample in the short-term level (Holt's alpha).
    level_alpha: float = 0.3
    # Weight of one sample's slope in the short-term trend (Holt's beta).
    trend_beta: float = 0.1
    # Weight of one period's visit in a profile bucket.
    profile_alpha: float = 0.3
    # A bucket is fully trusted after this many visits (partly before).
    profile_min_periods: int = 2
    # The projected trend may add at most (factor - 1) times the level.
    max_trend_factor: float = 3.0
    # The trend is extrapolated at most this far ahead.
    trend_horizon_seconds: float = 300.0
    # Longer without a sample: the short-term state is stale and restarts on the next sample.
    max_gap_seconds: float = 600.0
    # Rates above this are clamped (keeps every stored number finite).
    max_rate: float = 1e9

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.period_seconds) and self.period_seconds > 0):
            problems.append("period_seconds must be > 0")
        if not 1 <= self.slots <= _MAX_SLOTS:
            problems.append(f"slots must be in [1, {_MAX_SLOTS}]")
        if not self.sample_interval_seconds > 0:
            problems.append("sample_interval_seconds must be > 0")
        if not 0 < self.level_alpha <= 1:
            problems.append("level_alpha must be in (0, 1]")
        if not 0 <= self.trend_beta < 1:
            problems.append("trend_beta must be in [0, 1)")
        if not 0 < self.profile_alpha <= 1:
            problems.append("profile_alpha must be in (0, 1]")
        if not 1 <= self.profile_min_periods <= _COUNT_CAP:
            problems.append(f"profile_min_periods must be in [1, {_COUNT_CAP}]")
        if not self.max_trend_factor >= 1:
            problems.append("max_trend_factor must be >= 1")
        if not self.trend_horizon_seconds >= 0:
            problems.append("trend_horizon_seconds must be >= 0")
        if not self.max_gap_seconds >= self.sample_interval_seconds:
            problems.append("max_gap_seconds must be >= sample_interval_seconds")
        if not (math.isfinite(self.max_rate) and self.max_rate > 0):
            problems.append("max_rate must be finite and > 0")
        if problems:
            raise ValueError("invalid ForecastPolicy: " + "; ".join(problems))

    @property
    def slot_seconds(self) -> float:
        return self.period_seconds / self.slots


@dataclass(frozen=True, slots=True)
class ModelForecast:
    """What is known of one model's demand. Every field is bounded in size.

    `profile[i]` is the learned rate (req/s) of bucket i, trusted after `counts[i]` visits (0:
    never seen). `open_slot` is the absolute bucket number (floor(t / slot_seconds)) being
    averaged now, with the sum and number of its samples so far.
    """

    level: float
    trend: float  # req/s per second
    last_at: float
    samples: int
    period_seconds: float
    profile: tuple[float, ...]
    counts: tuple[int, ...]
    open_slot: int
    open_sum: float = 0.0
    open_n: int = 0

    @property
    def slots(self) -> int:
        return len(self.profile)


def observe(
    policy: ForecastPolicy, state: ModelForecast | None, rate: float, now: float
) -> ModelForecast:
    """Fold the arrival rate `rate` (req/s) seen at wall time `now` into the model's state.

    A non-finite rate is a missing sample (the state is returned unchanged); a negative one
    counts as 0. Samples at or before the last one are ignored (duplicates, reordering), unless
    the clock went back by more than `max_gap_seconds`, which restarts the short term.
    """
    if not math.isfinite(now):
        raise ValueError(f"observe needs a finite time, got {now!r}")
    if not math.isfinite(rate):
        return state if state is not None else _empty(policy, now)
    rate = min(max(rate, 0.0), policy.max_rate)
    if state is None or state.samples == 0:
        return _first(policy, rate, now)
    state = _conform(policy, state)
    dt = now - state.last_at
    if dt <= 0 and dt >= -policy.max_gap_seconds:
        return state
    if dt <= 0 or dt > policy.max_gap_seconds:
        level, trend = rate, 0.0
    else:
        level, trend = _holt(policy, state, rate, dt)
    abs_slot = _abs_slot(policy, now)
    if abs_slot == state.open_slot:
        profile, counts = state.profile, state.counts
        open_sum, open_n = state.open_sum + rate, state.open_n + 1
    else:
        profile, counts = _fold(policy, state)
        open_sum, open_n = rate, 1
    return ModelForecast(
        level=level,
        trend=trend,
        last_at=now,
        samples=min(state.samples + 1, _SAMPLES_CAP),
        period_seconds=policy.period_seconds,
        profile=profile,
        counts=counts,
        open_slot=abs_slot,
        open_sum=open_sum,
        open_n=open_n,
    )


def observe_all(
    policy: ForecastPolicy,
    states: Mapping[str, ModelForecast],
    rates: Mapping[str, float],
    now: float,
) -> dict[str, ModelForecast]:
    """`observe` for every model in `rates`; states of models not in `rates` are kept as is."""
    result = dict(states)
    for name in sorted(rates):
        result[name] = observe(policy, states.get(name), rates[name], now)
    return result


def predict(policy: ForecastPolicy, state: ModelForecast | None, at: float, now: float) -> float:
    """The arrival rate (req/s) expected at wall time `at`, as known at `now`; never negative."""
    _check_times(at, now)
    if state is None or state.samples == 0:
        return 0.0
    return _forecast(
        policy, state, at, _abs_slot(policy, at) % policy.slots, _stale(policy, state, now)
    )


def predict_peak(
    policy: ForecastPolicy, state: ModelForecast | None, now: float, horizon_seconds: float
) -> float:
    """The largest rate expected over [now, now + horizon_seconds]; never negative.

    The horizon is capped at one period. Within one bucket the forecast is monotone in time (the
    profile is constant, the trend projection monotone), so checking both ends of each bucket's
    part of the window finds the maximum: at most slots + 1 buckets.
    """
    _check_times(now, horizon_seconds)
    if state is None or state.samples == 0:
        return 0.0
    horizon = min(max(horizon_seconds, 0.0), policy.period_seconds)
    end = now + horizon
    stale = _stale(policy, state, now)
    width = policy.slot_seconds
    first, last = _abs_slot(policy, now), _abs_slot(policy, end)
    peak = 0.0
    for k in range(first, last + 1):
        slot = k % policy.slots
        lo = max(now, k * width)
        hi = min(end, (k + 1) * width)
        for at in (lo, max(lo, hi)):
            peak = max(peak, _forecast(policy, state, at, slot, stale))
    return peak


def period_mean(state: ModelForecast | None, coverage: float = 0.9) -> float:
    """The mean rate over the learned profile (req/s): what the model averages over a period,
    its lows included. 0 until the profile has seen at least `coverage` of its buckets (a
    model first seen this morning has no day to average)."""
    if state is None or not state.profile:
        return 0.0
    seen = [value for value, count in zip(state.profile, state.counts, strict=True) if count > 0]
    if len(seen) < coverage * len(state.profile):
        return 0.0
    return sum(seen) / len(seen)


# ------------------------------------------------------------------------------------------
# JSON persistence (kept in a ConfigMap by the shell).


def forecasts_to_json(policy: ForecastPolicy, states: Mapping[str, ModelForecast]) -> str:
    """A compact JSON document of every model's state; `forecasts_from_json` reads it back.

    Floats are written exactly (repr), profile values are already quantised to 4 significant
    digits and counts are one digit each, so the document is small and round-trips exactly.
    """
    models: dict[str, object] = {}
    for name in sorted(states):
        s = _conform(policy, states[name])
        models[name] = {
            "l": s.level,
            "t": s.trend,
            "at": s.last_at,
            "n": s.samples,
            "p": list(s.profile),
            "c": "".join(str(c) for c in s.counts),
            "o": [s.open_slot, s.open_sum, s.open_n],
        }
    doc = {
        "version": _JSON_VERSION,
        "periodSeconds": policy.period_seconds,
        "slots": policy.slots,
        "models": models,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def forecasts_from_json(policy: ForecastPolicy, text: str) -> dict[str, ModelForecast]:
    """Read `forecasts_to_json`'s document back; never raises.

    Garbage, another version or a non-object gives {}; an entry that does not parse is dropped;
    a document written with another period or number of slots keeps each model's short-term
    state but starts its profile afresh.
    """
    try:
        doc = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != _JSON_VERSION:
        return {}
    models = doc.get("models")
    if not isinstance(models, dict):
        return {}
    same_shape = (
        _number(doc.get("periodSeconds")) == policy.period_seconds
        and doc.get("slots") == policy.slots
    )
    result: dict[str, ModelForecast] = {}
    for name, entry in models.items():
        if isinstance(name, str) and isinstance(entry, dict):
            state = _parse_entry(policy, entry, same_shape)
            if state is not None:
                result[name] = state
    return result


# ------------------------------------------------------------------------------------------
# Steps.


def _check_times(*values: float) -> None:
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"forecast times must be finite, got {values!r}")


def _abs_slot(policy: ForecastPolicy, t: float) -> int:
    return math.floor(t / policy.slot_seconds)


def _stale(policy: ForecastPolicy, state: ModelForecast, now: float) -> bool:
    return now - state.last_at > policy.max_gap_seconds


def _quantise(value: float) -> float:
    if value < _PROFILE_FLOOR:
        return 0.0
    return float(f"{value:.4g}")


def _empty(policy: ForecastPolicy, now: float) -> ModelForecast:
    return ModelForecast(
        level=0.0,
        trend=0.0,
        last_at=now,
        samples=0,
        period_seconds=policy.period_seconds,
        profile=(0.0,) * policy.slots,
        counts=(0,) * policy.slots,
        open_slot=_abs_slot(policy, now),
    )


def _first(policy: ForecastPolicy, rate: float, now: float) -> ModelForecast:
    return replace(_empty(policy, now), level=rate, samples=1, open_sum=rate, open_n=1)


def _conform(policy: ForecastPolicy, state: ModelForecast) -> ModelForecast:
    """The state under `policy`'s period and slots: a profile of another shape starts afresh."""
    if state.period_seconds == policy.period_seconds and state.slots == policy.slots:
        return state
    return replace(
        state,
        period_seconds=policy.period_seconds,
        profile=(0.0,) * policy.slots,
        counts=(0,) * policy.slots,
        open_slot=_abs_slot(policy, state.last_at),
        open_sum=0.0,
        open_n=0,
    )


def _holt(
    policy: ForecastPolicy, state: ModelForecast, rate: float, dt: float
) -> tuple[float, float]:
    """Holt's level and trend after a sample `dt` seconds after the last one."""
    steps = dt / policy.sample_interval_seconds
    alpha = 1.0 - (1.0 - policy.level_alpha) ** steps
    beta = 1.0 - (1.0 - policy.trend_beta) ** steps
    predicted = state.level + state.trend * dt
    level = max(0.0, alpha * rate + (1.0 - alpha) * predicted)
    trend = beta * (level - state.level) / dt + (1.0 - beta) * state.trend
    bound = policy.max_rate / policy.sample_interval_seconds
    return min(level, policy.max_rate), min(max(trend, -bound), bound)


def _fold(
    policy: ForecastPolicy, state: ModelForecast
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The profile with the open bucket's visit folded in."""
    if state.open_n <= 0:
        return state.profile, state.counts
    index = state.open_slot % policy.slots
    mean = state.open_sum / state.open_n
    old, count = state.profile[index], state.counts[index]
    value = mean if count == 0 else (1.0 - policy.profile_alpha) * old + policy.profile_alpha * mean
    profile = list(state.profile)
    counts = list(state.counts)
    profile[index] = _quantise(value)
    counts[index] = min(count + 1, _COUNT_CAP)
    return tuple(profile), tuple(counts)


def _trust(policy: ForecastPolicy, state: ModelForecast, slot: int) -> float:
    if state.period_seconds != policy.period_seconds or state.slots != policy.slots:
        return 0.0
    return min(1.0, state.counts[slot] / policy.profile_min_periods)


def _forecast(
    policy: ForecastPolicy, state: ModelForecast, at: float, slot: int, stale: bool
) -> float:
    """The forecast at `at`, which lies in bucket `slot` (monotone in `at` within a bucket)."""
    trust_at = _trust(policy, state, slot)
    if stale:
        value = (
            state.level + trust_at * (state.profile[slot] - state.level)
            if trust_at
            else state.level
        )
        return max(0.0, value)
    ahead = min(max(at - state.last_at, 0.0), policy.trend_horizon_seconds)
    growth = min(
        max(state.trend * ahead, -state.level), (policy.max_trend_factor - 1) * state.level
    )
    value = state.level + growth
    base = _abs_slot(policy, state.last_at) % policy.slots
    trust = min(trust_at, _trust(policy, state, base))
    if trust > 0:
        value += trust * (state.profile[slot] - state.profile[base])
    return max(0.0, value)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _numbers(values: object) -> list[float] | None:
    if not isinstance(values, list):
        return None
    numbers = [_number(v) for v in values]
    if any(n is None or n < 0 for n in numbers):
        return None
    return [n for n in numbers if n is not None]


def _counts(text: object, slots: int) -> tuple[int, ...] | None:
    if not isinstance(text, str) or len(text) != slots or not text.isascii() or not text.isdigit():
        return None
    return tuple(int(c) for c in text)


def _parse_entry(
    policy: ForecastPolicy, entry: Mapping[str, object], same_shape: bool
) -> ModelForecast | None:
    level, trend, last_at = (
        _number(entry.get("l")),
        _number(entry.get("t")),
        _number(entry.get("at")),
    )
    samples = entry.get("n")
    if level is None or trend is None or last_at is None or level < 0:
        return None
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        return None
    bound = policy.max_rate / policy.sample_interval_seconds
    state = ModelForecast(
        level=min(level, policy.max_rate),
        trend=min(max(trend, -bound), bound),
        last_at=last_at,
        samples=min(samples, _SAMPLES_CAP),
        period_seconds=policy.period_seconds,
        profile=(0.0,) * policy.slots,
        counts=(0,) * policy.slots,
        open_slot=_abs_slot(policy, last_at),
    )
    if not same_shape:
        return state
    profile = _numbers(entry.get("p"))
    counts = _counts(entry.get("c"), policy.slots)
    opened = entry.get("o")
    if profile is None or len(profile) != policy.slots or counts is None:
        return state
    if not isinstance(opened, list) or len(opened) != 3:
        return state
    open_slot, open_sum, open_n = opened
    open_total = _number(open_sum)
    if (
        not isinstance(open_slot, int)
        or isinstance(open_slot, bool)
        or not isinstance(open_n, int)
        or isinstance(open_n, bool)
        or open_n < 0
        or open_total is None
        or open_total < 0
    ):
        return replace(
            state, profile=tuple(min(v, policy.max_rate) for v in profile), counts=counts
        )
    return replace(
        state,
        profile=tuple(min(v, policy.max_rate) for v in profile),
        counts=counts,
        open_slot=open_slot,
        open_sum=open_total,
        open_n=open_n,
    )
