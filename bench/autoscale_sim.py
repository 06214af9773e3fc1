"""Trace-driven simulation of one inference service under tidal's autoscaler and its peers.

Owns the simulator (a fluid FIFO queue in front of identical replicas, stepped every `dt`
seconds), the traces, faithful models of the peers' control loops (Kubernetes HPA, KEDA on top
of HPA, Knative's KPA) and the comparison table. Run it with

    .venv/bin/python bench/autoscale_sim.py [--warmup 20] [--seed 7] [--traces step5x,spike10x]

The model. Requests arrive as a Poisson process (seeded; every policy sees the same arrivals)
and wait in one FIFO queue (the Service balances ideally). A ready serving replica works on
`slots` requests at a time, each for `service_seconds`, so it serves `slots / service_seconds`
requests per second. A request's latency is its wait plus its service time; requests that wait
longer than `client_timeout_seconds` are abandoned and count as late. A new replica is warm
`warmup_seconds` after the decision that created it (scheduling, start, engine load, warm-up).
Every pod that exists costs replica-seconds, warming and standby ones included.

Every policy aims at the same per-replica target: `target_queue_depth` concurrent requests
(in flight plus queued), which is 70 % of a replica's slots, like Knative's default target
utilisation. Each peer sees the signals its real pipeline would give it:

* HPA: a Pods metric (queue depth per pod) from Prometheus scraped every 15 s, synced every 15 s;
  10 % tolerance; pods without a sample count as 0 when scaling up and as on target when scaling
  down; scale-down stabilisation 300 s (max of recommendations); scale-up limited per 15 s to
  max(+100 %, +4 pods) of the replicas at the period's start (the default `behavior`).
* KEDA: the same HPA, fed from KEDA's metric cache that polls Prometheus every 30 s.
* KPA: concurrency scraped every 1 s (per-second averages), decided every 2 s; stable window
  60 s, panic window 6 s, panic when the panic-window demand reaches 200 % of ready pods; no
  scale-down while panicking; max scale-up rate 1000, max scale-down rate 2.
* tidal: `decide_scale` every 1 s with the queue depth read from the pods (≤ 1 s old), the
  arrival rate over the last second, hot P99 from Prometheus (scraped every 5 s, 30 s window) and
  the measured warm-up time; standby pods promoted by `choose_standby`, victims chosen by
  `choose_scale_down_victims`.

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
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tidal.operator.core.autoscaler import (
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
)
from tidal.operator.core.autoscaler_pods import (
    PodView,
    choose_scale_down_victims,
    choose_standby,
)

# ------------------------------------------------------------------------------------------
# Configuration and traces


@dataclass(frozen=True)
class SimConfig:
    dt: float = 0.1
    service_seconds: float = 0.05
    slots: int = 5
    warmup_seconds: float = 20.0
    latency_target_seconds: float = 0.5
    client_timeout_seconds: float = 10.0
    target_queue_depth: float = 3.5
    base_rate: float = 700.0
    initial_replicas: int = 10
    min_replicas: int = 1
    max_replicas: int = 150
    # tidal's user-set knobs for the run (the rest are ScalingPolicy defaults).
    tidal_standby: int = 2
    tidal_scale_down_delay: float = 60.0
    seed: int = 7

    @property
    def replica_rate(self) -> float:
        """Requests per second one replica serves when saturated."""
        return self.slots / self.service_seconds

    @property
    def target_rate(self) -> float:
        """Requests per second one replica serves at the target queue depth."""
        return self.target_queue_depth / self.service_seconds


@dataclass(frozen=True)
class Trace:
    name: str
    duration: float
    rate: Callable[[np.ndarray], np.ndarray]
    # The surge window [onset, end) over which "time to enough warm capacity" is measured.
    surge: tuple[float, float] | None = None


def make_traces(base: float) -> list[Trace]:
    def steady(t: np.ndarray) -> np.ndarray:
        return np.full_like(t, base)

    def step5x(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 120) & (t < 420), 5 * base, base)

    def spike10x(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 120) & (t < 180), 10 * base, base)

    def diurnal(t: np.ndarray) -> np.ndarray:
        return base * (3 - 2 * np.cos(2 * np.pi * t / 1200))

    def flash(t: np.ndarray) -> np.ndarray:
        ramp = base * (1 + 7 * np.clip((t - 120) / 15, 0, 1))
        decay = base * (1 + 7 * np.exp(-(t - 195) / 60))
        return np.where(t < 195, ramp, decay)

    return [
        Trace("steady", 600, steady),
        Trace("step5x", 720, step5x, surge=(120, 420)),
        Trace("spike10x", 480, spike10x, surge=(120, 180)),
        Trace("diurnal", 1200, diurnal),
        Trace("flash", 600, flash, surge=(120, 195)),
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

    def __init__(self, cfg: SimConfig, arrivals: np.ndarray, initial_standby: int) -> None:
        self.cfg = cfg
        self.arrivals = arrivals
        self.t = 0.0
        self.i = 0
        self._names = 0
        self.pods: list[Pod] = []
        for k in range(cfg.initial_replicas + initial_standby):
            self.pods.append(self._new_pod(-1.0, standby=k >= cfg.initial_replicas))
        self.desired_serving: int | None = None
        self.queue: deque[list[float]] = deque()  # [arrival time, count]
        n = len(arrivals)
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
            self.pods.append(self._new_pod(self.t + self.cfg.warmup_seconds))
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
        capacity = len(serving_pods) * cfg.replica_rate * cfg.dt
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
            target_queue_depth=cfg.target_queue_depth,
            target_p99_ms=cfg.latency_target_seconds * 1000,
            standby_replicas=cfg.tidal_standby,
            scale_down_delay_seconds=cfg.tidal_scale_down_delay,
            p99_window_seconds=self.p99_window,
        )
        self.state = ScalerState()
        self.p99_ms: float | None = None
        self.decisions: list[tuple[float, ScaleDecision]] = []

    def initial_standby(self) -> int:
        return self.cfg.tidal_standby

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
            warmup_seconds=self.cfg.warmup_seconds,
            metrics_age_seconds=0.5,
        )
        decision, self.state = decide_scale(self.policy, obs, self.state)
        self.decisions.append((t, decision))
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
        target = self.cfg.target_queue_depth
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
    """HPA fed from KEDA's metrics cache, refreshed by polling Prometheus every 30 s."""

    name = "KEDA"
    poll, poll_phase = 30.0, 13.0

    def __init__(self, cfg: SimConfig) -> None:
        super().__init__(cfg)
        self.cached: float | None = None

    def metric(self, svc: Service) -> float | None:
        prometheus = super().metric(svc)
        if _due(svc.t, self.poll, self.poll_phase, self.cfg.dt):
            self.cached = prometheus
        return self.cached


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
        target = self.cfg.target_queue_depth
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


