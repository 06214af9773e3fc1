"""The autoscaler's decision: how many replicas a pool should serve with, and how many to keep warm.

Owns `decide_scale`, a pure function of a `ScalingPolicy` (from the spec's autoscaling section),
an `Observation` (counts and signals the shell gathered) and the previous `ScalerState`; it
returns a `ScaleDecision` carrying a short machine-friendly reason and the inputs it used, plus
the next state. It never reads the clock: `Observation.now` is monotonic seconds from the shell.
Also owns what a replica can do (`estimate_capacity`, learned from the runtime's batch counters)
and the state's persisted form (`dump_state` / `load_state`).

Capacity, in the units the service really has: the runtime counts, per completed batch, its
rows, requests and the seconds it held an execution slot (`WorkSample`). Their decayed sums
(`CapacityMemory`, in the state) fit batch time = a + b x rows by least squares, so one replica
serves `slots x rows / time(rows)` requests per second at saturation (evaluated at the largest
batch the evidence supports) and holds `slots x rows` requests in service when it does: the
concurrency at which latency starts to rise. The service time is measured whether or not the
pool is saturated, so a pool that starts saturated knows its capacity from the first batches.

How demand is estimated (in replicas):

* Flow: the arrival rate now over what one replica serves at the target, `target_utilization`
  x capacity, or the rate expected when a replica created now will be warm (the rate now plus
  its trend over `trend_window_seconds`, times the measured warm-up time) at
  `projected_utilization` x capacity, whichever is more. When the user set
  `target_queue_depth`, its old meaning: concurrency per replica, with the seconds of
  concurrency one request holds learned from queue depth / arrival rate while not saturated
  (the queue within its target, or, capacity known, the execution slots less than half busy:
  time held outside the batcher is no backlog), and only in a steady state, where Little's
  law holds: not on the tick after a saturated one (it may drain a backlog, which is no time
  a request holds) nor while the rate steps (a rate that rose within the interval lags the
  queue read at its end); until then the learned capacity's service time; without either,
  the queue over the target, at most doubling the pool per decision.
  The backlog allowance and the bound below apply in both modes.
* Backlog: requests waiting beyond what the ready replicas hold in service, plus what they
  fall behind by until the replicas on the way are warm, counting only requests that can
  still be served within their deadline (the runtime reports queued requests that cannot, and
  its request timeout, which ages the backlog while capacity warms). It is drained over
  `backlog_drain_seconds` and bounded by `max_backlog_share` of the flow: a backlog is a
  stock, not a flow, and the clients of its oldest requests give up.
* Bound: when capacity and the arrival rate are known, no term (backlog, P99, queue) sizes
  beyond the larger of flow + backlog allowance and arrival / capacity x (1 + `max_headroom`),
  so a saturated pool never runs to `max_replicas`. Without capacity (a runtime without the
  batch counters, or before its first batch) the queue over the target concurrency is the
  demand, and each decision at most doubles the pool until capacity is known.
* Hot P99 approaching its target (`p99_approach`) asks for more replicas than are ready even when
  queues look fine, once earlier additions have had time to show in the (lagging) percentile.

Warming replicas count as capacity on the way (demand is compared with replicas asked for, not
with ready ones). Scale-down follows the largest recommendation over the last
`scale_down_delay_seconds` of fresh metrics, and scale-up needs demand beyond a tolerance, so
that noise cannot make the pool flap. Missing or stale metrics hold the pool where it is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# Reasons (a closed vocabulary the shell copies into status, Events and metrics labels).
REASON_STEADY = "steady"
REASON_HOLD_STALE = "hold:metrics-stale"
REASON_HOLD_MISSING = "hold:metrics-missing"
REASON_SURGE_QUEUE = "surge:queue"
REASON_SURGE_RATE = "surge:rate"
REASON_SURGE_TREND = "surge:trend"
REASON_P99 = "p99-approaching-target"
REASON_WAIT_DOWN = "wait:scale-down-delay"
REASON_DOWN_IDLE = "scale-down:idle"
REASON_DOWN_LOW = "scale-down:low-load"
REASON_CAPPED_MAX = "capped:max"
REASON_FLOOR_MIN = "floor:min"
REASON_RATE_LIMITED = "rate-limited"
REASON_UNSCHEDULABLE = "unschedulable"
NOTE_PROMETHEUS_UNAVAILABLE = "prometheus unavailable: scale-down held"

# Notes (free text beside the reason) for the two bounds added with capacity learning.
NOTE_CAPACITY_BOUND = "capacity-bound"
NOTE_LEARNING = "capacity not learned yet: at most doubling"

# Small slack so that a demand of exactly 3.0 replicas computed in floating point as 3.0000001
# does not round up to 4.
_EPS = 1e-9


class AutoscalingSpec(Protocol):
    """The fields of the InferenceService's `spec.autoscaling` that the policy is built from."""

    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def target_utilization(self) -> float: ...
    @property
    def target_queue_depth(self) -> float | None: ...
    @property
    def target_p99_ms(self) -> float | None: ...
    @property
    def standby_replicas(self) -> int: ...
    @property
    def max_standby_replicas(self) -> int | None: ...
    @property
    def scale_down_delay_seconds(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How one pool scales. Field names follow `spec.autoscaling` (snake_case here).

    `max_replicas` bounds all pods of the pool (serving plus standby: it is the GPU budget); the
    standby pool shrinks when serving needs those GPUs. `min_replicas` bounds serving replicas.
    """

    min_replicas: int = 1
    max_replicas: int = 10
    # Share of a replica's learned capacity (requests/s at saturation) to load it with.
    target_utilization: float = 0.7
    # The rate projected for when new replicas are warm may load them up to this share (the
    # target's headroom is for noise now; spending part of it on a forecast is not paying
    # for the same risk twice). Utilisation mode only; below the target: the target.
    projected_utilization: float = 0.8
    # In-flight plus queued requests per ready serving replica to aim for; None: the target is
    # `target_utilization` of the learned capacity.
    target_queue_depth: float | None = None
    # Hot-path P99 to stay under; None: the queue signal alone decides.
    target_p99_ms: float | None = None
    standby_replicas: int = 0
    # Set (above standby_replicas): the standby is sized from the surges the pool has seen —
    # the largest rise of the arrival rate within one warm-up, remembered with a half-life of
    # `surge_memory_seconds` — in replicas of learned capacity at the target utilisation,
    # between standby_replicas and this. None: standby_replicas, fixed.
    max_standby_replicas: int | None = None
    surge_memory_seconds: float = 3600.0
    # A rise is measured over the warm-up (what new replicas cannot cover), at most this long.
    max_surge_window_seconds: float = 120.0
    scale_down_delay_seconds: float = 300.0
    # The shell should call decide_scale at least this often; documents the contract.
    tick_seconds: float = 1.0
    # Per decision, the pool may grow to max(current * rate, current + step).
    max_scale_up_rate: float = 10.0
    max_scale_up_step: int = 4
    # P99 at this fraction of its target already asks for more replicas.
    p99_approach: float = 0.8
    # One P99-driven decision adds at most this factor of the ready replicas.
    p99_max_factor: float = 1.5
    # The P99 window of the metrics pipeline: P99 still reflects the past for this long.
    p99_window_seconds: float = 30.0
    # Demand within this fraction above the replicas asked for adds none (hysteresis).
    tolerance: float = 0.1
    # Metrics older than this hold the pool.
    max_metrics_age_seconds: float = 5.0
    # Warm-up time assumed until the shell has measured one.
    default_warmup_seconds: float = 30.0
    trend_window_seconds: float = 10.0
    # The projection may not exceed this multiple of the current demand (noise guard).
    max_trend_factor: float = 3.0
    # A trend is extrapolated at most this many trend windows ahead, however long the warm-up
    # (a 10 s slope says little about the next minute).
    max_trend_horizon_windows: float = 3.0
    # Trend growth below this fraction of the current rate is treated as noise.
    trend_deadband: float = 0.1
    backlog_drain_seconds: float = 10.0
    # The backlog allowance is at most this share of the flow's replicas.
    max_backlog_share: float = 0.3
    # With capacity known, nothing sizes beyond the larger of flow + backlog allowance and
    # arrival / capacity x (1 + this) (1.0: P99 may push utilisation down to a half, no more).
    max_headroom: float = 1.0
    # Without a known per-request time, a decision at most multiplies the pool by this.
    learning_max_factor: float = 2.0
    # Queue mode, capacity known: the replicas' execution slots busier than this share of the
    # last interval mean the queue beyond the target is a backlog; less busy, it is time
    # requests hold concurrency outside the batcher, and teaches the per-request time.
    busy_share_saturated: float = 0.5
    # Target concurrency per replica before capacity is learned (utilisation mode).
    fallback_queue_depth: float = 4.0
    # Capacity evidence: old batches fade as new ones arrive, e-fold per this many batches.
    capacity_memory_batches: float = 2000.0
    # Fewer batches than this in memory: capacity is not known yet.
    min_capacity_batches: float = 10.0
    # Capacity is evaluated at most this multiple of the mean batch seen (up to maxBatchSize):
    # batches larger than any seen are an extrapolation, taken a step at a time.
    capacity_extrapolation: float = 4.0
    # Without a P99 target, scale-down needs no P99; with one, a missing P99 blocks scale-down
    # unless the pool is idle (no requests, so no percentile to measure).
    require_p99_for_scale_down: bool = True
    # Weight of a new sample in the per-request concurrency estimate.
    seconds_per_request_smoothing: float = 0.2
    # A per-request sample is taken only while the arrival rate is steady: within this factor
    # of the last tick's (a rate that stepped within the interval lags the queue read at its
    # end, and their ratio is no time a request holds).
    steady_rate_factor: float = 1.5

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.min_replicas <= self.max_replicas:
            problems.append("need 0 <= min_replicas <= max_replicas")
        if self.standby_replicas < 0:
            problems.append("standby_replicas must be >= 0")
        if self.max_standby_replicas is not None and (
            self.max_standby_replicas < self.standby_replicas
        ):
            problems.append("max_standby_replicas must be >= standby_replicas")
        if self.surge_memory_seconds <= 0 or self.max_surge_window_seconds <= 0:
            problems.append("surge_memory_seconds and max_surge_window_seconds must be > 0")
        if not 0 < self.target_utilization <= 1 or not 0 < self.projected_utilization <= 1:
            problems.append("target_utilization and projected_utilization must be in (0, 1]")
        if self.target_queue_depth is not None and self.target_queue_depth <= 0:
            problems.append("target_queue_depth must be > 0")
        if self.target_p99_ms is not None and self.target_p99_ms <= 0:
            problems.append("target_p99_ms must be > 0")
        if not 0 < self.tick_seconds <= 1.0:
            problems.append("tick_seconds must be in (0, 1]")
        if self.max_scale_up_rate < 1.0 or self.max_scale_up_step < 1:
            problems.append("max_scale_up_rate must be >= 1 and max_scale_up_step >= 1")
        if not 0 < self.p99_approach <= 1 or self.p99_max_factor < 1:
            problems.append("need 0 < p99_approach <= 1 and p99_max_factor >= 1")
        if self.scale_down_delay_seconds < 0 or self.tolerance < 0:
            problems.append("scale_down_delay_seconds and tolerance must be >= 0")
        if self.trend_window_seconds <= 0 or self.max_trend_factor < 1:
            problems.append("need trend_window_seconds > 0 and max_trend_factor >= 1")
        if self.max_trend_horizon_windows <= 0:
            problems.append("max_trend_horizon_windows must be > 0")
        if self.backlog_drain_seconds <= 0 or self.max_metrics_age_seconds <= 0:
            problems.append("backlog_drain_seconds and max_metrics_age_seconds must be > 0")
        if self.max_backlog_share < 0 or self.max_headroom < 0:
            problems.append("max_backlog_share and max_headroom must be >= 0")
        if self.learning_max_factor < 1 or self.fallback_queue_depth <= 0:
            problems.append("need learning_max_factor >= 1 and fallback_queue_depth > 0")
        if self.capacity_memory_batches <= 0 or self.min_capacity_batches < 1:
            problems.append("need capacity_memory_batches > 0 and min_capacity_batches >= 1")
        if self.capacity_extrapolation < 1:
            problems.append("capacity_extrapolation must be >= 1")
        if not 0 < self.seconds_per_request_smoothing <= 1:
            problems.append("seconds_per_request_smoothing must be in (0, 1]")
        if self.steady_rate_factor < 1:
            problems.append("steady_rate_factor must be >= 1")
        if problems:
            raise ValueError("invalid ScalingPolicy: " + "; ".join(problems))

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, **overrides: float | int | bool) -> ScalingPolicy:
        """Build the policy from the InferenceService's autoscaling section (plus tunables)."""
        fields: dict[str, float | int | bool | None] = {
            "min_replicas": spec.min_replicas,
            "max_replicas": spec.max_replicas,
            "target_utilization": spec.target_utilization,
            "target_queue_depth": spec.target_queue_depth,
            "target_p99_ms": spec.target_p99_ms,
            "standby_replicas": spec.standby_replicas,
            "max_standby_replicas": spec.max_standby_replicas,
            "scale_down_delay_seconds": float(spec.scale_down_delay_seconds),
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class BatchWork:
    """Completed batches over some interval, summed over pods and models: the increases of the
    runtime's ``tidal_backend_{batches,rows,requests,seconds,row_seconds,rows_squared}_total``.

    `seconds` is busy time (slot-seconds); `row_seconds` and `rows_squared` are the sums of
    rows x seconds and rows squared over the batches, what a least-squares fit of batch time
    against batch size needs. Every field is >= 0.
    """

    batches: float = 0.0
    rows: float = 0.0
    requests: float = 0.0
    seconds: float = 0.0
    row_seconds: float = 0.0
    rows_squared: float = 0.0

    def __post_init__(self) -> None:
        for name in _WORK_FIELDS:
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"BatchWork.{name} must be finite and >= 0")

    def plus(self, other: BatchWork) -> BatchWork:
        return BatchWork(*(getattr(self, n) + getattr(other, n) for n in _WORK_FIELDS))

    def scaled(self, factor: float) -> BatchWork:
        return BatchWork(*(getattr(self, n) * factor for n in _WORK_FIELDS))


_WORK_FIELDS = ("batches", "rows", "requests", "seconds", "row_seconds", "rows_squared")


@dataclass(frozen=True, slots=True)
class WorkSample:
    """The pool's batch work since the last observation, and the shape of one replica:
    `slots` batches execute at once, each of at most `max_batch_rows` rows."""

    work: BatchWork
    slots: int = 1
    max_batch_rows: int = 1

    def __post_init__(self) -> None:
        if self.slots < 1 or self.max_batch_rows < 1:
            raise ValueError("slots and max_batch_rows must be >= 1")


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica of the pool can do, learned from its batches.

    `per_replica_rate`: requests per second at saturation; `knee_concurrency`: requests it
    holds in service then (latency rises beyond it); `seconds_per_request`: the time one
    request holds that concurrency (knee / rate, the service time of a batch).
    """

    per_replica_rate: float
    knee_concurrency: float
    batch_rows: float
    batch_seconds: float

    @property
    def seconds_per_request(self) -> float:
        return self.knee_concurrency / self.per_replica_rate


@dataclass(frozen=True, slots=True)
class CapacityMemory:
    """Decayed sums of the pool's batch work (old batches fade as new ones arrive, never with
    time alone: an idle pool keeps what it learned)."""

    work: BatchWork = field(default_factory=BatchWork)
    slots: int = 1
    max_batch_rows: int = 1


def learn_capacity(
    policy: ScalingPolicy, memory: CapacityMemory | None, sample: WorkSample | None
) -> CapacityMemory | None:
    """Fold one observation's batch work into the memory."""
    if sample is None or sample.work.batches <= 0:
        return memory
    old = memory.work if memory is not None else BatchWork()
    keep = math.exp(-sample.work.batches / policy.capacity_memory_batches)
    return CapacityMemory(old.scaled(keep).plus(sample.work), sample.slots, sample.max_batch_rows)


