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
* A quick zero only where it pays on expected cost: the idle timer is the wake lead instead
  of `after_seconds` when every 15-minute bucket of the next `after_seconds` (and one bucket
  more, the profile's resolution) is trusted (learned over `profile_min_periods` days) and
  zero now costs less than keeping the replica to the end of the timer (`quick_zero_pays`):
  the GPU-seconds saved against the requests expected in that time, each of which the timer
  would have served warm and zero makes late, priced at `late_request_gpu_seconds` (the
  user's `lateRequestGpuSeconds`, default one GPU-hour). With arrivals at the forecast's peak
  rate r over the rest of the timer's window W, zero saves (1 - e^(-rW)) / r GPU-seconds and
  makes (1 - e^(-rW)) requests late on average, so it pays exactly when r < 1 / price,
  whatever W: at the default price a night of two requests an hour keeps the timer (the issue
  45 trace, where zeroing at the wake lead was later than the timer on every seed), a night
  of under one request an hour goes at the wake lead. The old rule (r below `wake_rate`, one
  request per `after_seconds`) was this rule at a price of 300 GPU-seconds. A service whose
  forecast has not learned those hours (new, or never seen at this hour) keeps
  `after_seconds`.
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

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .autoscaler import (
    REASON_FLOOR_MIN,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
)
from .forecast import (
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
# One GPU-hour per late request: a quick zero goes only where fewer than one request an hour
# is expected (see `quick_zero_pays`).
DEFAULT_LATE_REQUEST_GPU_SECONDS = 3600.0


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
    # The user's price of one late request, in GPU-seconds: a quick zero must save more GPU
    # time than this per request it makes late (`quick_zero_pays`).
    late_request_gpu_seconds: float = DEFAULT_LATE_REQUEST_GPU_SECONDS

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.after_seconds) and self.after_seconds >= 0):
            problems.append("after_seconds must be finite and >= 0")
        if not self.wake_margin_seconds >= 0 or not self.default_routable_seconds >= 0:
            problems.append("wake_margin_seconds and default_routable_seconds must be >= 0")
        if self.wake_rate is not None and not self.wake_rate > 0:
            problems.append("wake_rate must be > 0")
        if not self.late_request_gpu_seconds > 0:
            problems.append("late_request_gpu_seconds must be > 0")
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
    """How long an awake pool waits without demand before zero: the wake lead where the
    forecast vouches for the next `after_seconds` and a zero then pays (`quick_zero_pays`),
    else `after_seconds`; never longer than `after_seconds`."""
    lead = signals.lead_seconds
    if lead is None:
        lead = policy.default_routable_seconds + policy.wake_margin_seconds
    if signals.quiet_rate is None or lead >= policy.after_seconds:
        return policy.after_seconds
    if not quick_zero_pays(signals.quiet_rate, policy.after_seconds - lead, policy):
        return policy.after_seconds
    return lead


@dataclass(frozen=True, slots=True)
class ZeroCost:
    """What zero now instead of at the end of the idle timer is expected to bring:
    `gpu_seconds_saved` of replica time against `late_requests` that the timer would have
    served warm (arrivals Poisson at `rate` over the `window_seconds` left of the timer)."""

    rate: float
    window_seconds: float
    gpu_seconds_saved: float
    late_requests: float

    def pays(self, late_request_gpu_seconds: float) -> bool:
        return self.gpu_seconds_saved > self.late_requests * late_request_gpu_seconds


def zero_cost(rate: float, window_seconds: float) -> ZeroCost:
    """The expected cost of zero now (`ZeroCost`). The replica would stay until the first
    arrival or the end of the window, E[min(T, W)] = (1 - e^(-rW)) / r; a request arrives in
    the window (and finds zero, late) with probability 1 - e^(-rW)."""
    window = max(window_seconds, 0.0)
    rate = max(rate, 0.0)
    if rate * window < 1e-12:
        return ZeroCost(rate, window, window, rate * window)
    late = -math.expm1(-rate * window)
    return ZeroCost(rate, window, late / rate, late)


def quick_zero_pays(rate: float, window_seconds: float, policy: ZeroPolicy) -> bool:
    """Whether going to zero `window_seconds` before the idle timer would saves more GPU time
    than the late requests it is expected to cause cost at the user's price."""
    return zero_cost(rate, window_seconds).pays(policy.late_request_gpu_seconds)


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
    more where the rate of the requests held at the gateway (`held_rate`) needs more of the
    pool's learned capacity. With `min_replicas > 0` this is `decide_scale` unchanged.
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
        obs = replace(
            obs,
            queue_depth=obs.queue_depth if obs.queue_depth is not None else 0.0,
            arrival_rate=max(obs.arrival_rate or 0.0, held_rate(zero, signals)),
        )
    decision, new_scaler = decide_scale(_floored(policy, verdict.floor), obs, scaler)
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


@functools.lru_cache(maxsize=256)
def _floored(policy: ScalingPolicy, floor: int) -> ScalingPolicy:
    """`policy` with `min_replicas` = floor (cached: the same few policies every tick, and a
    policy's validation is not free)."""
    return replace(policy, min_replicas=floor)


def held_rate(policy: ZeroPolicy, signals: IdleSignals) -> float:
    """The arrival rate the requests held at the gateway stand for: held / the wake lead.

    Requests are held only while no replica is routable, and a pool at zero wakes at the first
    of them, so the ones held arrived within about one wake (time-to-routable plus the margin)
    and are answered together when the first replica is routable: a pool that serves them at
    that rate keeps up with them and with what follows at the same pace. The autoscaler turns
    the rate into replicas with the capacity it has learned; before it has learned any (a
    service's first wake) it cannot, and one replica starts: the held requests are a burst
    that one replica's batches drain, and the queue it reports once routable sizes the pool
    from there. (Held requests counted as queued concurrency, as before, sized a first wake by
    held / the queue target: 23 held -> 6 replicas for a burst one replica serves.)"""
    lead = signals.lead_seconds
    if lead is None:
        lead = policy.default_routable_seconds + policy.wake_margin_seconds
    return signals.held / max(lead, 1.0)


# ------------------------------------------------------------------------------------------
# The service's own demand forecast (the fleet's forecast core, one "model" per service) and
# what of it all survives an operator restart (status.autoscaler.state, key "zero").

FORECAST_NAME = "service"


@dataclass(frozen=True, slots=True)
class ZeroMemory:
    """The idle timer, the service's learned demand (`forecast`, on wall time) and what is
    needed to count every arrival once.

    `refuted`: today's demand has contradicted the learned usual rate (see `learn_demand`):
    until demand is back or the usual busy hours end, the forecast wakes nothing and holds
    nothing (`forecast_peak` says None); requests still wake the pool. `counted_to`: the wall
    time up to which arrivals are folded into the forecast; `uncounted`: arrivals reported
    since then (they belong to the next sample); `gateways`: the last cumulative arrival count
    each gateway pod reported (`count_arrivals`); `evidence`: the usual requests expected and
    the requests seen since the evidence last restarted (see `learn_demand`). None of these
    but the forecast is written to status: a restarted operator trusts the forecast again
    (the safe side) and starts counting at its first report."""

    idle: IdleState = IdleState()
    forecast: ModelForecast | None = None
    refuted: bool = False
    counted_to: float | None = None
    uncounted: float = 0.0
    gateways: tuple[tuple[str, int], ...] = ()
    evidence: tuple[float, float, float, float] = (0.0, 0.0, 0.0, -1.0)


# Refuted when the requests seen since the usual rise are this improbable under the usual rate
# (Poisson, one-sided): e^-4.6 = 1 % for none at all where 4.6 were expected. 1 %, not 5 %:
# the test is repeated every sample, and a false refutation costs the late day a cold wake.
REFUTE_PROBABILITY = 0.01
# Evidence counts only in buckets learned within 10 % of the day's busiest, from one bucket
# after the first such sample of the day: the profile weighs its days (each visit by
# `profile_alpha`), so on 90 % of the learned days, as weighed, the rise had come by the
# start of the first of them. A bucket on the rising edge is not past the rise, however recent
# early rises have lifted it (two early days weigh 51 %), and a day whose rise is late by up
# to a bucket (two learned days rising at 8:52 and 9:05 put the 9:00 bucket near the peak; a
# third rising at 9:08 is not refuted at 9:00) is not refuted.
REFUTE_PEAK_FRACTION = 0.9
NO_EVIDENCE = (0.0, 0.0, 0.0, -1.0)
# A refuted forecast is restored by a bucket whose requests are not improbably few for this
# share of its usual rate.
DEMAND_BACK_SHARE = 0.5


# Longer since the last count: one sample for the whole gap (at most 720 samples per call).
LONGEST_COUNTED_GAP_SECONDS = 3600.0


def count_arrivals(
    seen: tuple[tuple[str, int], ...], reports: Mapping[str, int]
) -> tuple[tuple[tuple[str, int], ...], float]:
    """The arrivals since the last reports, from each gateway pod's cumulative count: a pod's
    count that grew adds the difference, one that fell (the pod restarted) adds its new count,
    and a pod seen for the first time adds nothing (its count is the baseline: a restarted
    operator must not learn a gateway's whole history as one instant). Pods no longer reported
    are forgotten. Returns the counts to remember and the new arrivals."""
    last = dict(seen)
    new = 0
    for pod, count in reports.items():
        before = last.get(pod)
        if before is not None:
            new += count - before if count >= before else count
    return tuple(sorted(reports.items())), float(new)


def learn_demand(
    policy: ForecastPolicy,
    memory: ZeroMemory,
    arrivals: float | None,
    wall: float,
    wake_rate: float | None = None,
) -> ZeroMemory:
    """Fold the `arrivals` reported since the last call (a count: every request the gateway
    saw, those it held at zero and those that woke the pool included; None: unknown, kept for
    the next report, which covers the same interval) into the forecast.

    Counts, not rate samples: the interval since `counted_to` is cut into samples of exactly
    `policy.sample_interval_seconds` (the forecast's smoothing weights are per that interval),
    each carrying the interval's mean rate, and the part of the interval too short for a
    sample is carried to the next call with its share of the arrivals. So a request is counted
    once whatever the cadence of the calls (a quiet loop's slow ticks, a poke a second after
    the last tick), and a bucket learns its arrivals over its length. A gap longer than
    `LONGEST_COUNTED_GAP_SECONDS` (an operator stalled: its loops tick every few seconds) is
    one sample, at its end.

    With `wake_rate` (the rate at which a forecast wakes a pool) it also keeps `refuted`: set
    as soon as the requests seen since the usual rise are improbably few (Poisson probability
    at most `REFUTE_PROBABILITY`) for the usual rate learned there, and fewer than the wake
    rate would bring. The evidence accumulates over every sample that lies past the usual rise
    (in a trusted bucket learned within `REFUTE_PEAK_FRACTION` of the day's busiest, one bucket
    or more after the first such sample: a rise late by a bucket is no evidence), across
    buckets, and is judged at every sample: not held back until a bucket closes, and not only
    one bucket's. It is
    cleared (and the evidence restarted) when a bucket closes that brought `wake_rate` or more
    and not improbably little for its usual rate (demand is back: not one sporadic request,
    nor a weekend's sparse hours under a weekday profile), and once the usual busy hours are
    over (a trusted bucket learned below `wake_rate`). A weekend day under a weekday profile is the
    case: woken for a rise that does not come, the pool goes back to zero minutes into the
    first bucket past the rise and wakes on demand only for the rest of those hours."""
    if arrivals is None or not math.isfinite(arrivals):
        return memory
    arrivals = max(arrivals, 0.0)
    start = memory.counted_to
    interval = policy.sample_interval_seconds
    if start is not None and start - LONGEST_COUNTED_GAP_SECONDS <= wall < start:
        # Counts read before the last ones were counted up to (another gateway pod's older
        # answer): they belong to the next sample.
        return replace(memory, uncounted=memory.uncounted + arrivals)
    if start is None or wall < start:
        # The first report (or the clock went back): the count starts at the interval's
        # start, so that samples tile the buckets (whose edges are multiples of it).
        return replace(memory, counted_to=math.floor(wall / interval) * interval, uncounted=0.0)
    pending = memory.uncounted + arrivals
    elapsed = wall - start
    if elapsed > LONGEST_COUNTED_GAP_SECONDS:
        samples, step, stamp = 1, elapsed, elapsed
    else:
        samples, step = math.floor(elapsed / interval + 1e-9), interval
        stamp = step / 2  # a sample falls in the bucket of its middle
    if samples == 0:
        return memory if arrivals == 0 else replace(memory, uncounted=pending)
    rate = pending / elapsed
    forecast, refuted, evidence = memory.forecast, memory.refuted, memory.evidence
    for i in range(samples):
        at = start + i * step + stamp
        forecast, refuted, evidence = _sample(
            policy, forecast, refuted, evidence, rate, at, step, wake_rate
        )
    counted_to = start + samples * step
    return replace(
        memory,
        forecast=forecast,
        refuted=refuted,
        evidence=evidence,
        counted_to=counted_to,
        uncounted=pending * max(wall - counted_to, 0.0) / elapsed,
    )


def _sample(
    policy: ForecastPolicy,
    before: ModelForecast | None,
    refuted: bool,
    evidence: tuple[float, float, float, float],
    rate: float,
    at: float,
    seconds: float,
    wake_rate: float | None,
) -> tuple[ModelForecast, bool, tuple[float, float, float, float]]:
    """One sample of `seconds` ending at `at`, and the refutation it moves."""
    after = observe(policy, before, rate, at)
    if wake_rate is None or not wake_rate > 0:
        return after, False, NO_EVIDENCE
    closed = before is not None and before.samples > 0 and after.open_slot != before.open_slot
    if closed and before is not None and _demand_back(policy, before, wake_rate, seconds):
        refuted, evidence = False, NO_EVIDENCE  # a bucket of demand closed: it is back
    if after.slots != policy.slots:
        return after, refuted, evidence
    slot = after.open_slot % policy.slots
    trusted = after.counts[slot] >= policy.profile_min_periods
    usual = after.profile[slot]
    if trusted and usual < wake_rate:
        return after, False, NO_EVIDENCE  # the usual busy hours are over (or not begun)
    peak = max((p for p, c in zip(after.profile, after.counts, strict=True) if c), default=0.0)
    if trusted and usual >= REFUTE_PEAK_FRACTION * peak:
        since = evidence[3] if evidence[3] >= 0 else at
        if at - since < policy.slot_seconds:  # a rise late within a bucket is no evidence
            return after, refuted, (*evidence[:3], since)
        expected, seen, span = (
            evidence[0] + usual * seconds,
            evidence[1] + rate * seconds,
            evidence[2] + seconds,
        )
        evidence = (expected, seen, span, since)
        few = seen < wake_rate * span  # fewer than the wake rate would bring
        if few and poisson_at_most(seen, expected) <= REFUTE_PROBABILITY:
            refuted = True
    return after, refuted, evidence


def _demand_back(
    policy: ForecastPolicy, closing: ModelForecast, wake_rate: float, seconds: float
) -> bool:
    """Whether the bucket `closing` is closing brought demand: the wake rate or more, and not
    improbably little for half its usual rate (`DEMAND_BACK_SHARE`: a day late or quieter than
    usual is back; a weekend's sparse late morning under a weekday profile is not, and must
    not restore a forecast that then holds the pool for it)."""
    if closing.open_n <= 0 or closing.open_sum / closing.open_n < wake_rate:
        return False
    if closing.slots != policy.slots:
        return True
    slot = closing.open_slot % policy.slots
    if closing.counts[slot] < policy.profile_min_periods:
        return True
    span = closing.open_n * seconds
    seen = closing.open_sum / closing.open_n * span
    usual = closing.profile[slot] * span
    return poisson_at_most(seen, DEMAND_BACK_SHARE * usual) > REFUTE_PROBABILITY


def poisson_at_most(seen: float, expected: float) -> float:
    """P(X <= seen) for X ~ Poisson(expected) (`seen` rounded down; 1.0 for no expectation).
    Summed in log space: e^-expected underflows for a busy bucket's thousands."""
    if not expected > 0:
        return 1.0
    n = math.floor(max(seen, 0.0) + 1e-9)
    if n > expected + 12.0 * math.sqrt(expected) + 12.0:
        return 1.0
    log_e = math.log(expected)
    logs = [k * log_e - expected - math.lgamma(k + 1.0) for k in range(n + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


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
# The glue: what the shell (`Controller._decide_zero`) and the simulator (`bench/zero_sim.py`)
# both call once per tick of a pool that may reach zero.


@dataclass(frozen=True, slots=True)
class ZeroTick:
    """What the shell gathered this tick for a pool that may reach zero.

    `mono`/`wall`: the tick's monotonic and wall time; `observation`: the pool's (runtime
    metrics); `held`: requests its gateway pods hold now; `arrivals`: each gateway pod's
    cumulative count of requests it received (None: no gateway reported one, e.g. an older
    gateway: the runtime's arrival rate is then learned instead), as read at wall time
    `arrivals_at` (None: now). The counts are learned up to when they were read, not up to
    the tick: the long-poll that carries them answers at each change of the held count,
    within `arrivals_every_seconds` of arrivals and otherwise every `held_wait_seconds`, so a
    tick between two answers knows nothing yet of the arrivals since the last one, and must
    not learn that interval as empty;
    `routable_seconds`: the
    measured time-to-routable of one replica (None: not measured yet); `quiet_tick_seconds`:
    how long a quiet loop may sleep (a forecast wake due within it is looked at every tick);
    `served`: whether a replica of the service has ever been Ready (as its status records),
    `waited_seconds`: since the operator first saw it (`hold_until_served`).
    """

    mono: float
    wall: float
    observation: Observation
    held: int = 0
    arrivals: Mapping[str, int] | None = None
    arrivals_at: float | None = None
    routable_seconds: float | None = None
    quiet_tick_seconds: float = 5.0
    served: bool = True
    waited_seconds: float = math.inf


@dataclass(frozen=True, slots=True)
class ZeroStep:
    """The tick's decision, the scaler's and the zero memory's next states, and `wake_soon`:
    at zero with a forecast wake due before the next slow tick (the loop must not sleep)."""

    decision: ScaleDecision
    scaler: ScalerState
    memory: ZeroMemory
    wake_soon: bool = False


def step_zero(
    policy: ScalingPolicy,
    zero: ZeroPolicy,
    forecast: ForecastPolicy | None,
    memory: ZeroMemory,
    scaler: ScalerState,
    tick: ZeroTick,
) -> ZeroStep:
    """One tick of a pool that may reach zero, from what the shell gathered to the decision.

    The forecast (`forecast`; None: none, the on-demand idle timer alone) learns the arrivals
    the gateway counted since the last tick (`count_arrivals`, `learn_demand`), is asked for
    its peak over the wake lead and for the coming idle window, and `decide_scale_zero`
    decides; not to zero before a first replica was Ready (`hold_until_served`: the memory
    and `wake_soon` stay the idle verdict's). Metrics count as known when fresh
    (`max_metrics_age_seconds`); an arrival the gateway counted since the last tick is
    activity whatever the runtime's metrics say.
    """
    obs = tick.observation
    fresh = (
        obs.queue_depth is not None
        and obs.metrics_age_seconds is not None
        and obs.metrics_age_seconds <= policy.max_metrics_age_seconds
    )
    rate = obs.arrival_rate if fresh else None
    new: float | None = None
    if tick.arrivals is not None:
        gateways, new = count_arrivals(memory.gateways, tick.arrivals)
        if gateways != memory.gateways:
            memory = replace(memory, gateways=gateways)
    lead = wake_lead(zero, tick.routable_seconds)
    peak = quiet = None
    if forecast is not None:
        counted, counted_at = new, tick.wall
        if counted is not None and tick.arrivals_at is not None:
            counted_at = min(tick.arrivals_at, tick.wall)
        if counted is None and rate is not None:
            start = memory.counted_to
            counted = 0.0 if start is None else rate * max(tick.wall - start, 0.0)
        memory = learn_demand(forecast, memory, counted, counted_at, zero.wake_threshold)
    active = None
    if fresh:
        active = (obs.queue_depth or 0.0) > 0 or (obs.arrival_rate or 0.0) > 0
    if new and (scaler.desired_serving or 0) > 0:
        # Arrivals the gateway reported since the last read mean activity while the pool
        # serves. At zero every request is held (`tick.held` wakes the pool at once): counts
        # read then are requests forwarded before the pool went to zero, reported by the
        # long-poll up to 25 s late, and must not wake it again (`wake:request` with nothing
        # held, seen on the real node after every scale to zero).
        active = True
    if forecast is not None:
        peak = forecast_peak(forecast, memory, tick.wall, lead)
        if active is False and tick.held == 0:  # only an idle pool's timer asks (a busy
            # pool's tick, every second, need not walk the coming buckets)
            quiet = forecast_quiet_peak(forecast, memory, tick.wall, zero.after_seconds)
    signals = IdleSignals(
        tick.mono,
        active=active,
        held=tick.held,
        forecast_rate=peak,
        quiet_rate=quiet,
        lead_seconds=lead,
    )
    decision, new_scaler, idle = decide_scale_zero(policy, zero, obs, scaler, signals, memory.idle)
    memory = replace(memory, idle=idle)
    soon = False
    if decision.desired_serving == 0 and forecast is not None:
        ahead = forecast_peak(forecast, memory, tick.wall, lead + tick.quiet_tick_seconds)
        soon = ahead is not None and ahead >= zero.wake_threshold
    decision, new_scaler = hold_until_served(decision, new_scaler, tick.served, tick.waited_seconds)
    return ZeroStep(decision, new_scaler, memory, soon)


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


def quiet_period(
    quiet_tick_seconds: float,
    watched_quiet_tick_seconds: float,
    timerless: bool,
    parked: bool,
) -> float:
    """How long a quiet loop sleeps unless poked: `watched_quiet_tick_seconds` when every pod's
    activity long-poll is parked (`parked`: the first request pokes the loop) and no idle timer
    or forecast runs (`timerless`: minReplicas >= 1), else the slow timer."""
    if timerless and parked:
        return max(watched_quiet_tick_seconds, quiet_tick_seconds)
    return quiet_tick_seconds
