"""Trace-driven simulation of one inference service under tidal's autoscaler and its peers.

Owns the simulator (a fluid FIFO queue in front of identical replicas, stepped every `dt`
seconds), the bursty traces, faithful models of the peers' control loops (Kubernetes HPA, KEDA
on top of HPA, Knative's KPA), an oracle, and the comparison table with the goals of issue 11.
Run it with

    .venv/bin/python bench/autoscale_sim.py                 # the main table (W = 30 s)
    .venv/bin/python bench/autoscale_sim.py --sweep         # warm-up 5..60 s x start states
    .venv/bin/python bench/autoscale_sim.py --warmup 15 --start saturated --traces herd
    .venv/bin/python bench/autoscale_sim.py --queue-mode    # also tidal with targetQueueDepth

The model. Requests arrive as a Poisson process (seeded; every policy sees the same arrivals)
and wait in one FIFO queue (the Service balances ideally). A ready serving replica works on
`slots` requests at a time, each for `service_seconds`, so it serves `slots / service_seconds`
requests per second and saturates at `slots` in flight. A request's latency is its wait plus
its service time; requests that wait longer than `client_timeout_seconds` are abandoned (their
client gave up) and count as late. A new replica is warm `warmup_seconds` after the decision
that created it (scheduling, start, engine load, warm-up). Every pod that exists costs
replica-seconds, warming and standby ones included.

Fairness. Every policy is given the same target utilisation (0.7) — the peers as the
concurrency target a user would set for this service (0.7 x slots in flight per pod, Knative's
default target utilisation), tidal as `targetUtilization` with the capacity it learns from the
runtime's batch counters (the simulated runtime reports its batches as the real one does) —
the same start state (`normal`: sized for the base load; `saturated`: a third of that, with 10 s
of backlog already queued) and the same warm-up. Each peer sees the signals its real pipeline
would give it:

* HPA: a Pods metric (concurrency per pod) from Prometheus scraped every 15 s, synced every
  15 s; 10 % tolerance; pods without a sample count as 0 when scaling up and as on target when
  scaling down; scale-down stabilisation 300 s (max of recommendations); scale-up limited per
  15 s to max(+100 %, +4 pods) of the replicas at the period's start (the default `behavior`).
* KEDA: the same HPA on KEDA's External metric, queried live at each sync (KEDA's default,
  `useCachedMetrics: false`), replicas from the total against all current replicas.
* KPA: concurrency scraped every 1 s (per-second averages), decided every 2 s; stable window
  60 s, panic window 6 s, panic when the panic-window demand reaches 200 % of ready pods; no
  scale-down while panicking; max scale-up rate 1000, max scale-down rate 2.
* tidal: `decide_scale` every 1 s with the queue depth read from the pods (≤ 1 s old), the
  arrival rate over the last second, the batch work since the last tick, the queued requests
  that can no longer meet the client's deadline (the runtime knows it: `batching.timeoutMs`),
  hot P99 from Prometheus (scraped every 5 s, 30 s window) and the measured warm-up time;
  standby pods promoted by `choose_standby`, victims chosen by `choose_scale_down_victims`.
* oracle: knows the trace's rate function and asks, at t, for the replicas the largest rate of
  [t, t + warm-up] needs at the target utilisation (so they are warm in time, and none is
  removed that would be needed again before a new one could warm). Its peak is the reference
  for "peak replicas ≤ 1.5x the oracle's".

Loops start at fixed, documented phases (not aligned with the surges) so that runs are
deterministic.
"""

from __future__ import annotations

import argparse
import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from tidal.operator.core.autoscaler import (
    BatchWork,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    WorkSample,
    decide_scale,
)
from tidal.operator.core.autoscaler_pods import (
    PodView,
    choose_scale_down_victims,
    choose_standby,
)
from tidal.operator.core.rollout import (
    PoolObservation,
    RolloutObservation,
    RolloutSpec,
    RolloutState,
    Traffic,
    plan_rollout,
)

# ------------------------------------------------------------------------------------------
# Configuration and traces