def estimate_capacity(policy: ScalingPolicy, memory: CapacityMemory | None) -> Capacity | None:
    """One replica's capacity from the batches in memory; None while there are too few.

    Batch time is fitted as a + b x rows (least squares, a and b >= 0). Without spread in batch
    sizes there is nothing to fit and time is taken as proportional to rows (a = 0), which is
    conservative: throughput grows with the batch only as far as the evidence shows. Capacity
    is evaluated at the largest batch the replica forms, `max_batch_rows`, but at most
    `capacity_extrapolation` times the mean batch seen.
    """
    if memory is None:
        return None
    w = memory.work
    if w.batches < policy.min_capacity_batches or w.seconds <= 0 or w.rows <= 0:
        return None
    n = w.batches
    mean_rows, mean_seconds = w.rows / n, w.seconds / n
    var_rows = w.rows_squared / n - mean_rows**2
    slope = mean_seconds / mean_rows
    if var_rows > (0.05 * mean_rows) ** 2:
        cov = w.row_seconds / n - mean_rows * mean_seconds
        slope = min(max(cov / var_rows, 0.0), mean_seconds / mean_rows)
    intercept = max(mean_seconds - slope * mean_rows, 0.0)
    rows = min(float(memory.max_batch_rows), policy.capacity_extrapolation * mean_rows)
    rows = max(rows, mean_rows)
    seconds = intercept + slope * rows
    if seconds <= 0:
        return None
    requests_per_row = w.requests / w.rows if w.requests > 0 else 1.0
    knee = memory.slots * rows * requests_per_row
    return Capacity(
        per_replica_rate=knee / seconds,
        knee_concurrency=knee,
        batch_rows=rows,
        batch_seconds=seconds,
    )