# ------------------------------------------------------------------------------------------
# Running and reporting


@dataclass
class Result:
    trace: str
    policy: str
    late_share: float
    p99: float
    time_to_capacity: float | None
    replica_seconds: float
    max_pods: int
    min_pods: int
    served: float
    decisions: list[tuple[float, ScaleDecision]] = field(default_factory=list)


def make_arrivals(cfg: SimConfig, trace: Trace) -> np.ndarray:
    n = round(trace.duration / cfg.dt)
    t = np.arange(n) * cfg.dt
    rng = np.random.default_rng([cfg.seed, sum(map(ord, trace.name))])
    return rng.poisson(trace.rate(t) * cfg.dt).astype(np.float64)


def simulate(cfg: SimConfig, trace: Trace, scaler: Autoscaler, arrivals: np.ndarray) -> Result:
    svc = Service(cfg, arrivals, scaler.initial_standby())
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
        time_to_capacity=_time_to_capacity(cfg, trace, svc),
        replica_seconds=float(svc.pods_hist.sum() * cfg.dt),
        max_pods=int(svc.pods_hist.max()),
        min_pods=int(svc.pods_hist.min()),
        served=total,
        decisions=getattr(scaler, "decisions", []),
    )


def _time_to_capacity(cfg: SimConfig, trace: Trace, svc: Service) -> float | None:
    """Seconds from the surge's onset until the warm serving replicas carry the nominal rate at
    the target queue depth again, after first falling short of it; None if not within the
    surge (or never short)."""
    if trace.surge is None:
        return None
    onset, end = trace.surge
    t = np.arange(len(svc.serving_hist)) * cfg.dt
    inside = (t >= onset) & (t < end)
    enough = svc.serving_hist * cfg.target_rate >= trace.rate(t) - 1e-9
    short = np.nonzero(inside & ~enough)[0]
    if not len(short):
        return None
    hits = np.nonzero(inside & enough & (np.arange(len(t)) > short[0]))[0]
    return float(t[hits[0]] - onset) if len(hits) else None


def make_scalers(cfg: SimConfig) -> list[Autoscaler]:
    return [Tidal(cfg), Hpa(cfg), Keda(cfg), Kpa(cfg)]