@dataclass(frozen=True)
class SimConfig:
    dt: float = 0.1
    service_seconds: float = 0.01
    slots: int = 1
    warmup_seconds: float = 30.0
    latency_target_seconds: float = 0.5
    client_timeout_seconds: float = 10.0
    target_utilization: float = 0.7
    base_rate: float = 700.0
    # "normal": sized for the base rate at the target; "saturated": a third of that, with
    # `client_timeout_seconds` of the shortfall already queued.
    start: str = "normal"
    min_replicas: int = 1
    max_replicas: int = 200
    # tidal's user-set knobs for the run (the rest are ScalingPolicy defaults).
    tidal_standby: int = 1
    # `maxStandbyReplicas`: the standby sized from the surges seen (None: fixed).
    tidal_max_standby: int | None = None
    tidal_scale_down_delay: float = 180.0
    # tidal's warm-up when it differs from every one else's: the labelled what-if of a
    # host-warm standby tier (not built here), None otherwise.
    tidal_warmup_seconds: float | None = None
    # A warm baseline pool of this many replicas that tidal may use as overflow capacity while
    # its primary is short (rollout rule 8, `spec.rollout.baseline.overflow`); 0: none.
    tidal_overflow_replicas: int = 0
    # tidal in queue mode (`autoscaling.targetQueueDepth`): this concurrency per replica
    # instead of `targetUtilization`; None: utilisation mode.
    tidal_target_queue_depth: float | None = None
    seed: int = 7

    @property
    def replica_rate(self) -> float:
        """Requests per second one replica serves when saturated."""
        return self.slots / self.service_seconds

    @property
    def target_concurrency(self) -> float:
        """In flight + queued per replica at the target utilisation (the peers' target)."""
        return self.target_utilization * self.slots

    @property
    def target_rate(self) -> float:
        """Requests per second one replica serves at the target utilisation."""
        return self.target_utilization * self.replica_rate

    @property
    def initial_replicas(self) -> int:
        sized = math.ceil(self.base_rate / self.target_rate - 1e-9)
        return max(1, sized // 3) if self.start == "saturated" else sized

    @property
    def initial_backlog(self) -> float:
        if self.start != "saturated":
            return 0.0
        short = self.base_rate - self.initial_replicas * self.replica_rate
        return max(0.0, short) * self.client_timeout_seconds


@dataclass(frozen=True)
class Trace:
    name: str
    duration: float
    rate: Callable[[np.ndarray], np.ndarray]
    note: str = ""


def _markov_bursts(base: float, duration: float, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """A two-state Markov-modulated rate: 1x base, bursts of 3.5x; exponential dwell times
    (mean 60 s calm, 20 s burst), seeded, piecewise constant."""
    rng = np.random.default_rng([seed, 11])
    edges, levels = [0.0], []
    calm = True
    while edges[-1] < duration:
        levels.append(1.0 if calm else 3.5)
        edges.append(edges[-1] + rng.exponential(60.0 if calm else 20.0))
        calm = not calm
    cuts, values = np.asarray(edges[1:]), np.asarray(levels)

    def rate(t: np.ndarray) -> np.ndarray:
        return base * values[np.minimum(np.searchsorted(cuts, t, side="right"), len(values) - 1)]

    return rate


def make_traces(base: float, seed: int = 7) -> list[Trace]:
    def herd(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 120) & (t < 300), 8 * base, base)

    def sawtooth(t: np.ndarray) -> np.ndarray:
        phase = np.mod(t - 60, 120)
        teeth = (t >= 60) & (t < 660)
        return np.where(teeth & (phase < 90), base * (1 + 3 * phase / 90), base)

    def creep(t: np.ndarray) -> np.ndarray:
        return base * (1 + 4 * np.clip((t - 60) / 600, 0, 1))

    def double(t: np.ndarray) -> np.ndarray:
        first = (t >= 120) & (t < 150)
        second = (t >= 240) & (t < 270)
        return np.where(first | second, 6 * base, base)

    def repeat(t: np.ndarray) -> np.ndarray:
        # Spikes further apart than the scale-down delay: the capacity of one is gone by the
        # next (what a surge-sized standby is for).
        return np.where((t >= 120) & (np.mod(t - 120, 420) < 60), 4 * base, base)

    return [
        Trace("herd", 600, herd, "8x step for 180 s"),
        Trace("bursts", 900, _markov_bursts(base, 900, seed), "Markov: 1x / 3.5x"),
        Trace("sawtooth", 780, sawtooth, "5 ramps 1x->4x in 90 s, drop"),
        Trace("creep", 900, creep, "1x->5x over 600 s"),
        Trace("double", 480, double, "two 6x spikes of 30 s"),
        Trace("repeat", 1380, repeat, "three 4x spikes of 60 s, 420 s apart"),
    ]


# ------------------------------------------------------------------------------------------
# The service: pods, queue, signals


@dataclass
class Pod:
    name: str
    ready_at: float
    standby: bool = False
    served: float = 0.0  # requests served, for cache warmth
    placed: bool = False  # given its role (serving or standby) when it became ready


@dataclass
class Action:
    """What an autoscaler asks of the pool."""

    desired_total: int
    desired_serving: int | None = None  # None: every pod serves (the peers)


class Service:
    """One service: pods and a FIFO queue, stepped every dt; keeps the signal history."""

    def __init__(
        self,
        cfg: SimConfig,
        arrivals: np.ndarray,
        initial_standby: int,
        warmup_seconds: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.arrivals = arrivals
        self.warmup_seconds = cfg.warmup_seconds if warmup_seconds is None else warmup_seconds
        self.t = 0.0
        self.i = 0
        self._names = 0
        self.pods: list[Pod] = []
        for k in range(cfg.initial_replicas + initial_standby):
            self.pods.append(self._new_pod(-1.0, standby=k >= cfg.initial_replicas))
        self.desired_serving: int | None = None
        # Warm replicas of another pool serving beside these while the autoscaler says so (the
        # baseline in an overflow); not this service's pods, so not in its replica-seconds.
        self.helpers = 0
        self.helper_seconds = 0.0
        self.queue: deque[list[float]] = deque()  # [arrival time, count]
        backlog = cfg.initial_backlog
        if backlog > 0:
            # Queued over the last client timeout, evenly: ages as a saturated pool has them.
            cohorts = 20
            span = cfg.client_timeout_seconds
            for k in range(cohorts):
                self.queue.append([-span + (k + 0.5) * span / cohorts, backlog / cohorts])
        n = len(arrivals)
        self.served_hist = np.zeros(n)  # requests served in each step
        self.queue_hist = np.zeros(n)  # queued + in flight at the end of each step
        self.serving_hist = np.zeros(n, dtype=np.int32)
        self.pods_hist = np.zeros(n, dtype=np.int32)
        # Completions: time, latency, count (appended in time order).
        self.done_t: list[float] = []
        self.done_lat: list[float] = []
        self.done_n: list[float] = []

    def _new_pod(self, ready_at: float, standby: bool = False) -> Pod:
        self._names += 1
        return Pod(f"pod-{self._names:04d}", ready_at, standby)

    # -- counts ---------------------------------------------------------------------------
    def ready(self, pod: Pod) -> bool:
        return pod.ready_at <= self.t

    def counts(self) -> tuple[int, int, int]:
        """(ready serving, warming, ready standby)."""
        serving = warming = standby = 0
        for p in self.pods:
            if not self.ready(p):
                warming += 1
            elif p.standby:
                standby += 1
            else:
                serving += 1
        return serving, warming, standby

    def pod_views(self) -> list[PodView]:
        serving = max(1, self.counts()[0])
        in_flight = int(self.queue_hist[self.i - 1] / serving) if self.i else 0
        return [
            PodView(
                name=p.name,
                ready=self.ready(p),
                standby=p.standby,
                in_flight=0 if p.standby or not self.ready(p) else in_flight,
                cache_warmth=min(1.0, p.served / 50_000),
                ready_for_seconds=max(0.0, self.t - p.ready_at),
            )
            for p in self.pods
        ]

    # -- control --------------------------------------------------------------------------
    def apply(self, action: Action) -> None:
        total = max(0, action.desired_total)
        self.desired_serving = action.desired_serving
        if len(self.pods) > total:
            victims = {
                v.name for v in choose_scale_down_victims(self.pod_views(), len(self.pods) - total)
            }
            self.pods = [p for p in self.pods if p.name not in victims]
        while len(self.pods) < total:
            self.pods.append(self._new_pod(self.t + self.warmup_seconds))
        if action.desired_serving is not None:
            serving = action.desired_serving
            standby = max(0, total - serving)
            roles = choose_standby(self.pod_views(), serving, standby)
            standby_names = set(roles.standby)
            serving_names = set(roles.serving)
            for p in self.pods:
                if p.name in standby_names:
                    p.standby = True
                elif p.name in serving_names:
                    p.standby = False

    def _on_ready(self) -> None:
        """A pod that just became ready serves if serving is short, else waits as standby."""
        want = self.desired_serving
        fresh = [p for p in self.pods if not p.placed and self.ready(p)]
        if not fresh:
            return
        serving = sum(1 for p in self.pods if p.placed and self.ready(p) and not p.standby)
        for p in fresh:
            p.placed = True
            if want is not None:
                p.standby = serving >= want
                serving += 0 if p.standby else 1

    # -- one step -------------------------------------------------------------------------
    def step(self) -> None:
        cfg, t, i = self.cfg, self.t, self.i
        self._on_ready()
        if self.arrivals[i] > 0:
            self.queue.append([t, float(self.arrivals[i])])
        while self.queue and t - self.queue[0][0] > cfg.client_timeout_seconds:
            _arrived, n = self.queue.popleft()
            self._done(cfg.client_timeout_seconds, n)
        serving_pods = [p for p in self.pods if self.ready(p) and not p.standby]
        capacity = (len(serving_pods) + self.helpers) * cfg.replica_rate * cfg.dt
        self.helper_seconds += self.helpers * cfg.dt
        served = 0.0
        while self.queue and capacity > 1e-9:
            cohort = self.queue[0]
            take = min(capacity, cohort[1])
            self._done(t - cohort[0] + cfg.service_seconds, take)
            capacity -= take
            served += take
            cohort[1] -= take
            if cohort[1] <= 1e-9:
                self.queue.popleft()
        if serving_pods:
            share = served / len(serving_pods)
            for p in serving_pods:
                p.served += share
        queued = sum(c[1] for c in self.queue)
        self.served_hist[i] = served
        self.queue_hist[i] = queued + served / cfg.dt * cfg.service_seconds
        self.serving_hist[i] = len(serving_pods)
        self.pods_hist[i] = len(self.pods)
        self.i += 1
        self.t = self.i * cfg.dt

    def _done(self, latency: float, n: float) -> None:
        self.done_t.append(self.t)
        self.done_lat.append(latency)
        self.done_n.append(n)

    # -- signals (what the monitoring pipelines can see) ------------------------------------
    def _index(self, t: float) -> int:
        return max(0, min(self.i, round(t / self.cfg.dt)))

    def queue_now(self) -> float:
        return float(self.queue_hist[self.i - 1]) if self.i else 0.0

    def queue_at(self, t: float) -> float:
        k = self._index(t)
        return float(self.queue_hist[k - 1]) if k else 0.0

    def mean_queue(self, t0: float, t1: float) -> float:
        a, b = self._index(t0), self._index(t1)
        return float(self.queue_hist[a:b].mean()) if b > a else 0.0

    def arrival_rate(self, t0: float, t1: float) -> float:
        a, b = self._index(t0), self._index(t1)
        return float(self.arrivals[a:b].sum() / max(t1 - t0, 1e-9))

    def served(self, t0: float, t1: float) -> float:
        a, b = self._index(t0), self._index(t1)
        return float(self.served_hist[a:b].sum())

    def unreachable(self) -> float:
        """Queued requests that cannot be served before their client gives up: those whose
        age plus the wait for the requests ahead of them (at the serving replicas' rate)
        exceeds the timeout — what the runtime's `tidal_queue_reachable` leaves out."""
        serving = sum(1 for p in self.pods if self.ready(p) and not p.standby)
        rate = serving * self.cfg.replica_rate
        ahead = dead = 0.0
        for arrived, n in self.queue:
            wait = ahead / rate if rate > 0 else math.inf
            if self.t - arrived + wait > self.cfg.client_timeout_seconds:
                dead += n
            ahead += n
        return dead

    def p99(self, t0: float, t1: float) -> float | None:
        a = bisect.bisect_left(self.done_t, t0)
        b = bisect.bisect_right(self.done_t, t1)
        if b <= a:
            return None
        return weighted_quantile(self.done_lat[a:b], self.done_n[a:b], 0.99)


def weighted_quantile(
    values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, q: float
) -> float:
    v = np.asarray(values)
    w = np.asarray(weights)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    k = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(v[order][min(k, len(v) - 1)])


# ------------------------------------------------------------------------------------------
# Autoscalers


class Autoscaler(Protocol):
    name: str

    def initial_standby(self) -> int: ...

    def on_step(self, svc: Service) -> Action | None: ...


def _due(t: float, period: float, phase: float, dt: float) -> bool:
    """True on the step at which a loop of `period` seconds, started at `phase`, fires."""
    if t < phase - 1e-9:
        return False
    k = (t - phase) / period
    return abs(k - round(k)) * period < dt / 2


class Tidal:
    name = "tidal"
    tick, phase = 1.0, 0.5
    p99_scrape, p99_phase, p99_window = 5.0, 2.0, 30.0

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.policy = ScalingPolicy(
            min_replicas=cfg.min_replicas,
            max_replicas=cfg.max_replicas,
            target_utilization=cfg.target_utilization,
            target_queue_depth=cfg.tidal_target_queue_depth,
            target_p99_ms=cfg.latency_target_seconds * 1000,
            standby_replicas=cfg.tidal_standby,
            max_standby_replicas=cfg.tidal_max_standby,
            scale_down_delay_seconds=cfg.tidal_scale_down_delay,
            p99_window_seconds=self.p99_window,
        )
        self.state = ScalerState()
        self.p99_ms: float | None = None
        self.decisions: list[tuple[float, ScaleDecision]] = []
        self.last_tick: float | None = None
        if cfg.tidal_warmup_seconds is not None:
            self.name = f"tidal@W={cfg.tidal_warmup_seconds:g}s"
        if cfg.tidal_target_queue_depth is not None:
            self.name = f"tidal:queue={cfg.tidal_target_queue_depth:g}"
        # Overflow: the real rollout planner decides when the warm baseline helps.
        self.rollout_spec: RolloutSpec | None = None
        self.rollout_state: RolloutState | None = None
        if cfg.tidal_overflow_replicas > 0:
            self.name = f"tidal+ovf{cfg.tidal_overflow_replicas}"
            self.rollout_spec = RolloutSpec(
                primary_hash="primary",
                baseline_min_replicas=cfg.tidal_overflow_replicas,
                max_replicas=cfg.max_replicas,
                overflow=True,
            )

    def initial_standby(self) -> int:
        return self.cfg.tidal_standby

    def warmup_seconds(self) -> float:
        if self.cfg.tidal_warmup_seconds is not None:
            return self.cfg.tidal_warmup_seconds
        return self.cfg.warmup_seconds

    def work(self, svc: Service, t: float) -> WorkSample | None:
        """The batches served since the last tick, as the runtime's counters report them:
        single-row batches of `service_seconds` each, `slots` at a time per replica."""
        since = self.last_tick if self.last_tick is not None else max(0.0, t - 1.0)
        n = svc.served(since, t)
        if n <= 0:
            return None
        s = self.cfg.service_seconds
        return WorkSample(BatchWork(n, n, n, n * s, n * s, n), self.cfg.slots, 1)

    def on_step(self, svc: Service) -> Action | None:
        t = svc.t
        if _due(t, self.p99_scrape, self.p99_phase, self.cfg.dt):
            p99 = svc.p99(t - self.p99_window, t)
            self.p99_ms = None if p99 is None else p99 * 1000
        if not _due(t, self.tick, self.phase, self.cfg.dt):
            return None
        serving, warming, standby = svc.counts()
        obs = Observation(
            now=t,
            ready_serving=serving,
            warming=warming,
            ready_standby=standby,
            queue_depth=svc.queue_now(),
            hot_p99_ms=self.p99_ms,
            arrival_rate=svc.arrival_rate(max(0.0, t - 1.0), t),
            warmup_seconds=self.warmup_seconds(),
            metrics_age_seconds=0.5,
            unreachable=svc.unreachable(),
            deadline_seconds=self.cfg.client_timeout_seconds,
            work=self.work(svc, t),
        )
        self.last_tick = t
        decision, self.state = decide_scale(self.policy, obs, self.state)
        self.decisions.append((t, decision))
        if self.rollout_spec is not None:
            seen = RolloutObservation(
                primary=PoolObservation(ready_replicas=serving),
                baseline=PoolObservation(ready_replicas=self.cfg.tidal_overflow_replicas),
                autoscaler_desired=decision.desired_serving,
            )
            plan, self.rollout_state = plan_rollout(self.rollout_spec, seen, self.rollout_state, t)
            overflow = plan.traffic is Traffic.OVERFLOW
            svc.helpers = self.cfg.tidal_overflow_replicas if overflow else 0
        return Action(decision.desired_total, decision.desired_serving)


@dataclass
class _HpaEvent:
    t: float
    delta: int


class Hpa:
    """The HPA's replica calculator and default `behavior` for one Pods/AverageValue metric."""

    name = "HPA"
    sync, sync_phase = 15.0, 7.0
    scrape, scrape_phase = 15.0, 3.0
    tolerance = 0.1
    down_window = 300.0
    period = 15.0

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.replicas = cfg.initial_replicas
        self.scraped: float | None = None  # the total queue depth at the last scrape
        self.recommendations: list[tuple[float, int]] = []
        self.events: list[_HpaEvent] = []

    def initial_standby(self) -> int:
        return 0

    def metric(self, svc: Service) -> float | None:
        """The value the HPA reads at a sync: Prometheus' latest scrape."""
        if _due(svc.t, self.scrape, self.scrape_phase, self.cfg.dt):
            self.scraped = svc.queue_now()
        return self.scraped

    def on_step(self, svc: Service) -> Action | None:
        value = self.metric(svc)
        if not _due(svc.t, self.sync, self.sync_phase, self.cfg.dt) or value is None:
            return None
        serving, warming, _ = svc.counts()
        raw = self.calc_replicas(value, serving, warming)
        desired = self.stabilise(svc.t, raw)
        desired = self.rate_limit(svc.t, desired)
        desired = max(self.cfg.min_replicas, min(self.cfg.max_replicas, desired))
        if desired != self.replicas:
            self.events.append(_HpaEvent(svc.t, desired - self.replicas))
            self.replicas = desired
        return Action(self.replicas)

    def calc_replicas(self, total: float, ready: int, missing: int) -> int:
        """replica_calculator.go, calcPlainMetricReplicas, for an average-value Pods metric."""
        target = self.cfg.target_concurrency
        current = self.replicas
        if ready == 0:
            return current
        ratio = total / ready / target
        if missing == 0:
            if abs(1.0 - ratio) <= self.tolerance:
                return current
            return math.ceil(ratio * ready)
        # Pods without a sample: 0 when scaling up, exactly on target when scaling down.
        fill = 0.0 if ratio > 1.0 else target * missing
        new_ratio = (total + fill) / (ready + missing) / target
        if (
            abs(1.0 - new_ratio) <= self.tolerance
            or (ratio < 1.0 < new_ratio)
            or (new_ratio < 1.0 < ratio)
        ):
            return current
        replicas = math.ceil(new_ratio * (ready + missing))
        if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
            return current
        return replicas

    def stabilise(self, t: float, raw: int) -> int:
        """stabilizeRecommendationWithBehaviors: scale-up window 0 s, scale-down window 300 s."""
        self.recommendations = [
            (ts, r) for ts, r in self.recommendations if ts > t - self.down_window
        ]
        self.recommendations.append((t, raw))
        down = max(r for _, r in self.recommendations)
        recommendation = self.replicas
        if recommendation < raw:
            recommendation = raw
        if recommendation > down:
            recommendation = down
        return recommendation

    def rate_limit(self, t: float, desired: int) -> int:
        """Scale-up policies Percent 100 / Pods 4 per 15 s, selectPolicy Max."""
        self.events = [e for e in self.events if e.t > t - self.period]
        added = sum(e.delta for e in self.events if e.delta > 0)
        removed = -sum(e.delta for e in self.events if e.delta < 0)
        start = self.replicas - added + removed
        if desired > self.replicas:
            limit = max(start * 2, start + 4)
            return min(desired, max(limit, self.replicas))
        return desired


class Keda(Hpa):
    """HPA on the External metric KEDA's adapter serves (keda v2.21 pkg/scaling/scale_handler.go,
    GetScaledObjectMetrics): each HPA sync asks the adapter, which queries Prometheus then and
    there (``useCachedMetrics`` is false by default; ``pollingInterval`` only paces the 0<->1
    activation checks). The HPA turns an AverageValue External metric into replicas with
    GetExternalPerPodMetricReplicas: the total over the target per pod, against all current
    replicas, warming ones included (no missing-pod fill as for a Pods metric).

    Until issue 35 this class cached the metric for 30 s (the polling interval); the real KEDA
    on the real node (bench/peers_bench.py) decided within one HPA sync of a surge, which the
    cached model could not: the cache was the model's error, not KEDA's behaviour."""

    name = "KEDA"

    def calc_replicas(self, total: float, ready: int, missing: int) -> int:
        target = self.cfg.target_concurrency
        current = self.replicas
        if current == 0:
            return current
        if abs(1.0 - total / (target * current)) <= self.tolerance:
            return current
        return math.ceil(total / target)


class Kpa:
    """knative/serving pkg/autoscaler/scaling/autoscaler.go (Scale) with its defaults."""

    name = "KPA"
    tick, tick_phase = 2.0, 1.0
    scrape = 1.0
    stable_window, panic_window = 60.0, 6.0
    panic_threshold = 2.0
    max_scale_up_rate, max_scale_down_rate = 1000.0, 2.0

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.replicas = cfg.initial_replicas
        self.buckets: deque[tuple[float, float]] = deque()  # (time, average concurrency)
        self.panic_time: float | None = None
        self.max_panic_pods = 0

    def initial_standby(self) -> int:
        return 0

    def on_step(self, svc: Service) -> Action | None:
        t = svc.t
        if _due(t, self.scrape, 0.0, self.cfg.dt) and t > 0:
            self.buckets.append((t, svc.mean_queue(t - self.scrape, t)))
            while self.buckets and self.buckets[0][0] <= t - self.stable_window:
                self.buckets.popleft()
        if not _due(t, self.tick, self.tick_phase, self.cfg.dt) or not self.buckets:
            return None
        target = self.cfg.target_concurrency
        stable = [v for _, v in self.buckets]
        panic = [v for ts, v in self.buckets if ts > t - self.panic_window]
        observed_stable = sum(stable) / len(stable)
        observed_panic = sum(panic) / len(panic) if panic else observed_stable
        ready = max(1.0, float(svc.counts()[0]))
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        dspc = math.ceil(observed_stable / target)
        dppc = math.ceil(observed_panic / target)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= self.panic_threshold
        if over:
            self.panic_time = t
        elif self.panic_time is not None and self.panic_time + self.stable_window < t:
            self.panic_time = None
            self.max_panic_pods = 0
        desired = stable_pods
        if self.panic_time is not None:
            desired = max(desired, panic_pods)
            if desired > self.max_panic_pods:
                self.max_panic_pods = desired
            else:
                desired = self.max_panic_pods
        self.replicas = max(self.cfg.min_replicas, min(self.cfg.max_replicas, desired))
        return Action(self.replicas)


class Oracle:
    """Knows the trace: asks at t for what the largest rate of [t, t + warm-up] needs at the
    target utilisation, so replicas are warm when needed and none is removed that would be
    needed again before a new one could warm. Every pod serves (no standby)."""

    name = "oracle"
    tick = 1.0

    def __init__(self, cfg: SimConfig, trace: Trace) -> None:
        self.cfg = cfg
        self.trace = trace

    def initial_standby(self) -> int:
        return 0

    def on_step(self, svc: Service) -> Action | None:
        if not _due(svc.t, self.tick, 0.0, self.cfg.dt):
            return None
        ahead = np.arange(svc.t, svc.t + self.cfg.warmup_seconds + self.tick, self.cfg.dt)
        need = math.ceil(float(self.trace.rate(ahead).max()) / self.cfg.target_rate - 1e-9)
        return Action(max(self.cfg.min_replicas, min(self.cfg.max_replicas, need)))


# ------------------------------------------------------------------------------------------
# Running and reporting


@dataclass
class Result:
    trace: str
    policy: str
    late_share: float
    p99: float
    replica_seconds: float
    max_pods: int
    min_pods: int
    served: float
    hit_max: bool
    helper_seconds: float = 0.0  # replica-seconds another pool served (overflow)
    decisions: list[tuple[float, ScaleDecision]] = field(default_factory=list)


def make_arrivals(cfg: SimConfig, trace: Trace) -> np.ndarray:
    n = round(trace.duration / cfg.dt)
    t = np.arange(n) * cfg.dt
    rng = np.random.default_rng([cfg.seed, sum(map(ord, trace.name))])
    return rng.poisson(trace.rate(t) * cfg.dt).astype(np.float64)


def simulate(cfg: SimConfig, trace: Trace, scaler: Autoscaler, arrivals: np.ndarray) -> Result:
    warmup = getattr(scaler, "warmup_seconds", None)
    svc = Service(cfg, arrivals, scaler.initial_standby(), warmup() if warmup else None)
    for _ in range(len(arrivals)):
        svc.step()
        action = scaler.on_step(svc)
        if action is not None:
            svc.apply(action)
    # Requests still queued at the end count as late.
    leftover = sum(c[1] for c in svc.queue)
    lat = np.asarray([*svc.done_lat, cfg.client_timeout_seconds])
    cnt = np.asarray([*svc.done_n, leftover])
    total = float(cnt.sum())
    late = float(cnt[lat > cfg.latency_target_seconds].sum())
    return Result(
        trace=trace.name,
        policy=scaler.name,
        late_share=late / total if total else 0.0,
        p99=weighted_quantile(lat, cnt, 0.99),
        replica_seconds=float(svc.pods_hist.sum() * cfg.dt),
        max_pods=int(svc.pods_hist.max()),
        min_pods=int(svc.pods_hist.min()),
        served=total,
        hit_max=bool(svc.pods_hist.max() >= cfg.max_replicas),
        helper_seconds=svc.helper_seconds,
        decisions=getattr(scaler, "decisions", []),
    )


def make_scalers(cfg: SimConfig, trace: Trace) -> list[Autoscaler]:
    scalers: list[Autoscaler] = [Tidal(cfg), Hpa(cfg), Keda(cfg), Kpa(cfg), Oracle(cfg, trace)]
    return scalers


def run_all(
    cfg: SimConfig,
    traces: Sequence[Trace],
    what_if_warmup: float | None = None,
    overflow_replicas: int = 0,
    queue_mode: bool = False,
) -> list[Result]:
    """Every policy on every trace; with `what_if_warmup`, also tidal with that warm-up (the
    labelled host-warm what-if), everything else unchanged; with `overflow_replicas`, also
    tidal with a warm baseline of that many replicas as overflow capacity (rollout rule 8);
    with `queue_mode`, also tidal with `targetQueueDepth` set to the peers' concurrency target
    (0.7 in flight per replica) instead of `targetUtilization`."""
    results = []
    for trace in traces:
        arrivals = make_arrivals(cfg, trace)
        for scaler in make_scalers(cfg, trace):
            results.append(simulate(cfg, trace, scaler, arrivals))
        if what_if_warmup is not None:
            fast = replace(cfg, tidal_warmup_seconds=what_if_warmup)
            results.append(simulate(fast, trace, Tidal(fast), arrivals))
        if overflow_replicas > 0:
            helped = replace(cfg, tidal_overflow_replicas=overflow_replicas)
            results.append(simulate(helped, trace, Tidal(helped), arrivals))
        if queue_mode:
            queued = replace(cfg, tidal_target_queue_depth=cfg.target_concurrency)
            results.append(simulate(queued, trace, Tidal(queued), arrivals))
    return results


@dataclass(frozen=True)
class Verdict:
    trace: str
    checks: dict[str, bool]
    ratios: dict[str, float]

    @property
    def met(self) -> bool:
        return all(self.checks.values())

    def describe(self) -> str:
        parts = [
            f"{k} {'met' if v else 'NOT met'} ({self.ratios[k]:.2f})"
            for k, v in self.checks.items()
        ]
        return f"{self.trace}: " + ", ".join(parts)


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


def verdicts(results: Sequence[Result], policy: str = "tidal") -> list[Verdict]:
    """The goals of issue 11, per trace, for `policy` (tidal, or its what-if variant)."""
    by_trace: dict[str, dict[str, Result]] = {}
    for r in results:
        by_trace.setdefault(r.trace, {})[r.policy] = r
    out = []
    for name, rows in by_trace.items():
        if policy not in rows:
            continue
        t, kpa, hpa, oracle = rows[policy], rows["KPA"], rows["HPA"], rows["oracle"]
        ratios = {
            "late<=0.5xKPA": _ratio(t.late_share, kpa.late_share),
            "late<=0.1xHPA": _ratio(t.late_share, hpa.late_share),
            "cost<=1.2xKPA": _ratio(t.replica_seconds, kpa.replica_seconds),
            "peak<=1.5xoracle": _ratio(t.max_pods, oracle.max_pods),
        }
        # A late share of (almost) nothing meets the late goals whatever the peers do.
        tiny = t.late_share <= 1e-4
        checks = {
            "late<=0.5xKPA": tiny or ratios["late<=0.5xKPA"] <= 0.5,
            "late<=0.1xHPA": tiny or ratios["late<=0.1xHPA"] <= 0.1,
            "cost<=1.2xKPA": ratios["cost<=1.2xKPA"] <= 1.2,
            "peak<=1.5xoracle": ratios["peak<=1.5xoracle"] <= 1.5,
            "no-max": not t.hit_max,
        }
        ratios["no-max"] = float(t.max_pods)
        out.append(Verdict(name, checks, ratios))
    return out


def describe_config(cfg: SimConfig) -> str:
    return (
        f"one service: replica {cfg.replica_rate:.0f} req/s saturated "
        f"({cfg.slots} slot(s) x {cfg.service_seconds * 1000:.0f} ms); every policy targets "
        f"utilisation {cfg.target_utilization} (= {cfg.target_concurrency:g} in flight/replica, "
        f"{cfg.target_rate:.0f} req/s); warm-up {cfg.warmup_seconds:.0f} s; start {cfg.start} "
        f"({cfg.initial_replicas} replicas, backlog {cfg.initial_backlog:.0f}); latency target "
        f"{cfg.latency_target_seconds * 1000:.0f} ms, client timeout "
        f"{cfg.client_timeout_seconds:.0f} s; base {cfg.base_rate:.0f} req/s; replicas "
        f"{cfg.min_replicas}..{cfg.max_replicas}; tidal: standby {cfg.tidal_standby}, "
        f"scaleDownDelaySeconds {cfg.tidal_scale_down_delay:.0f}; dt {cfg.dt} s, seed {cfg.seed}"
    )


def report(cfg: SimConfig, results: Sequence[Result], elapsed: float) -> bool:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    console.print(describe_config(cfg))
    table = Table(title="autoscaling simulation (issue 11 traces)")
    cols = ("trace", "policy", "late %", "P99 s", "replica-s", "pods min..max", "note")
    for col in cols:
        table.add_column(col, justify="left" if col in ("trace", "policy", "note") else "right")
    traces: dict[str, list[Result]] = {}
    for r in results:
        traces.setdefault(r.trace, []).append(r)
    for name, rows in traces.items():
        for r in rows:
            table.add_row(
                name if r is rows[0] else "",
                r.policy,
                f"{r.late_share * 100:.2f}",
                f"{r.p99:.2f}",
                f"{r.replica_seconds:,.0f}",
                f"{r.min_pods}..{r.max_pods}",
                "scale-to-max"
                if r.hit_max
                else (f"+{r.helper_seconds:,.0f} baseline-s served" if r.helper_seconds else ""),
            )
        table.add_section()
    console.print(table)
    ok = True
    policies = sorted({r.policy for r in results if r.policy.startswith("tidal")})
    for policy in policies:
        for v in verdicts(results, policy):
            ok &= v.met or policy != "tidal"
            label = "goal" if policy == "tidal" else f"variant {policy}"
            console.print(f"{label} {v.describe()}")
    console.print(f"simulated {len(results)} runs in {elapsed:.1f} s")
    return ok


def sweep(cfg: SimConfig, traces: Sequence[Trace], warmups: Sequence[float]) -> None:
    """Goals met per trace for each warm-up and start state (compact)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title="goals per trace: tidal late/KPA, late/HPA, cost/KPA, peak/oracle")
    table.add_column("start")
    table.add_column("W s", justify="right")
    for trace in traces:
        table.add_column(trace.name, justify="right")
    for start in ("normal", "saturated"):
        for w in warmups:
            run = replace(cfg, warmup_seconds=w, start=start)
            results = run_all(run, traces)
            cells = []
            for v in verdicts(results):
                r = v.ratios
                mark = "ok" if v.met else "x"
                cells.append(
                    f"{r['late<=0.5xKPA']:.2f} {r['late<=0.1xHPA']:.2f} "
                    f"{r['cost<=1.2xKPA']:.2f} {r['peak<=1.5xoracle']:.2f}"
                    f"{'' if v.checks['no-max'] else ' MAX'} {mark}"
                )
            table.add_row(start, f"{w:g}", *cells)
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=float, default=SimConfig.warmup_seconds)
    parser.add_argument("--start", choices=["normal", "saturated"], default=SimConfig.start)
    parser.add_argument("--seed", type=int, default=SimConfig.seed)
    parser.add_argument("--standby", type=int, default=SimConfig.tidal_standby)
    parser.add_argument(
        "--max-standby",
        type=int,
        default=None,
        help="tidal's maxStandbyReplicas: the standby sized from the surges seen",
    )
    parser.add_argument("--scale-down-delay", type=float, default=SimConfig.tidal_scale_down_delay)
    parser.add_argument("--traces", default="", help="comma-separated subset of trace names")
    parser.add_argument(
        "--what-if-warmup",
        type=float,
        default=None,
        help="also run tidal with this warm-up (the host-warm tier's what-if, not built here)",
    )
    parser.add_argument(
        "--overflow",
        type=int,
        default=0,
        help="also run tidal with a warm baseline of this many replicas as overflow capacity",
    )
    parser.add_argument(
        "--queue-mode",
        action="store_true",
        help="also run tidal with targetQueueDepth (the peers' concurrency target)",
    )
    parser.add_argument("--sweep", action="store_true", help="warm-up 5/15/30/60 s x starts")
    args = parser.parse_args(argv)
    cfg = SimConfig(
        warmup_seconds=args.warmup,
        start=args.start,
        seed=args.seed,
        tidal_standby=args.standby,
        tidal_max_standby=args.max_standby,
        tidal_scale_down_delay=args.scale_down_delay,
    )
    traces = make_traces(cfg.base_rate, cfg.seed)
    if args.traces:
        wanted = set(args.traces.split(","))
        traces = [t for t in traces if t.name in wanted]
    started = time.perf_counter()
    if args.sweep:
        sweep(cfg, traces, (5.0, 15.0, 30.0, 60.0))
        print(f"swept in {time.perf_counter() - started:.1f} s")
        return 0
    results = run_all(cfg, traces, args.what_if_warmup, args.overflow, args.queue_mode)
    report(cfg, results, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