@dataclass(frozen=True, slots=True)
class Observation:
    """What the shell saw of one pool at `now` (monotonic seconds).

    `queue_depth` is the pool's total of queued plus in-flight requests on serving replicas;
    None means the signal is missing. `metrics_age_seconds` is the age of the oldest signal used
    (None: unknown, treated as stale). `warming` counts pods created and scheduled but not ready
    yet; `pending_unschedulable` pods the scheduler cannot place (no GPU) and are not capacity.
    `unreachable`: queued requests that cannot be served before their deadline any more (not
    demand); `deadline_seconds`: the requests' deadline from arrival (None: none); `work`: the
    batches completed since the last observation (None: the runtime does not report them).
    """

    now: float
    ready_serving: int
    warming: int = 0
    ready_standby: int = 0
    pending_unschedulable: int = 0
    queue_depth: float | None = 0.0
    hot_p99_ms: float | None = None
    arrival_rate: float | None = None
    warmup_seconds: float | None = None
    metrics_age_seconds: float | None = 0.0
    unreachable: float | None = None
    deadline_seconds: float | None = None
    work: WorkSample | None = None
    # Prometheus does not answer: its signals (hot P99, the SLO's) are unknown, so nothing may
    # be removed on the pods' signals alone; scale-up still follows them.
    prometheus_unavailable: bool = False

    def __post_init__(self) -> None:
        counts = (self.ready_serving, self.warming, self.ready_standby, self.pending_unschedulable)
        if min(counts) < 0:
            raise ValueError("replica counts must be >= 0")
        for name in (
            "queue_depth",
            "hot_p99_ms",
            "arrival_rate",
            "warmup_seconds",
            "unreachable",
            "deadline_seconds",
        ):
            value = getattr(self, name)
            if value is not None and (value < 0 or math.isnan(value)):
                raise ValueError(f"{name} must be >= 0 (or None when missing)")

    @property
    def pods(self) -> int:
        """All pods of the pool, ready or not."""
        return self.ready_serving + self.warming + self.ready_standby + self.pending_unschedulable