def run_all(cfg: SimConfig, traces: Sequence[Trace]) -> list[Result]:
    results = []
    for trace in traces:
        arrivals = make_arrivals(cfg, trace)
        for scaler in make_scalers(cfg):
            results.append(simulate(cfg, trace, scaler, arrivals))
    return results


def _ratio(a: float, b: float) -> str:
    if b == 0:
        return "—" if a == 0 else "∞"
    return f"{a / b:.2f}"


def report(cfg: SimConfig, results: Sequence[Result], elapsed: float) -> bool:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    console.print(
        f"one service: replica {cfg.replica_rate:.0f} req/s saturated "
        f"({cfg.slots} slots x {cfg.service_seconds * 1000:.0f} ms), target "
        f"{cfg.target_queue_depth} in flight+queued/replica (= {cfg.target_rate:.0f} req/s), "
        f"warm-up {cfg.warmup_seconds:.0f} s, "
        f"latency target {cfg.latency_target_seconds * 1000:.0f} ms, "
        f"client timeout {cfg.client_timeout_seconds:.0f} s, base {cfg.base_rate:.0f} req/s, "
        f"replicas {cfg.min_replicas}..{cfg.max_replicas} (start {cfg.initial_replicas}); "
        f"tidal: standby {cfg.tidal_standby}, "
        f"scaleDownDelaySeconds {cfg.tidal_scale_down_delay:.0f}; "
        f"dt {cfg.dt} s, seed {cfg.seed}"
    )
    table = Table(title="autoscaling simulation")
    for col in (
        "trace",
        "policy",
        "late %",
        "P99 s",
        "to capacity s",
        "replica-s",
        "pods min..max",
        "tidal late ratio",
        "tidal cost ratio",
    ):
        table.add_column(col, justify="left" if col in ("trace", "policy") else "right")
    by_trace: dict[str, list[Result]] = {}
    for r in results:
        by_trace.setdefault(r.trace, []).append(r)
    goals_ok = True
    verdicts = []
    for name, rows in by_trace.items():
        tidal = next(r for r in rows if r.policy == "tidal")
        for r in rows:
            ttc = "—" if r.time_to_capacity is None else f"{r.time_to_capacity:.1f}"
            late_ratio = "" if r is tidal else _ratio(tidal.late_share, r.late_share)
            cost_ratio = "" if r is tidal else _ratio(tidal.replica_seconds, r.replica_seconds)
            table.add_row(
                name if r is rows[0] else "",
                r.policy,
                f"{r.late_share * 100:.2f}",
                f"{r.p99:.2f}",
                ttc,
                f"{r.replica_seconds:,.0f}",
                f"{r.min_pods}..{r.max_pods}",
                late_ratio,
                cost_ratio,
            )
        table.add_section()
        if name in ("step5x", "spike10x", "flash"):
            kpa = next(r for r in rows if r.policy == "KPA")
            hpa = next(r for r in rows if r.policy == "HPA")
            checks = {
                "late<=0.5xKPA": tidal.late_share <= 0.5 * kpa.late_share,
                "late<=0.1xHPA": tidal.late_share <= 0.1 * hpa.late_share,
                "cost<=1.2xKPA": tidal.replica_seconds <= 1.2 * kpa.replica_seconds,
            }
            goals_ok &= all(checks.values())
            verdicts.append(
                f"{name}: "
                + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in checks.items())
            )
    console.print(table)
    for v in verdicts:
        console.print("goal " + v)
    console.print(f"simulated {len(results)} runs in {elapsed:.1f} s")
    return goals_ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=float, default=SimConfig.warmup_seconds)
    parser.add_argument("--seed", type=int, default=SimConfig.seed)
    parser.add_argument("--standby", type=int, default=SimConfig.tidal_standby)
    parser.add_argument("--scale-down-delay", type=float, default=SimConfig.tidal_scale_down_delay)
    parser.add_argument("--traces", default="", help="comma-separated subset of trace names")
    args = parser.parse_args(argv)
    cfg = SimConfig(
        warmup_seconds=args.warmup,
        seed=args.seed,
        tidal_standby=args.standby,
        tidal_scale_down_delay=args.scale_down_delay,
    )
    traces = make_traces(cfg.base_rate)
    if args.traces:
        wanted = set(args.traces.split(","))
        traces = [t for t in traces if t.name in wanted]
    started = time.perf_counter()
    results = run_all(cfg, traces)
    report(cfg, results, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
