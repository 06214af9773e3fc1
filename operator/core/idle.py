"""Scale to zero and wake ahead: when a pool that may reach zero goes there and comes back (pure).

Owns `decide_zero` (the floor of serving replicas this tick, 0 or 1, with its reason) and
`decide_scale_zero`, which wraps `autoscaler.decide_scale` with it for a pool whose
`autoscaling.minReplicas` is 0. Time is an argument (monotonic seconds from the shell; the
forecast, learned on wall time, reaches this module as the peak rate it predicts over the wake
lead). Nothing here reads a clock or does I/O.

The rules, each one a guard against a way of getting zero wrong:

* To zero only after `after_seconds` without any request: no arrivals, nothing queued or in
  flight, nothing held at the gateway, and metrics known (an unknown tick counts as busy).
* Never to zero while a request is held or forecast demand is due: a forecast peak over the
  wake lead of at least `wake_rate` counts as activity, so the idle timer restarts with it.
* At zero, a held request (or arrivals seen anyway) wakes the pool at once; a forecast peak of
  at least `wake_rate` within the lead wakes it ahead of the rise. lead = the measured
  time-to-routable of one replica (until measured, `default_routable_seconds`) + the margin.
* A quick zero when the forecast vouches that the coming hours are empty: the idle timer is
  the wake lead instead of `after_seconds` when every 15-minute bucket of the next
  `after_seconds` (and one bucket more, the profile's resolution) is trusted (learned over
  `profile_min_periods` days) and the forecast's peak over them is below `wake_rate` (fewer
  than one request expected in the window). Why the wake lead: keeping an idle replica for as
  long as a wake costs (time-to-routable, plus the margin) and then releasing it is the
  ski-rental rule: never more than about twice the GPU-time of the best choice made knowing
  the future, whatever the next request does; `after_seconds` only buys a replica for a
  request that the learned hours say is unlikely. A service whose forecast has not learned
  those hours (new, or never seen at this hour) keeps `after_seconds`.
* No flapping: zero -> one needs a request or a forecast, one -> zero needs an idle spell
  (`after_seconds`, or the wake lead when the forecast vouches for quiet) with neither, and a
  wake restarts the idle timer, so a pool woken stays up at least that spell and a quiet pool
  at zero stays there.

Why 300 s by default: Knative's KPA goes to zero after its 60 s stable window plus a 30 s
grace period, KEDA after a 300 s cooldown. A GPU replica's cold start is tens of seconds to
minutes (engine load and warm-up), not Knative's sub-second container start, so a wrong zero
costs the next caller far more; 300 s matches KEDA and our own `scaleDownDelaySeconds`, and
costs at most 5 GPU-minutes per idle spell. The forecast wake makes the predictable returns
cheap, which is what the longer window would otherwise buy.

`wake_rate` defaults to one request per `after_seconds`: a forecast that busy would not let a
replica go to zero, so it is the rate at which waking ahead is worth a replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tidal.operator.core.autoscaler import (
    REASON_FLOOR_MIN,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
)
from tidal.operator.core.forecast import (
    ForecastPolicy,
    ModelForecast,
    forecasts_from_json,
    forecasts_to_json,
    observe,
    predict_peak,
)

REASON_ZERO_IDLE = "scale-to-zero:idle"
REASON_AT_ZERO = "scaled-to-zero"
REASON_WAIT_ZERO = "wait:scale-to-zero"
REASON_WAKE_REQUEST = "wake:request"
REASON_WAKE_FORECAST = "wake:forecast"
REASON_HOLD_FORECAST = "hold:forecast-due"
REASON_BUSY = "busy"
REASON_ZERO_QUIET = "scale-to-zero:forecast-quiet"
REASON_WAIT_FIRST_READY = "wait:first-ready"

# How long a new service that may reach zero keeps its first replica while none has been
# Ready: a Deployment's default progressDeadlineSeconds, after which Kubernetes itself calls
# the rollout failed.
FIRST_READY_WAIT_SECONDS = 600.0

DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS = 300


@dataclass(frozen=True, slots=True)
class ZeroPolicy:
    """How a pool with `minReplicas: 0` reaches zero and wakes."""

    after_seconds: float = float(DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS)
    # Added to the measured time-to-routable: the forecast wake's safety margin.
    wake_margin_seconds: float = 30.0
    # Time-to-routable assumed until one is measured (a GPU replica: load + warm-up).
    default_routable_seconds: float = 60.0
    # A forecast peak at or above this (requests/s) is demand due; None: 1 / after_seconds.
    wake_rate: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.after_seconds) and self.after_seconds >= 0):
            problems.append("after_seconds must be finite and >= 0")
        if not self.wake_margin_seconds >= 0 or not self.default_routable_seconds >= 0:
            problems.append("wake_margin_seconds and default_routable_seconds must be >= 0")
        if self.wake_rate is not None and not self.wake_rate > 0:
            problems.append("wake_rate must be > 0")
        if problems:
            raise ValueError("invalid ZeroPolicy: " + "; ".join(problems))

    @property
    def wake_threshold(self) -> float:
        if self.wake_rate is not None:
            return self.wake_rate
        return 1.0 / max(self.after_seconds, 1.0)


def wake_lead(policy: ZeroPolicy, routable_seconds: float | None) -> float:
    """How far ahead the forecast is asked: time-to-routable of one replica plus the margin."""
    routable = routable_seconds
    if routable is None or not math.isfinite(routable) or routable < 0:
        routable = policy.default_routable_seconds
    return routable + policy.wake_margin_seconds


@dataclass(frozen=True, slots=True)
class IdleSignals:
    """What the shell knows this tick of a pool's demand.

    `active`: requests arrived, are queued or in flight (None: unknown, metrics missing);
    `held`: requests held at the gateway for this service; `forecast_rate`: the forecast's
    peak rate over the wake lead (None: no forecast); `quiet_rate`: its peak over the next idle
    window (`after_seconds`), only where every bucket of it is trusted (None: the forecast does
    not vouch for those hours, see `forecast_quiet_peak`); `lead_seconds`: the wake lead
    (`wake_lead`), the quick idle timer when `quiet_rate` says the window is empty.
    """

    now: float
    active: bool | None
    held: int = 0
    forecast_rate: float | None = None
    quiet_rate: float | None = None
    lead_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.held < 0:
            raise ValueError("held must be >= 0")
        if self.forecast_rate is not None and not self.forecast_rate >= 0:
            raise ValueError("forecast_rate must be >= 0 (or None)")
        if self.quiet_rate is not None and not self.quiet_rate >= 0:
            raise ValueError("quiet_rate must be >= 0 (or None)")
        if self.lead_seconds is not None and not (
            math.isfinite(self.lead_seconds) and self.lead_seconds >= 0
        ):
            raise ValueError("lead_seconds must be finite and >= 0 (or None)")


@dataclass(frozen=True, slots=True)
class IdleState:
    """`active_at`: when demand (or an unknown tick, a wake, a due forecast) was last seen;
    `zero_since`: when the pool went to zero (None: not at zero)."""

    active_at: float | None = None
    zero_since: float | None = None


@dataclass(frozen=True, slots=True)
class ZeroVerdict:
    """The fewest serving replicas this tick (0 or 1) and why. `to_zero`: the pool goes (or
    stays) at zero now; `wake`: it leaves zero now."""

    floor: int
    reason: str
    to_zero: bool = False
    wake: bool = False


def decide_zero(
    policy: ZeroPolicy, signals: IdleSignals, state: IdleState, at_zero: bool
) -> tuple[ZeroVerdict, IdleState]:
    """The zero/wake decision for one tick; deterministic, pure."""
    now = signals.now
    due = signals.forecast_rate is not None and signals.forecast_rate >= policy.wake_threshold
    if at_zero:
        if signals.held > 0 or signals.active:
            return ZeroVerdict(1, REASON_WAKE_REQUEST, wake=True), IdleState(active_at=now)
        if due:
            return ZeroVerdict(1, REASON_WAKE_FORECAST, wake=True), IdleState(active_at=now)
        since = state.zero_since if state.zero_since is not None else now
        return ZeroVerdict(0, REASON_AT_ZERO, to_zero=True), replace(state, zero_since=since)
    busy = signals.held > 0 or signals.active is not False
    if busy or due or state.active_at is None or state.active_at > now:
        active_at = now
    else:
        active_at = state.active_at
    awake = IdleState(active_at=active_at)
    if due:
        return ZeroVerdict(1, REASON_HOLD_FORECAST), awake
    if busy:
        return ZeroVerdict(1, REASON_BUSY), awake
    quick = idle_window(policy, signals)
    if quick < policy.after_seconds and now - active_at >= quick:
        return ZeroVerdict(0, REASON_ZERO_QUIET, to_zero=True), IdleState(active_at, now)
    if now - active_at >= policy.after_seconds:
        return ZeroVerdict(0, REASON_ZERO_IDLE, to_zero=True), IdleState(active_at, now)
    return ZeroVerdict(1, REASON_WAIT_ZERO), awake


def idle_window(policy: ZeroPolicy, signals: IdleSignals) -> float:
    """How long an awake pool waits without demand before zero: the wake lead when the
    forecast vouches that the next `after_seconds` are empty (`quiet_rate` below the wake
    rate), else `after_seconds`; never longer than `after_seconds`."""
    quiet = signals.quiet_rate is not None and signals.quiet_rate < policy.wake_threshold
    if not quiet:
        return policy.after_seconds
    lead = signals.lead_seconds
    if lead is None:
        lead = policy.default_routable_seconds + policy.wake_margin_seconds
    return min(policy.after_seconds, lead)


def decide_scale_zero(
    policy: ScalingPolicy,
    zero: ZeroPolicy,
    observation: Observation,
    scaler: ScalerState,
    signals: IdleSignals,
    idle: IdleState,
) -> tuple[ScaleDecision, ScalerState, IdleState]:
    """`decide_scale` for a pool that may reach zero (`policy.min_replicas == 0`).

    Awake, the pool scales as with `minReplicas: 1`; the zero verdict alone takes it to zero
    (with no standby: its GPUs are released) and keeps it there; a wake starts one replica, or
    more when the requests held at the gateway (counted as queued) ask for them. With
    `min_replicas > 0` this is `decide_scale` unchanged.
    """
    if policy.min_replicas > 0:
        decision, new_scaler = decide_scale(policy, observation, scaler)
        return decision, new_scaler, idle
    at_zero = scaler.desired_serving == 0
    if not at_zero and (observation.warming > 0 or observation.pending_unschedulable > 0):
        # A replica still starting is not idle: the timer starts once it could serve.
        signals = replace(signals, active=True)
    verdict, new_idle = decide_zero(zero, signals, idle, at_zero)
    obs = observation
    if signals.held > 0:
        obs = replace(obs, queue_depth=(obs.queue_depth or 0.0) + signals.held)
    floored = replace(policy, min_replicas=verdict.floor)
    decision, new_scaler = decide_scale(floored, obs, scaler)
    if verdict.to_zero:
        decision = replace(
            decision, desired_serving=0, desired_standby=0, promote_standby=0, reason=verdict.reason
        )
        new_scaler = replace(new_scaler, desired_serving=0, down_window=())
    elif verdict.wake and decision.reason == REASON_FLOOR_MIN:
        decision = replace(decision, reason=verdict.reason)
    elif verdict.reason in (REASON_WAIT_ZERO, REASON_HOLD_FORECAST):
        decision = replace(decision, notes=(*decision.notes, verdict.reason))
    return decision, new_scaler, new_idle


# ------------------------------------------------------------------------------------------
# The service's own demand forecast (the fleet's forecast core, one "model" per service) and
# what of it all survives an operator restart (status.autoscaler.state, key "zero").

FORECAST_NAME = "service"


@dataclass(frozen=True, slots=True)
class ZeroMemory:
    """The idle timer and the service's learned demand (`forecast`, on wall time).

    `refuted`: today's demand has contradicted the learned usual rate (see `learn_demand`):
    until demand is back or the usual busy hours end, the forecast wakes nothing and holds
    nothing (`forecast_peak` says None); requests still wake the pool. Not written to status:
    a restarted operator trusts the forecast again (the safe side)."""

    idle: IdleState = IdleState()
    forecast: ModelForecast | None = None
    refuted: bool = False


# A bucket that usually brings this many requests or more and brought none is evidence that
# today is not a usual day: the chance of it under the usual rate is e^-3, 5 %.
REFUTE_EXPECTED_REQUESTS = 3.0
# ... and only a bucket learned within 10 % of the day's busiest: the profile weighs its
# days (each visit by `profile_alpha`), so on 90 % of the learned days, as weighed, the rise
# had come by then. A bucket on the rising edge is not past the rise, however recent early
# rises have lifted it (two early days weigh 51 %).
REFUTE_PEAK_FRACTION = 0.9


def learn_demand(
    policy: ForecastPolicy,
    memory: ZeroMemory,
    rate: float | None,
    wall: float,
    wake_rate: float | None = None,
) -> ZeroMemory:
    """Fold this tick's arrival rate into the forecast, at most once per
    `policy.sample_interval_seconds` (its smoothing weights are per that interval); a missing
    rate is no sample (a pool at zero measures 0 requests/s, which is a sample).

    With `wake_rate` (the rate at which a forecast wakes a pool) it also keeps `refuted`: set
    when a bucket closes that brought no request although its learned rate expected at least
    `REFUTE_EXPECTED_REQUESTS` over the samples seen in it, and that bucket lies past the usual
    rise (its learned rate is within 10 % of the day's busiest bucket's: on 90 % of the
    learned days the rise had come by then, so a day whose rise is merely late within the
    learned spread is not refuted); cleared when a bucket closes that brought `wake_rate`
    or more (demand is back, not one sporadic request), and once the usual busy hours are over
    (a trusted bucket learned below `wake_rate`). A weekend day under a weekday profile is the
    case: woken for a rise that does not come, the pool goes back to zero a bucket or two after
    the usual rise and wakes on demand only for the rest of those hours, instead of staying up
    all day."""
    if rate is None:
        return memory
    before = memory.forecast
    last = before.last_at if before is not None else None
    if last is not None and 0 <= wall - last < policy.sample_interval_seconds:
        return memory
    after = observe(policy, before, rate, wall)
    if wake_rate is None or not wake_rate > 0:
        return replace(memory, forecast=after, refuted=False)
    refuted = memory.refuted
    closed = before is not None and before.samples > 0 and after.open_slot != before.open_slot
    if closed and before is not None and before.open_n > 0:
        if before.open_sum / before.open_n >= wake_rate:
            refuted = False
        elif _empty_past_the_rise(policy, before):
            refuted = True
    if refuted and after.slots == policy.slots:
        slot = after.open_slot % policy.slots
        trusted = after.counts[slot] >= policy.profile_min_periods
        if trusted and after.profile[slot] < wake_rate:
            refuted = False
    return replace(memory, forecast=after, refuted=refuted)


def _empty_past_the_rise(policy: ForecastPolicy, closing: ModelForecast) -> bool:
    """Whether the bucket `closing` is closing brought no request, although trusted and
    learned busy enough to expect some, and at or past the usual rise."""
    if closing.open_sum > 0 or closing.open_n == 0 or closing.slots != policy.slots:
        return False
    slot = closing.open_slot % policy.slots
    trusted = closing.counts[slot] >= policy.profile_min_periods
    usual = closing.profile[slot]
    expected = usual * closing.open_n * policy.sample_interval_seconds
    peak = max(
        (p for p, c in zip(closing.profile, closing.counts, strict=True) if c),
        default=0.0,
    )
    return trusted and expected >= REFUTE_EXPECTED_REQUESTS and usual >= REFUTE_PEAK_FRACTION * peak


def forecast_peak(
    policy: ForecastPolicy, memory: ZeroMemory, wall: float, lead_seconds: float
) -> float | None:
    """The largest rate expected over the next `lead_seconds` (None: no forecast yet): the
    forecast's own peak, or the usual rate of those hours (the learned profile, as far as it
    is trusted), whichever is more.

    Why the usual rate too: the forecast puts the short term where the rate is now and the
    profile's change on top; inside the bucket of a rise that has not come yet today (it is
    jittered by minutes) it reads "quieter than usual" and says 0, so a pool woken for the
    rise would go back to zero minutes before it. For a pool at or near zero, an hour that
    usually brings requests is the evidence worth a replica, until today's demand refutes it
    (`ZeroMemory.refuted`): then None, the forecast says nothing and the pool wakes on demand
    (its additive profile change would still wake a pool at zero at every bucket whose
    learned rate is a little above the last one's, on a day whose rate is not the usual one)."""
    forecast = memory.forecast
    if forecast is None:
        return None
    if memory.refuted:
        return None
    peak = predict_peak(policy, forecast, wall, lead_seconds)
    if forecast.period_seconds != policy.period_seconds or forecast.slots != policy.slots:
        return peak
    width = policy.slot_seconds
    first = math.floor(wall / width)
    last = math.floor((wall + min(max(lead_seconds, 0.0), policy.period_seconds)) / width)
    for k in range(first, last + 1):
        slot = k % policy.slots
        trust = min(1.0, forecast.counts[slot] / policy.profile_min_periods)
        peak = max(peak, trust * forecast.profile[slot])
    return peak


def forecast_quiet_peak(
    policy: ForecastPolicy, memory: ZeroMemory, wall: float, horizon_seconds: float
) -> float | None:
    """The largest rate expected over the next `horizon_seconds` and one bucket more, where
    the forecast vouches for every bucket of it (each learned over `profile_min_periods`
    periods): the forecast's own peak or the learned profile, whichever is more; None where any
    bucket is not yet trusted (a new service, an hour never seen): then nothing is known to be
    quiet.

    Why one bucket more: the profile is piecewise constant per bucket (15 minutes), so a rise
    learned in one bucket may come anywhere in the one before it on a day it comes early; a
    window is called quiet only with that resolution to spare."""
    forecast = memory.forecast
    if forecast is None or forecast.samples == 0:
        return None
    if forecast.period_seconds != policy.period_seconds or forecast.slots != policy.slots:
        return None
    width = policy.slot_seconds
    horizon = min(max(horizon_seconds, 0.0) + width, policy.period_seconds)
    first = math.floor(wall / width)
    last = math.floor((wall + horizon) / width)
    peak = predict_peak(policy, forecast, wall, horizon)
    for k in range(first, last + 1):
        slot = k % policy.slots
        if forecast.counts[slot] < policy.profile_min_periods:
            return None
        peak = max(peak, forecast.profile[slot])
    return peak


def dump_zero(policy: ForecastPolicy, memory: ZeroMemory, clock_offset: float) -> dict[str, Any]:
    """JSON-ready form; monotonic times are written as `time + clock_offset` (wall)."""

    def at(t: float | None) -> float | None:
        return None if t is None else round(t + clock_offset, 3)

    # Only whether (since when) the pool is at zero: the idle timer of an awake pool restarts
    # with the operator (a written time would be stale: it moves with every request).
    out: dict[str, Any] = {"zeroSince": at(memory.idle.zero_since)}
    if memory.forecast is not None:
        out["forecast"] = forecasts_to_json(policy, {FORECAST_NAME: memory.forecast})
    return out


def load_zero(policy: ForecastPolicy, data: Any, clock_offset: float) -> ZeroMemory:
    """The inverse of `dump_zero`; never raises (what does not parse starts afresh)."""
    if not isinstance(data, Mapping):
        return ZeroMemory()

    def at(value: Any) -> float | None:
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value) - clock_offset
        return None

    text = data.get("forecast")
    forecast = None
    if isinstance(text, str):
        forecast = forecasts_from_json(policy, text).get(FORECAST_NAME)
    idle = IdleState(zero_since=at(data.get("zeroSince")))
    return ZeroMemory(idle=idle, forecast=forecast)