def with_gateway_held(observation: Observation, held: int) -> Observation:
    """The pool's queue with the requests its gateway holds for a free slot (the burst
    buffer): they wait for these replicas as surely as the replicas' own queues, and would be
    invisible to the autoscaler if the buffer hid them. At zero they are a wake's demand
    instead (``core.idle.held_rate``), not queued concurrency: left out there."""
    if held <= 0 or observation.ready_serving == 0 or observation.queue_depth is None:
        return observation
    return replace(observation, queue_depth=observation.queue_depth + held)


@dataclass(frozen=True, slots=True)
class ScalerState:
    """What decide_scale remembers between ticks. Every field is bounded in size.

    `down_window` is a monotonic max-queue of (time, recommendation): strictly decreasing
    recommendations, so it holds at most max_replicas + 1 entries and its head is the largest
    recommendation of the last `scale_down_delay_seconds`.
    """

    desired_serving: int | None = None
    last_scale_up_at: float | None = None
    last_decision_at: float | None = None
    # Since when metrics have been fresh and P99 content without a break: scale-down needs
    # `scale_down_delay_seconds` of it.
    agreed_since: float | None = None
    down_window: tuple[tuple[float, int], ...] = ()
    # (time, demand signal) samples over the trend window: arrival rate, or queue depth.
    trend_samples: tuple[tuple[float, float], ...] = ()
    trend_signal: str = ""
    # Concurrency seconds one request holds while the pool is not saturated (Little's law).
    seconds_per_request: float | None = None
    # The pool's batch work, what its capacity is estimated from.
    capacity: CapacityMemory | None = None
    # Sliding-window minimum of the arrival rate over the surge window: (time, rate), rates
    # strictly increasing (bounded by the ticks of one window).
    rise_window: tuple[tuple[float, float], ...] = ()
    # The largest rise seen, (requests/s, when); it fades with `surge_memory_seconds`.
    surge: tuple[float, float] | None = None
    # Ready serving replicas at the last decision: the batch work since then was done by no
    # more than the fewer of these and the ready now (not persisted: a restart re-learns it).
    last_ready: int | None = None
    # The last per-request sample judged the pool saturated (kept through ticks that could not
    # judge): the next tick may be the one its backlog drains, and learns nothing (not
    # persisted, like last_ready).
    last_saturated: bool = False


@dataclass(frozen=True, slots=True)
class DecisionInputs:
    """The numbers a decision was made from, for status and Events."""

    ready_serving: int
    warming: int
    ready_standby: int
    pending_unschedulable: int
    queue_depth: float | None
    arrival_rate: float | None
    projected_rate: float | None
    hot_p99_ms: float | None
    warmup_seconds: float
    seconds_per_request: float | None
    demand_replicas: float
    p99_replicas: int
    window_max: int | None
    capacity_per_replica: float | None = None
    knee_concurrency: float | None = None
    backlog: float | None = None
    unreachable: float | None = None
    bound_replicas: float | None = None
    # The remembered surge (requests/s within one warm-up) the standby is sized for.
    surge_rate: float | None = None


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """What the pool should look like. The shell creates or deletes pods to reach
    `desired_total`, promotes `promote_standby` ready standby pods to serving at once, and labels
    the rest with `choose_standby`."""

    desired_serving: int
    desired_standby: int
    promote_standby: int
    reason: str
    inputs: DecisionInputs
    unschedulable: bool = False
    hold: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def desired_total(self) -> int:
        return self.desired_serving + self.desired_standby


@dataclass(frozen=True, slots=True)
class _Demand:
    """Replicas the load asks for, and what went into it."""

    replicas: float
    projected: float | None = None
    # Live requests the capacity on the way will find (None: not estimated).
    backlog: float | None = None
    # The most any term may ask for (None: capacity or rate unknown).
    bound: float | None = None
    # No per-request time known: scale-up is limited to `learning_max_factor`.
    learning: bool = False


def decide_scale(
    policy: ScalingPolicy, observation: Observation, state: ScalerState
) -> tuple[ScaleDecision, ScalerState]:
    """Decide the pool's size for this tick; deterministic, pure."""
    obs = observation
    current = _current_serving(policy, obs, state)
    warmup = obs.warmup_seconds if obs.warmup_seconds is not None else policy.default_warmup_seconds
    memory = learn_capacity(policy, state.capacity, obs.work)
    capacity = estimate_capacity(policy, memory)

    stale = _staleness(policy, obs)
    if stale is not None:
        return _hold(policy, obs, replace(state, capacity=memory), current, warmup, stale)

    assert obs.queue_depth is not None  # _staleness returns a reason when it is missing
    notes: list[str] = []
    remembered = _remembered_rate(policy, obs, state)
    if remembered is not None:
        # A rate is differenced from two scrapes, so the first tick after the pods (or the
        # operator) restarted has none; the last one measured stands in for a few seconds.
        obs = replace(obs, arrival_rate=remembered)
        notes.append("rate:remembered")
    trend_samples, signal = _record_trend(policy, obs, state)
    demand = _demand_replicas(policy, obs, state, trend_samples, warmup, capacity)
    p99_replicas = _p99_replicas(policy, obs, state, warmup)
    if demand.bound is not None and p99_replicas > math.ceil(demand.bound - _EPS):
        p99_replicas = max(math.ceil(demand.bound - _EPS), 0)
        notes.append(NOTE_CAPACITY_BOUND)
    # Hysteresis: queue demand must exceed the replicas asked for by the tolerance to add
    # any, while scale-down goes to the largest plain recommendation of the window, so a load
    # that wanders within the band moves nothing. (P99 has its own guard, see _p99_replicas.)
    by_demand = math.ceil(demand.replicas - _EPS)
    queue_up = by_demand if demand.replicas > current * (1.0 + policy.tolerance) else 0
    need_up = max(queue_up, p99_replicas)
    rec = _clamp(max(by_demand, p99_replicas), policy.min_replicas, policy.max_replicas)
    p99_agrees = _p99_agrees_to_scale_down(policy, obs)
    agreed_since: float | None = state.agreed_since if state.agreed_since is not None else obs.now
    if not p99_agrees or obs.prometheus_unavailable:
        # The delay starts over once Prometheus answers again.
        agreed_since = None
    window = _push_window(state.down_window, obs.now, rec, policy.scale_down_delay_seconds)
    window_max = window[0][1]

    desired = current
    reason = REASON_STEADY
    if need_up > current:
        desired = need_up
        reason = _up_reason(obs, demand, p99_replicas)
    elif rec < current:
        reason = REASON_WAIT_DOWN
        if obs.prometheus_unavailable:
            notes.append(NOTE_PROMETHEUS_UNAVAILABLE)
        elif agreed_since is None:
            notes.append("p99 does not agree to scale down")
        elif window_max < current and obs.now - agreed_since >= policy.scale_down_delay_seconds:
            desired = window_max
            reason = REASON_DOWN_IDLE if obs.queue_depth == 0 else REASON_DOWN_LOW

    desired, reason = _bounded(policy, obs, state, current, desired, reason, demand.learning, notes)
    unschedulable = obs.pending_unschedulable > 0

    rise_window, surge = _record_surge(policy, obs, state, warmup)
    standby = min(_standby_target(policy, surge, obs.now, capacity), policy.max_replicas - desired)
    promote = min(obs.ready_standby, max(0, desired - obs.ready_serving))
    seconds_per_request, saturated = _learn_seconds_per_request(policy, obs, state, capacity)
    new_state = ScalerState(
        desired_serving=desired,
        last_scale_up_at=obs.now if desired > current else state.last_scale_up_at,
        last_decision_at=obs.now,
        agreed_since=agreed_since,
        down_window=window,
        trend_samples=trend_samples,
        trend_signal=signal,
        seconds_per_request=seconds_per_request,
        capacity=memory,
        rise_window=rise_window,
        surge=surge,
        last_ready=obs.ready_serving,
        last_saturated=saturated,
    )
    inputs = _inputs(obs, state, warmup, demand, p99_replicas, window_max, capacity)
    inputs = replace(inputs, surge_rate=_surge_now(policy, surge, obs.now))
    decision = ScaleDecision(
        desired_serving=desired,
        desired_standby=standby,
        promote_standby=promote,
        reason=reason,
        inputs=inputs,
        unschedulable=unschedulable,
        notes=tuple(notes),
    )
    return decision, new_state


# ------------------------------------------------------------------------------------------
# Steps of decide_scale, each small enough to test through the whole function.


def _bounded(
    policy: ScalingPolicy,
    obs: Observation,
    state: ScalerState,
    current: int,
    desired: int,
    reason: str,
    learning: bool,
    notes: list[str],
) -> tuple[int, str]:
    """The size asked for within the bounds and limits, in order of authority: rate limit
    (tighter while capacity is being learnt), unschedulable pods, max, min; a steady pool that
    the bounds moved themselves (spec changed, or a first decision) says so."""
    if desired > current:
        limit = max(
            math.ceil(current * policy.max_scale_up_rate - _EPS),
            current + policy.max_scale_up_step,
        )
        if learning:
            learning_limit = max(math.ceil(current * policy.learning_max_factor - _EPS), 1)
            if learning_limit < limit:
                limit = learning_limit
                if desired > limit:
                    notes.append(NOTE_LEARNING)
        if desired > limit:
            desired, reason = limit, REASON_RATE_LIMITED
    if obs.pending_unschedulable > 0 and desired > current:
        desired, reason = current, REASON_UNSCHEDULABLE
        notes.append(f"{obs.pending_unschedulable} pod(s) pending unschedulable")
    if desired > policy.max_replicas:
        desired, reason = policy.max_replicas, REASON_CAPPED_MAX
    if desired < policy.min_replicas:
        desired, reason = policy.min_replicas, REASON_FLOOR_MIN
    if reason == REASON_STEADY:
        # The bounds moved the pool itself (spec changed, or a first decision).
        asked = state.desired_serving
        if asked is None:
            asked = obs.ready_serving + obs.warming + obs.pending_unschedulable
        if asked < policy.min_replicas:
            reason = REASON_FLOOR_MIN
        elif asked > policy.max_replicas:
            reason = REASON_CAPPED_MAX
    return desired, reason


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _current_serving(policy: ScalingPolicy, obs: Observation, state: ScalerState) -> int:
    """Replicas asked for so far: the last decision, or what exists when there is none."""
    if state.desired_serving is not None:
        current = state.desired_serving
    else:
        current = obs.ready_serving + obs.warming + obs.pending_unschedulable
    return _clamp(current, policy.min_replicas, policy.max_replicas)


def _staleness(policy: ScalingPolicy, obs: Observation) -> str | None:
    if obs.queue_depth is None:
        return REASON_HOLD_MISSING
    if obs.metrics_age_seconds is None or obs.metrics_age_seconds > policy.max_metrics_age_seconds:
        return REASON_HOLD_STALE
    return None


def _hold(
    policy: ScalingPolicy,
    obs: Observation,
    state: ScalerState,
    current: int,
    warmup: float,
    reason: str,
) -> tuple[ScaleDecision, ScalerState]:
    """Keep the pool as asked; forget the scale-down window (it must refill from fresh data)."""
    inputs = _inputs(obs, state, warmup, _Demand(0.0), 0, None, None)
    capacity = estimate_capacity(policy, state.capacity)
    standby = _standby_target(policy, state.surge, obs.now, capacity)
    decision = ScaleDecision(
        desired_serving=current,
        desired_standby=min(standby, policy.max_replicas - current),
        promote_standby=0,
        reason=reason,
        inputs=inputs,
        unschedulable=obs.pending_unschedulable > 0,
        hold=True,
    )
    new_state = replace(
        state,
        desired_serving=current,
        last_decision_at=obs.now,
        agreed_since=None,
        down_window=(),
        trend_samples=(),
        last_ready=obs.ready_serving,
    )
    return decision, new_state


def _remembered_rate(policy: ScalingPolicy, obs: Observation, state: ScalerState) -> float | None:
    """The last measured arrival rate, when this observation has none and it is at most
    `trend_window_seconds` old (utilisation mode only: a queue target keeps its old meaning)."""
    if obs.arrival_rate is not None or policy.target_queue_depth is not None:
        return None
    if state.trend_signal != "rate" or not state.trend_samples:
        return None
    at, value = state.trend_samples[-1]
    if not 0 <= obs.now - at <= policy.trend_window_seconds:
        return None
    return value


def _record_trend(
    policy: ScalingPolicy, obs: Observation, state: ScalerState
) -> tuple[tuple[tuple[float, float], ...], str]:
    """Append this tick's demand signal to the trend window (reset if the signal changed)."""
    if obs.arrival_rate is not None:
        signal, value = "rate", obs.arrival_rate
    else:
        assert obs.queue_depth is not None
        signal, value = "queue", obs.queue_depth
    old = state.trend_samples if state.trend_signal == signal else ()
    cutoff = obs.now - policy.trend_window_seconds
    kept = tuple(s for s in old if cutoff <= s[0] < obs.now)
    return (*kept, (obs.now, value)), signal