def zero_persist_key(memory: ZeroMemory) -> tuple[Any, ...]:
    """What a restarted operator would decide differently from: whether the pool is at zero,
    and the forecast's learned profile (it moves once per bucket, at most every 15 minutes,
    and not at all once a quiet bucket's visits are counted). The idle timer is not written
    (it moves with every request); a restart restarts it, so the pool waits one more
    `after_seconds` before zero: the safe side."""
    f = memory.forecast
    return (
        memory.idle.zero_since is not None,
        None if f is None else (f.profile, f.counts),
    )


# ------------------------------------------------------------------------------------------
# Quiet services: what the control loop need not look at every second.

QUIET_REASONS = frozenset({"steady", REASON_FLOOR_MIN, REASON_AT_ZERO})


def is_quiet(decision: ScaleDecision, observation: Observation, max_age_seconds: float) -> bool:
    """Whether a pool has nothing going on: no request seen (fresh metrics, nothing queued or
    in flight, an arrival rate known to be zero: an unknown one, e.g. a pod's counters just
    reset, is looked at again next tick rather than left to the slow one, which would then
    find the rate moved and write the status in a quiet minute), no replica beyond those
    asked for (ready or on its way: nothing to remove), and a decision with nothing pending
    (steady, at its floor, or at zero: no scale-down delay running). The idle timer towards
    zero may run: on a slow tick it ends late by at most one period, on a timer of minutes.

    Replicas asked for but not ready yet (not created, or warming) leave a pool quiet: what
    comes next for them is a pod event (created, ready), which wakes the loop, and with no
    ready replica there is no traffic to serve. So 1,000 services created at once do not each
    tick every second while they wait for their children.

    The shell may then tick it on a slow timer and on events instead of every second; a busy
    pool, or one with a decision under way, keeps the one-second loop."""
    obs = observation
    fresh = (
        obs.queue_depth is not None
        and obs.metrics_age_seconds is not None
        and obs.metrics_age_seconds <= max_age_seconds
    )
    return (
        fresh
        and obs.queue_depth == 0
        and obs.arrival_rate == 0
        and not decision.hold
        and decision.reason in QUIET_REASONS
        and decision.promote_standby == 0
        and obs.pending_unschedulable == 0
        and obs.ready_serving <= decision.desired_serving
        and obs.ready_standby <= decision.desired_standby
        and obs.ready_serving + obs.ready_standby + obs.warming
        <= decision.desired_serving + decision.desired_standby
    )


def hold_until_served(
    decision: ScaleDecision, scaler: ScalerState, served: bool, waited_seconds: float
) -> tuple[ScaleDecision, ScalerState]:
    """Keep one replica of a service that has never had a Ready replica (``served`` False),
    whatever the idle verdict, for up to `FIRST_READY_WAIT_SECONDS` (``waited_seconds``: since
    the operator first saw the service).

    Why: a new service with ``scaleToZeroAfterSeconds: 0`` (or a short one) would otherwise go
    to zero seconds after creation, before its first replica loaded anything: an engine that
    cannot load would never be seen (no pod, no EngineLoadFailed) and the first caller would
    find out. Knative likewise reaches its initial scale before it scales a revision down.
    Past the deadline the replica goes (a broken service must not hold a GPU for ever); the
    status then says the pool is at zero without having served (``NotYetServed``).
    """
    if served or decision.desired_serving > 0 or waited_seconds >= FIRST_READY_WAIT_SECONDS:
        return decision, scaler
    return (
        replace(decision, desired_serving=1, reason=REASON_WAIT_FIRST_READY),
        replace(scaler, desired_serving=1),
    )