def _projected(
    policy: ScalingPolicy, samples: tuple[tuple[float, float], ...], warmup: float
) -> float:
    """The signal expected `warmup` seconds from now: the latest value plus its growth.

    Growth is the smaller of the least-squares slopes over the two halves of the window, so
    only sustained growth counts: a step (a surge that has already happened) is flat in one
    half and is not extrapolated, while a ramp rises in both. Growth below `trend_deadband` of
    the current value is subtracted as noise and the projection is capped at
    `max_trend_factor` times the current value. Each step is non-decreasing in the latest
    sample, so more load never projects less.
    """
    now, value = samples[-1]
    # A slope over a fraction of the window is mostly start-up noise (or a half-filled rate).
    if now - samples[0][0] < policy.trend_window_seconds / 2:
        return value
    middle = (samples[0][0] + now) / 2
    first = [s for s in samples if s[0] <= middle]
    second = [s for s in samples if s[0] > middle]
    slope = min(_slope(first), _slope(second))
    horizon = min(warmup, policy.max_trend_horizon_windows * policy.trend_window_seconds)
    growth = max(0.0, slope * horizon - policy.trend_deadband * value)
    return min(value + growth, value * policy.max_trend_factor)


def _slope(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope; 0 for fewer than two distinct times."""
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in samples)
    if var_t <= 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / var_t


def _remaining_warmup(obs: Observation, state: ScalerState, warmup: float) -> float:
    """Seconds until the replicas last asked for are warm (a full warm-up when none are on the
    way). Measuring the backlog to that moment, not to now + warm-up on every tick, keeps it
    from creeping up while replicas warm."""
    since = state.last_scale_up_at
    if since is not None and obs.now - since < warmup:
        return warmup - (obs.now - since)
    return warmup


def _live_backlog(waiting: float, excess: float, remaining: float, deadline: float | None) -> float:
    """Requests still within their deadline when the capacity on the way is warm.

    Of those waiting now, the share older than the deadline by then is lost (their ages taken
    as spread evenly over the deadline); of those the ready replicas fall behind by meanwhile,
    only the last deadline's worth is still waited for. Non-decreasing in `waiting` and
    `excess`.
    """
    if deadline is None or deadline <= 0:
        return waiting + excess * remaining
    return waiting * max(0.0, 1.0 - remaining / deadline) + excess * min(remaining, deadline)


def _demand_replicas(
    policy: ScalingPolicy,
    obs: Observation,
    state: ScalerState,
    samples: tuple[tuple[float, float], ...],
    warmup: float,
    capacity: Capacity | None,
) -> _Demand:
    """Replicas needed when new replicas will be warm, with what went into the estimate."""
    assert obs.queue_depth is not None
    live_queue = max(0.0, obs.queue_depth - (obs.unreachable or 0.0))
    queue_mode = policy.target_queue_depth is not None
    if queue_mode:
        # A queue target keeps its old meaning: concurrency per replica, whatever the batches
        # say (time a request spends outside the batcher holds concurrency too). The learned
        # capacity still stands in for the per-request time until one is measured unsaturated,
        # caps the backlog allowance and bounds every term, as in utilisation mode: a pool that
        # starts saturated never learns that time, and must not double to max_replicas.
        assert policy.target_queue_depth is not None
        target = policy.target_queue_depth
    elif capacity is not None:
        target = policy.target_utilization * capacity.knee_concurrency
    else:
        target = policy.fallback_queue_depth
    spr = state.seconds_per_request if queue_mode else None
    if spr is None and capacity is not None:
        spr = capacity.seconds_per_request
    rate = obs.arrival_rate
    if spr is not None and spr <= 0:
        spr = None  # an idle pool's sample says nothing of a request's time
    if not target > 0:
        target = policy.fallback_queue_depth  # a degenerate capacity estimate
    if rate is None or spr is None:
        # No flow to size for: the queue (or its trend, without a rate) over the target
        # concurrency, as KPA would. Until the per-request time and the rate are known the
        # pool at most doubles per decision (the next batches and scrapes tell).
        # (With a queue target set and no rate at all, the queue is the user's own measure.)
        queue = live_queue if rate is not None else _projected(policy, samples, warmup)
        learning = rate is not None if queue_mode else (capacity is None or rate is None)
        return _Demand(queue / target, learning=learning)

    projected = _projected(policy, samples, warmup)
    # Per replica at the target: requests/s (the flow's unit) and concurrency (the queue's).
    per_replica = target / spr
    if not per_replica > 0:  # an absurd per-request time underflows: size on the queue
        return _Demand(live_queue / target, learning=True)
    flow = projected / per_replica
    if not queue_mode and capacity is not None and capacity.per_replica_rate > 0:
        ahead = max(policy.projected_utilization, policy.target_utilization)
        flow = max(rate / per_replica, projected / (ahead * capacity.per_replica_rate))
    # The backlog the capacity on the way will find: what is queued beyond what the ready
    # replicas hold at the target now, plus what they fall behind by until the replicas last
    # asked for are warm — only requests that can still meet their deadline.
    in_service = rate * spr
    waiting = max(0.0, live_queue - in_service)
    excess = 0.0
    # Only a pool already queueing beyond its target is falling behind; below that the
    # difference is noise in the rate.
    if live_queue > obs.ready_serving * target * (1.0 + policy.tolerance):
        full_rate = capacity.per_replica_rate if capacity is not None else per_replica
        excess = max(0.0, projected - obs.ready_serving * full_rate)
    remaining = _remaining_warmup(obs, state, warmup)
    backlog = _live_backlog(waiting, excess, remaining, obs.deadline_seconds)
    # Draining over at least one request's time keeps the backlog's weight <= 1, so that
    # more arrivals never lower the demand through a smaller backlog.
    drain = max(policy.backlog_drain_seconds, spr)
    allowance = backlog * spr / drain / target
    if capacity is not None:
        allowance = min(allowance, policy.max_backlog_share * flow)
    bound = None
    if capacity is not None:
        full = projected / capacity.per_replica_rate
        bound = max(flow + allowance, full * (1.0 + policy.max_headroom))
    return _Demand(flow + allowance, projected=projected, backlog=backlog, bound=bound)


def _p99_replicas(
    policy: ScalingPolicy, obs: Observation, state: ScalerState, warmup: float
) -> int:
    """Replicas asked for by a hot P99 near its target (0: no opinion).

    The percentile lags (it is computed over a window by Prometheus), so after a scale-up it
    keeps reporting the old latency; it acts only once earlier additions are warm and have been
    in the window, and then relative to the ready replicas, so warming ones count as on the way.
    """
    target = policy.target_p99_ms
    p99 = obs.hot_p99_ms
    if target is None or p99 is None or p99 < policy.p99_approach * target:
        return 0
    if (
        state.last_scale_up_at is not None
        and obs.now - state.last_scale_up_at < warmup + policy.p99_window_seconds
    ):
        return 0
    ready = max(obs.ready_serving, 1)
    factor = min(p99 / (policy.p99_approach * target), policy.p99_max_factor)
    return max(ready + 1, math.ceil(ready * factor - _EPS))


def _p99_agrees_to_scale_down(policy: ScalingPolicy, obs: Observation) -> bool:
    if policy.target_p99_ms is None:
        return True
    if obs.hot_p99_ms is None:
        idle = obs.queue_depth == 0 and not obs.arrival_rate
        return idle or not policy.require_p99_for_scale_down
    return obs.hot_p99_ms < policy.p99_approach * policy.target_p99_ms


def _push_window(
    window: tuple[tuple[float, int], ...], now: float, rec: int, span: float
) -> tuple[tuple[float, int], ...]:
    """Sliding-window maximum: drop expired heads and tails no larger than `rec`."""
    kept = [entry for entry in window if entry[0] > now - span]
    while kept and kept[-1][1] <= rec:
        kept.pop()
    kept.append((now, rec))
    return tuple(kept)


def _record_surge(
    policy: ScalingPolicy, obs: Observation, state: ScalerState, warmup: float
) -> tuple[tuple[tuple[float, float], ...], tuple[float, float] | None]:
    """Advance the rate's sliding minimum over one warm-up and the remembered largest rise."""
    if policy.max_standby_replicas is None or obs.arrival_rate is None:
        return state.rise_window, state.surge
    span = min(max(warmup, policy.tick_seconds), policy.max_surge_window_seconds)
    rate = obs.arrival_rate
    kept = [entry for entry in state.rise_window if entry[0] >= obs.now - span]
    while kept and kept[-1][1] >= rate:
        kept.pop()
    kept.append((obs.now, rate))
    rise = rate - kept[0][1]
    surge = state.surge
    if rise > 0 and rise >= (_surge_now(policy, surge, obs.now) or 0.0):
        surge = (rise, obs.now)
    return tuple(kept), surge


def _surge_now(
    policy: ScalingPolicy, surge: tuple[float, float] | None, now: float
) -> float | None:
    """The remembered surge, faded by its age (half-life `surge_memory_seconds`)."""
    if surge is None or policy.max_standby_replicas is None:
        return None
    rise, at = surge
    fade: float = 0.5 ** (max(now - at, 0.0) / policy.surge_memory_seconds)
    return rise * fade


def _standby_target(
    policy: ScalingPolicy,
    surge: tuple[float, float] | None,
    now: float,
    capacity: Capacity | None,
) -> int:
    """Standby replicas: fixed, or enough learned capacity (at the target utilisation) for the
    remembered surge, between standby_replicas and max_standby_replicas."""
    rise = _surge_now(policy, surge, now)
    if policy.max_standby_replicas is None or rise is None or capacity is None:
        return policy.standby_replicas
    per_replica = capacity.per_replica_rate * policy.target_utilization
    wanted = math.ceil(rise / per_replica - _EPS) if per_replica > 0 else 0
    return _clamp(wanted, policy.standby_replicas, policy.max_standby_replicas)


def _up_reason(obs: Observation, demand: _Demand, p99_replicas: int) -> str:
    if p99_replicas > math.ceil(demand.replicas - _EPS):
        return REASON_P99
    if demand.projected is None:
        return REASON_SURGE_QUEUE
    assert obs.arrival_rate is not None
    if demand.projected > obs.arrival_rate:
        return REASON_SURGE_TREND
    return REASON_SURGE_RATE


def _learn_seconds_per_request(
    policy: ScalingPolicy, obs: Observation, state: ScalerState, capacity: Capacity | None
) -> tuple[float | None, bool]:
    """Update the concurrency one request holds (Little's law: queue / arrival rate), only
    from samples of a steady, unsaturated pool; also say whether this tick found it saturated.

    A saturated pool's queue depth includes the backlog, which is not a property of a request.
    Nor is the tick after a saturated one a steady state: it may be the one whose backlog
    drains, when the replicas complete more than arrives and a queue that reflects the interval
    (time in service over it, as a fluid model or a windowed gauge has it) counts the drained
    backlog as time each request holds (the both-modes property found 0.3 s learned for 0.2 s
    of service, and a pool sized past its bound until the scale-down delay). A backlog that
    built up over an interval kept the slots busy through it (judged saturated), so only the
    next tick is in doubt. Dividing by the completions instead (Little's law on the
    throughput) is no cure: a queue read once the drain is over is already the steady one;
    the batch completions are counted over the pods' scrape intervals, not the decision's (a
    scrape < 0.5 s after the last keeps the older base, and the next tick's work covers up to
    two intervals), and at the batcher, not where the queue is counted; and the larger of two
    noisy rates is biased up (tried: it under-sized e2e/test_unschedulable.py). Nor can the
    batches' service time bound the sample: time held outside the batcher is concurrency too
    (100 ms of it per request in that test, for a 0.3 ms batch). So the tick after a saturated
    one learns nothing. Likewise a tick whose rate is not within `steady_rate_factor` of the
    last one's: a load that started or stepped within the interval gives a rate below the one
    the queue read at its end reflects (9 in flight for 9 req/s measured, on the sandbox,
    where 90 req/s at 100 ms each arrived from then on).
    The estimate is used from the next tick on, so this tick's demand stays monotonic in load.
    """
    rate = obs.arrival_rate
    queue = obs.queue_depth
    kept = state.seconds_per_request
    if rate is None or queue is None or rate <= 0 or queue <= 0 or obs.ready_serving == 0:
        return kept, state.last_saturated  # nothing to judge by: the last verdict stands
    if policy.target_queue_depth is not None:
        saturated_above = policy.target_queue_depth
        busy = _busy_share(obs, state)
        if capacity is not None and busy is not None:
            if busy >= policy.busy_share_saturated:
                return kept, True
            saturated_above = math.inf
    elif capacity is not None:
        saturated_above = policy.target_utilization * capacity.knee_concurrency
    else:
        saturated_above = policy.fallback_queue_depth
    if queue > obs.ready_serving * saturated_above:
        return kept, True
    if state.last_saturated:
        return kept, False  # perhaps draining a backlog: not a steady state
    samples = state.trend_samples if state.trend_signal == "rate" else ()
    before = samples[-1][1] if samples else None
    if before is None or not before * policy.steady_rate_factor >= rate >= (
        before / policy.steady_rate_factor
    ):
        return kept, False  # the load stepped (or started): not a steady state either
    sample = queue / rate
    if kept is None:
        return sample, False
    alpha = policy.seconds_per_request_smoothing
    return (1 - alpha) * kept + alpha * sample, False


def _busy_share(obs: Observation, state: ScalerState) -> float | None:
    """Share of the ready replicas' execution slots busy since the last decision (None: not
    measured). Replicas that turned ready since then did little of that work, so the share is
    of the fewer ready then and now."""
    sample = obs.work
    if sample is None or state.last_decision_at is None or state.last_ready is None:
        return None
    replicas = min(obs.ready_serving, state.last_ready)
    interval = obs.now - state.last_decision_at
    if interval <= 0 or replicas <= 0:
        return None
    return sample.work.seconds / (sample.slots * replicas * interval)


def _inputs(
    obs: Observation,
    state: ScalerState,
    warmup: float,
    demand: _Demand,
    p99_replicas: int,
    window_max: int | None,
    capacity: Capacity | None,
) -> DecisionInputs:
    return DecisionInputs(
        ready_serving=obs.ready_serving,
        warming=obs.warming,
        ready_standby=obs.ready_standby,
        pending_unschedulable=obs.pending_unschedulable,
        queue_depth=obs.queue_depth,
        arrival_rate=obs.arrival_rate,
        projected_rate=demand.projected,
        hot_p99_ms=obs.hot_p99_ms,
        warmup_seconds=warmup,
        seconds_per_request=state.seconds_per_request,
        demand_replicas=demand.replicas,
        p99_replicas=p99_replicas,
        window_max=window_max,
        capacity_per_replica=capacity.per_replica_rate if capacity is not None else None,
        knee_concurrency=capacity.knee_concurrency if capacity is not None else None,
        backlog=demand.backlog,
        unreachable=obs.unreachable,
        bound_replicas=demand.bound,
    )


# ------------------------------------------------------------------------------------------
# The state's persisted form (status.autoscaler.state): JSON-ready, bounded, versioned.

STATE_VERSION = 1
# The scale-down window is merged down to this many entries when persisted (conservatively:
# a merged entry keeps the larger recommendation for the later time).
MAX_PERSISTED_WINDOW = 32


def _r(value: float, digits: int = 3) -> float:
    return round(float(value), digits)


def _sig(value: float) -> float:
    """Six significant digits: enough for estimates, and a stable text for unchanged ones."""
    return float(f"{value:.6g}")


def compact_window(
    window: tuple[tuple[float, int], ...], limit: int = MAX_PERSISTED_WINDOW
) -> tuple[tuple[float, int], ...]:
    """At most `limit` entries of a scale-down window, never lower at any time than the
    original: merging (t1, r1), (t2, r2) with r1 > r2 into (t2, r1) only delays scale-down."""
    entries = list(window)
    while len(entries) > max(limit, 1):
        # Merge the neighbours whose recommendations differ least.
        i = min(range(len(entries) - 1), key=lambda k: entries[k][1] - entries[k + 1][1])
        entries[i : i + 2] = [(entries[i + 1][0], entries[i][1])]
    return tuple(entries)


def dump_state(state: ScalerState, clock_offset: float) -> dict[str, Any]:
    """The state as JSON-ready data. Monotonic times are written as `time + clock_offset`
    (the shell passes wall - monotonic now), so another process can read them back."""

    def at(t: float | None) -> float | None:
        return None if t is None else _r(t + clock_offset)

    out: dict[str, Any] = {
        "v": STATE_VERSION,
        "desired": state.desired_serving,
        "lastUpAt": at(state.last_scale_up_at),
        "lastAt": at(state.last_decision_at),
        "agreedSince": at(state.agreed_since),
        "window": [[at(t), r] for t, r in compact_window(state.down_window)],
        # Only the last sample: a trend does not survive the gap of a restart (its halves
        # straddle the gap and read a surge's step as a ramp: 3 -> 6 replicas on the sandbox);
        # the last rate stands in for the first tick's missing one.
        "trend": [[at(t), _sig(v)] for t, v in state.trend_samples[-1:]],
        "trendSignal": state.trend_signal,
        "spr": None if state.seconds_per_request is None else _sig(state.seconds_per_request),
        # The remembered surge; its sliding window does not survive a restart (as the trend).
        "surge": None if state.surge is None else [_sig(state.surge[0]), at(state.surge[1])],
    }
    if state.capacity is not None:
        w = state.capacity.work
        out["capacity"] = {
            "work": [_sig(getattr(w, n)) for n in _WORK_FIELDS],
            "slots": state.capacity.slots,
            "maxBatchRows": state.capacity.max_batch_rows,
        }
    return out


def load_state(data: Mapping[str, Any], clock_offset: float) -> ScalerState:
    """The inverse of `dump_state` (same `clock_offset` convention, for this process).

    Raises ValueError for data of another version or shape; the caller then starts afresh.
    """
    if not isinstance(data, Mapping) or data.get("v") != STATE_VERSION:
        raise ValueError("not an autoscaler state of this version")

    def at(t: Any) -> float | None:
        return None if t is None else float(t) - clock_offset

    def opt_int(v: Any) -> int | None:
        return None if v is None else int(v)

    try:
        window = tuple((float(t) - clock_offset, int(r)) for t, r in data.get("window") or ())
        trend = tuple((float(t) - clock_offset, float(v)) for t, v in data.get("trend") or ())
        capacity = None
        raw = data.get("capacity")
        if raw is not None:
            values = [float(v) for v in raw["work"]]
            if len(values) != len(_WORK_FIELDS):
                raise ValueError("capacity.work has the wrong length")
            capacity = CapacityMemory(
                BatchWork(*values), int(raw["slots"]), int(raw["maxBatchRows"])
            )
        spr = data.get("spr")
        raw_surge = data.get("surge")
        surge = None
        if raw_surge is not None:
            surge = (float(raw_surge[0]), float(raw_surge[1]) - clock_offset)
        state = ScalerState(
            desired_serving=opt_int(data.get("desired")),
            last_scale_up_at=at(data.get("lastUpAt")),
            last_decision_at=at(data.get("lastAt")),
            agreed_since=at(data.get("agreedSince")),
            down_window=window,
            trend_samples=trend,
            trend_signal=str(data.get("trendSignal") or ""),
            seconds_per_request=None if spr is None else float(spr),
            capacity=capacity,
            surge=surge,
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"malformed autoscaler state: {exc}") from None
    if any(b[1] >= a[1] for a, b in itertools.pairwise(window)):
        raise ValueError("malformed autoscaler state: the window is not decreasing")
    return state
