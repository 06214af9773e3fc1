"""Trace-driven simulation of a fleet of many models on few GPU replicas (issue 10).

Owns the fleet simulator (event-driven: request arrivals, engine loads and their completions),
the traces, four placement/routing policies and the comparison table. Run it with

    .venv/bin/python bench/fleet_sim.py [--alpha 0.8,1.1] [--seed 7] [--quick]
    .venv/bin/python bench/fleet_sim.py --sweep [--seeds 1-10] [--families ...] [--quick]

`--sweep` (issue 23) judges on many traces: every family of `FAMILIES` (Zipf 0.8 and 1.1, a
rotating hot set, 3 viral models at once, a bursty tail, bursts of cold requests for 40
tail models in the same second (issue 30), a small easy fleet) on every seed,
with 200-s days, tidal and its alternatives (`SWEEP_VARIANTS`) against ModelMesh-like and
the optimum, over 2 worker processes; it prints the median and the worst seed of every metric
and each goal not met on a family's worst seed with its value.

The fleet. 200 models whose TensorRT engines weigh 0.2-4 GB (log-normal, median 1 GB, clipped);
8 replicas whose engine budgets together hold 15 % of all engine bytes (each budget still holds
the largest engine). A load copies the engine at the measured pinned host-to-device bandwidth
(55 GB/s, FACTS.md) and then pays a fixed deserialize + warm-up overhead (`load_overhead`). A
replica runs at most `concurrent_loads` loads at once (the runtime's `maxConcurrentLoads`, 2);
further loads wait in its queue; a running load occupies one of the replica's serving slots
(warm-up executes on the GPU), so churn costs serving capacity. A replica serves `slots`
requests at a time, each for `service_seconds`, FIFO; requests beyond that queue, so a hot
model's P99 reflects queueing. A request for a model that is not ready where it is sent is
*cold*: it waits for a load (its own or one under way) and then queues like any other; a
request refused (503: no room, load limit, hold timeout) counts as cold too. Engines that are
loading, have requests in flight or are pinned are never evicted (as in
`tidal.runtime.core.cache`). The baselines reserve a load's bytes when they queue it; tidal's
gateway asks the runtime as the real one does (`Sim.accept_load`, issue 30): the load is
accepted at once and reserves its bytes (evicting) only when it gets a load slot, and the
gateway sees what the runtime reports (`Tidal.snapshot`: `residentBytes` without the queued
loads, which `pendingLoads` names).

The traces (seeded, so every policy sees the same arrivals). Model k (0-based popularity rank;
names are shuffled) has Zipf share (k+1)^-alpha of `mean_rate` requests per second. The day is
compressed to `day_seconds` (1 simulated hour) and repeated `days` times (3) so that a forecast
can learn it: the whole fleet follows a daily cycle (+-50 %), and each model has its own daily
bump (a von Mises profile with a random peak hour and sharpness, from flat to ~3x its mean) so
which models are warm rotates through the day; each model keeps its Zipf share over a day. At
1.4 days a cold model (rank 150) goes viral: within 60 s it is as popular as the most popular
model, and stays so. Arrivals are Poisson per model per second. Figures are measured from the
start of day 2 (day 1 fills the caches and teaches the forecast); the hot models are the three
with the most requests in that window (the viral one among them).

The policies, on the same traces:

* `random+LRU` (tidal v0.1): the Service sends each request to a random replica; the replica
  loads on a miss and evicts its least recently used idle engines; 503 if it cannot make room.
* `ModelMesh-like`: route to a replica where the model is loaded (least outstanding requests);
  on a miss load it on one replica (one that has room, else the least loaded one that can make
  room by evicting LRU); when every loaded copy is busy (`busy_outstanding` requests in flight
  on it) load another copy in the background ("load on another copy when busy"); every 10 s add
  copies of models above 2,000 requests per minute per copy (ModelMesh's
  `scaleup_rpm_threshold`). No forecast. ModelMesh's second copy for recently used models is
  left out (it would only add churn).
* `tidal`: the gateway, modelled on `tidal.gateway.server`, routes every request with the real
  `tidal.gateway.core.routing.choose_route` over views built by `tidal.gateway.core.views` from
  the runtimes' snapshots and its own loads (reserved on dispatch, released on the answer;
  load limits 1 per replica and 4 in all, busy at 8 outstanding, refusals forgotten after
  2 s) and holds requests that are not forwarded until something changes (a load ends, a
  placement) or 30 s pass (503). Every 2 s the operator's fleet loop runs the shell's own steps
  on the runtimes' reports (`Tidal.reports`: states, sizes and load times measured on each
  replica, each runtime's cumulative request counter) with the API's defaults:
  `tidal.operator.core.fleet.learn_demands` (rates over the interval, smoothing, the forecast's
  `observe` and `predict_peak` over each model's load time + 5 s lead) and `plan_placement`
  (`place` with the pins last sent and the previous placement); each replica loads the models
  pinned on it in the background (one at a time, in name order, as the runtime does) and keeps
  unpinned ones as an LRU cache. The forecast's period is set to the compressed day
  (`spec.fleet.forecast.period: 1h`); its other knobs keep their defaults. A model no replica
  has loaded yet is passed to placement as a guess (`size_known=False`, sized as the largest
  measured so far), as `fleet.model_demands` does for a model with no size.
* `optimum`: Belady with future knowledge: on a miss evict the engines whose next request is
  farthest in the future, on the replica where that costs least; route to a replica that holds
  the model. It is the optimal *demand-loading* policy for one cache of equal-size entries; here
  (sizes differ, 8 separate budgets, loads take time) it is a near-optimal reference rather than
  a proof, and a policy that preloads from a forecast can beat it.

Metrics per policy and trace: cold-request share, hot-model P99 and overall P99 latency, GB
loaded per hour (churn), loads per hour, refused (503) share, and ratios against the baselines
of the same run. Every policy is also run on the trace restricted to the hot models (the cold
traffic removed): the goal "hot-model P99 unaffected by cold traffic" compares the two.
"""

from __future__ import annotations

import argparse
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from tidal.gateway.core.routing import LoadBudget, ReplicaView, choose_route
from tidal.gateway.core.views import NO_LOADS, OwnLoads, Snapshot, model_bytes, replica_view
from tidal.operator.core.api import Model
from tidal.operator.core.fleet import (
    DemandState,
    ModelReport,
    ReplicaReport,
    learn_demands,
    plan_placement,
)
from tidal.operator.core.forecast import ForecastPolicy, period_mean
from tidal.operator.core.placement import ModelDemand, Placement, PlacementPolicy

GB = 1e9

# ------------------------------------------------------------------------------------------
# Configuration and traces


@dataclass(frozen=True)
class FleetConfig:
    models: int = 200
    size_median_gb: float = 1.0
    size_sigma: float = 0.7
    size_min_gb: float = 0.2
    size_max_gb: float = 4.0
    replicas: int = 8
    cache_share: float = 0.15  # of all engine bytes, over all replicas together
    pinned_gbps: float = 55.0  # FACTS.md, host->device from pinned memory
    load_overhead: float = 0.3  # seconds of deserialize + warm-up, fixed per load
    concurrent_loads: int = 2  # per replica (the runtime's maxConcurrentLoads default)
    service_seconds: float = 0.04
    slots: int = 4
    mean_rate: float = 12.0  # requests per second over the fleet, averaged over a day
    day_seconds: float = 3600.0
    days: int = 3
    fleet_swing: float = 0.5  # the whole fleet's daily cycle, +-
    max_bump: float = 2.0  # sharpness (von Mises kappa) of the sharpest model's daily bump
    viral_rank: int = 150
    viral_at_days: float = 1.4
    viral_ramp_seconds: float = 60.0
    measure_from_days: float = 1.0
    hot_models: int = 3
    # ModelMesh's knobs (its defaults).
    modelmesh_rpm_per_copy: float = 2000.0
    modelmesh_tick_seconds: float = 10.0
    # tidal's knobs: the API's defaults (spec.fleet.*) and the gateway's.
    busy_outstanding: int = 8  # gateway busyOutstanding; also ModelMesh's in-flight limit
    loads_per_replica: int = 1  # gateway maxLoadsPerReplica
    loads_total: int | None = None  # gateway maxLoadsTotal (None: sized from the fleet)
    hold_timeout: float = 30.0  # gateway holdTimeoutSeconds
    refused_cooldown: float = 2.0  # gateway refusedCooldownSeconds
    placement_interval: float = 2.0  # spec.fleet.placement.intervalSeconds
    rate_per_copy: float = 50.0  # spec.fleet.placement.ratePerCopy
    min_rate: float = 0.01  # spec.fleet.placement.minRate
    headroom: float = 0.2  # spec.fleet.placement.headroom
    rate_window: float = 60.0  # spec.fleet.placement.rateWindowSeconds
    forecast: bool = True  # spec.fleet.forecast.enabled
    forecast_slots: int = 96  # spec.fleet.forecast.slots
    lead_seconds: float = 5.0  # spec.fleet.forecast.leadSeconds
    seed: int = 7
    # Trace family (issue 23): "zipf" (the daily cycle + one viral model), "rotating" (the top
    # models change places with tail models every `rotate_seconds`), "viral" (`virals` tail
    # models go viral at once), "bursty" (each tail model bursts to `burst_factor` x its rate
    # for `burst_seconds`, on average every `burst_gap_seconds` of simulated time).
    family: str = "zipf"
    rotate_seconds: float = 600.0
    rotate_top: int = 5
    virals: int = 3
    burst_factor: float = 30.0
    burst_seconds: float = 20.0
    burst_gap_seconds: float = 1800.0
    # "coldburst" (issue 30): `cold_bursts_per_day` times a day, `cold_burst_models` tail models
    # (beyond the top 20) each get `cold_burst_rate` requests in the same second.
    cold_bursts_per_day: int = 8
    cold_burst_models: int = 40
    cold_burst_rate: float = 2.0

    @property
    def duration(self) -> float:
        return self.day_seconds * self.days

    @property
    def measure_from(self) -> float:
        return self.day_seconds * self.measure_from_days

    def load_seconds(self, size_bytes: float) -> float:
        return size_bytes / (self.pinned_gbps * GB) + self.load_overhead


# --quick: 40 models over 3 days of 5 minutes (a smoke test, a few seconds).
QUICK = {
    "models": 40,
    "mean_rate": 4.0,
    "day_seconds": 300.0,
    "viral_rank": 30,
    "viral_ramp_seconds": 10.0,
}


@dataclass(frozen=True)
class Fleet:
    """The models and replicas of a run (the same for every trace of a seed)."""

    sizes: np.ndarray  # bytes per model, by popularity rank
    budget: float  # bytes per replica
    names: tuple[str, ...]  # by popularity rank; shuffled so that name order means nothing


def make_fleet(cfg: FleetConfig) -> Fleet:
    rng = np.random.default_rng([cfg.seed, 1])
    sizes = np.exp(rng.normal(math.log(cfg.size_median_gb), cfg.size_sigma, cfg.models))
    sizes = np.round(np.clip(sizes, cfg.size_min_gb, cfg.size_max_gb) * GB)
    budget = float(math.floor(cfg.cache_share * sizes.sum() / cfg.replicas))
    names = tuple(f"m{k:03d}" for k in rng.permutation(cfg.models))
    return Fleet(sizes=sizes, budget=max(budget, float(sizes.max())), names=names)


@dataclass(frozen=True)
class Trace:
    name: str
    alpha: float
    times: np.ndarray  # arrival times, sorted
    models: np.ndarray  # model (popularity rank) per request
    viral: int
    hot: tuple[int, ...]  # the hot models (most requests in the measured window)

    def __len__(self) -> int:
        return len(self.times)

    def only(self, models: Sequence[int], name: str) -> Trace:
        keep = np.isin(self.models, np.asarray(models))
        return replace(self, name=name, times=self.times[keep], models=self.models[keep])

    def next_times(self) -> np.ndarray:
        """For each request, the arrival time of the next request for the same model (inf if
        none): the future knowledge of the offline optimum."""
        n = len(self.times)
        order = np.lexsort((np.arange(n), self.models))
        nxt = np.full(n, np.inf)
        same = self.models[order[1:]] == self.models[order[:-1]]
        nxt[order[:-1][same]] = self.times[order[1:][same]]
        return nxt


def zipf_shares(n: int, alpha: float) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return np.asarray(w / w.sum())


def _daily_shape(cfg: FleetConfig, t: np.ndarray) -> np.ndarray:
    """Each model's rate over its mean, models x times (one day averages to 1 per model)."""
    rng = np.random.default_rng([cfg.seed, 2])  # the daily profiles do not depend on alpha
    peak_hour = rng.uniform(0.0, 1.0, cfg.models)
    kappa = rng.uniform(0.0, cfg.max_bump, cfg.models)

    def shape(times: np.ndarray) -> np.ndarray:
        phase = 2 * np.pi * times / cfg.day_seconds
        fleet = 1.0 + cfg.fleet_swing * np.sin(phase - np.pi / 2)  # trough at midnight
        bump = np.exp(kappa[:, None] * np.cos(phase[None, :] - 2 * np.pi * peak_hour[:, None]))
        return np.asarray(fleet[None, :] * bump)

    day = shape(np.arange(0.0, cfg.day_seconds, 1.0))
    return np.asarray(shape(t) / day.mean(axis=1)[:, None])


def trace_rates(cfg: FleetConfig, alpha: float, t: np.ndarray) -> np.ndarray:
    """Expected requests per second, models x times (the viral model included)."""
    shares = zipf_shares(cfg.models, alpha)
    rates = np.asarray(cfg.mean_rate * shares[:, None] * _daily_shape(cfg, t))
    # The viral model: from its own small share to the top model's, flat through the day
    # apart from the fleet's cycle.
    v = cfg.viral_rank - 1
    onset = cfg.viral_at_days * cfg.day_seconds
    ramp = np.clip((t - onset) / cfg.viral_ramp_seconds, 0.0, 1.0)
    fleet = 1.0 + cfg.fleet_swing * np.sin(2 * np.pi * t / cfg.day_seconds - np.pi / 2)
    virals = [v]
    if cfg.family == "viral":  # more tail models go viral at the same moment
        virals = [cfg.models - 1 - k * max(1, cfg.models // 8) for k in range(cfg.virals)]
    for v in virals:
        rates[v] = (1 - ramp) * rates[v] + ramp * cfg.mean_rate * shares[0] * fleet
    rng = np.random.default_rng([cfg.seed, 5])
    if cfg.family == "rotating":
        # Every rotate_seconds the top models swap their popularity with random tail models.
        epochs = (t // cfg.rotate_seconds).astype(np.int64)
        base = rates.copy()
        tail = np.arange(cfg.rotate_top * 2, cfg.models)
        for e in np.unique(epochs):
            if e == 0:
                continue
            cols = epochs == e
            swap = rng.choice(tail, cfg.rotate_top, replace=False)
            for top, other in zip(range(cfg.rotate_top), swap, strict=True):
                rates[top, cols], rates[other, cols] = base[other, cols], base[top, cols]
    if cfg.family == "bursty":
        # Tail models (beyond the top 10) burst now and then: burst_factor x for burst_seconds.
        bursts = rng.poisson(cfg.duration / cfg.burst_gap_seconds, cfg.models)
        for m in range(10, cfg.models):
            on = np.zeros(len(t), dtype=bool)  # overlapping bursts do not compound
            for start in rng.uniform(0.0, cfg.duration, bursts[m]):
                on |= (t >= start) & (t < start + cfg.burst_seconds)
            rates[m, on] *= cfg.burst_factor
    if cfg.family == "coldburst":
        # Many cold models at once: a batch job or a new tenant touching models nobody uses.
        tail = np.arange(min(20, cfg.models // 2), cfg.models)
        count = min(cfg.cold_burst_models, len(tail))
        for start in rng.uniform(0.0, cfg.duration, int(cfg.cold_bursts_per_day * cfg.days)):
            col = np.searchsorted(t, math.floor(start))
            if col < len(t):
                rates[rng.choice(tail, count, replace=False), col] += cfg.cold_burst_rate
    return rates


def make_trace(cfg: FleetConfig, alpha: float) -> Trace:
    """Poisson arrivals per model per second from `trace_rates`, seeded by (seed, alpha)."""
    rng = np.random.default_rng([cfg.seed, 3, round(alpha * 1000)])
    t = np.arange(0.0, cfg.duration, 1.0)
    counts = rng.poisson(trace_rates(cfg, alpha, t + 0.5))  # models x seconds
    models = np.repeat(np.arange(cfg.models), counts.sum(axis=1))
    seconds = np.concatenate([np.repeat(t, row) for row in counts])
    times = seconds + rng.uniform(0.0, 1.0, len(seconds))
    order = np.argsort(times, kind="stable")
    times, models = times[order], models[order].astype(np.int32)
    window = times >= cfg.measure_from
    per_model = np.bincount(models[window], minlength=cfg.models)
    hot = tuple(int(m) for m in np.argsort(-per_model, kind="stable")[: cfg.hot_models])
    name = f"zipf {alpha:g}" if cfg.family == "zipf" else f"{cfg.family} {alpha:g}"
    return Trace(name, alpha, times, models, cfg.viral_rank - 1, hot)


# ------------------------------------------------------------------------------------------
# The fleet's mechanics: replicas, engines, loads, queues

LOADING, READY = 0, 1


@dataclass(eq=False)
class Engine:
    """One model's engine on one replica (bytes reserved from the moment its load is queued)."""

    model: int
    size: float
    replica: int
    load_seconds: float
    state: int = LOADING
    ready_at: float = math.inf
    last_used: float = 0.0
    busy_until: float = 0.0  # the last completion of a request sent to it
    pinned: bool = False
    background: bool = False  # a pinned model's background load (the runtime runs one)
    started: bool = False  # its load holds one of the replica's load slots
    reserved: bool = True  # its bytes count in the replica's `used` (see `Sim.accept_load`)
    queued_at: float = 0.0  # when the replica accepted its load
    reason: str = ""  # why it loads (`LoadRecord.reason`), for a load reserved when it starts
    waiters: list[int] = field(default_factory=list)
    done: deque[float] = field(default_factory=deque)  # completions of its requests in flight

    def in_flight(self, t: float) -> int:
        done = self.done
        while done and done[0] <= t:
            done.popleft()
        return len(done) + len(self.waiters)

    def idle(self, t: float) -> bool:
        return self.state == READY and self.busy_until <= t and not self.waiters


@dataclass(eq=False)
class Replica:
    index: int
    name: str
    budget: float
    slots: list[float]  # heap: when each serving slot is free next
    used: float = 0.0
    engines: dict[int, Engine] = field(default_factory=dict)
    done: deque[float] = field(default_factory=deque)  # completions of requests in flight
    waiting: int = 0  # requests here waiting for a load
    running: int = 0  # loads running
    load_queue: deque[Engine] = field(default_factory=deque)
    version: int = 0  # bumps when an engine is added, becomes ready or is evicted
    measured: dict[int, float] = field(default_factory=dict)  # last loaded size per model
    measured_load: dict[int, float] = field(default_factory=dict)  # its load's seconds
    queue_peak: int = 0  # the longest its load queue has been

    def outstanding(self, t: float) -> int:
        done = self.done
        while done and done[0] <= t:
            done.popleft()
        return len(done) + self.waiting

    @property
    def free(self) -> float:
        return self.budget - self.used


@dataclass(frozen=True)
class LoadRecord:
    at: float
    model: int
    replica: int
    size: float
    reason: str


class Sim:
    """The state of one run; policies act on it through `send`, `load` and `evict`."""

    def __init__(self, cfg: FleetConfig, fleet: Fleet, trace: Trace) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.trace = trace
        self.replicas = [
            Replica(r, f"replica-{r}", fleet.budget, [0.0] * cfg.slots) for r in range(cfg.replicas)
        ]
        self.copies: list[dict[int, Engine]] = [{} for _ in range(cfg.models)]
        self.events: list[tuple[float, int, Engine]] = []
        self._seq = 0
        n = len(trace)
        self.arrivals = trace.times
        self.latency = np.full(n, np.nan)
        self.cold = np.zeros(n, dtype=bool)
        self.failed = np.zeros(n, dtype=bool)
        self.loads: list[LoadRecord] = []
        self.evictions = 0
        self.load_seconds = [cfg.load_seconds(s) for s in fleet.sizes]
        self.on_ready: Callable[[Sim, Engine, float], None] | None = None
        # A load `accept_load` queued found no room when its turn came (the runtime's 503).
        self.on_refused: Callable[[Sim, Engine, float], None] | None = None
        self.max_used = 0.0
        self.load_waits: list[float] = []  # per load: seconds queued for a load slot

    # -- time ------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Complete every load that finishes by `t`, in time order."""
        events = self.events
        while events and events[0][0] <= t:
            at, _, engine = heapq.heappop(events)
            self._load_done(engine, at)

    # -- requests --------------------------------------------------------------------------
    def send(self, i: int, engine: Engine, t: float) -> None:
        """Request `i` goes to `engine` at `t`: served now, or after its load (cold)."""
        engine.last_used = t
        if engine.state == READY:
            self._join(i, engine, t)
        else:
            self.cold[i] = True
            engine.waiters.append(i)
            self.replicas[engine.replica].waiting += 1

    def fail(self, i: int) -> None:
        self.failed[i] = True
        self.cold[i] = True

    def _join(self, i: int, engine: Engine, t: float) -> None:
        replica = self.replicas[engine.replica]
        slots = replica.slots
        start = slots[0] if slots[0] > t else t
        end = start + self.cfg.service_seconds
        heapq.heapreplace(slots, end)
        self.latency[i] = end - self.arrivals[i]
        replica.done.append(end)
        engine.done.append(end)
        engine.busy_until = end

    # -- loads and evictions ---------------------------------------------------------------
    def victims(
        self, replica: Replica, size: float, t: float, key: Callable[[Engine], float]
    ) -> list[Engine] | None:
        """Idle, unpinned engines to evict (in `key` order) so that `size` bytes fit; None if
        there are not enough (the rule of `tidal.runtime.core.cache.plan_admission`)."""
        if size > replica.budget:
            return None
        free = replica.free
        if size <= free:
            return []
        chosen: list[Engine] = []
        for e in sorted(
            (e for e in replica.engines.values() if not e.pinned and e.idle(t)), key=key
        ):
            chosen.append(e)
            free += e.size
            if size <= free:
                return chosen
        return None

    def room_at(self, replica: Replica, size: float, t: float) -> float | None:
        """When a refused load would find room there: the end of the requests in flight on
        the unpinned engines that hold it (a runtime's refusal names them, `waitingOn`, and
        its long-poll moves when they end); None where pins or loads hold it."""
        held = [
            e
            for e in replica.engines.values()
            if not e.pinned and not e.idle(t) and e.state == READY and not e.waiters
        ]
        idle = sum(e.size for e in replica.engines.values() if not e.pinned and e.idle(t))
        if not held or size > replica.free + idle + sum(e.size for e in held):
            return None
        return max(e.busy_until for e in held)

    def evict(self, engine: Engine) -> None:
        replica = self.replicas[engine.replica]
        del replica.engines[engine.model]
        del self.copies[engine.model][engine.replica]
        replica.used -= engine.size
        replica.version += 1
        self.evictions += 1

    def load(
        self,
        model: int,
        replica: Replica,
        t: float,
        victims: Sequence[Engine],
        reason: str,
        pinned: bool = False,
    ) -> Engine:
        """Evict `victims`, reserve the bytes and queue the load on `replica`."""
        for v in victims:
            self.evict(v)
        size = float(self.fleet.sizes[model])
        assert model not in replica.engines and size <= replica.free + 1e-6
        engine = Engine(model, size, replica.index, self.load_seconds[model], pinned=pinned)
        replica.used += size
        self.max_used = max(self.max_used, replica.used / replica.budget)
        self.loads.append(LoadRecord(t, model, replica.index, size, reason))
        return self._queue(replica, engine, t)

    def accept_load(
        self, model: int, replica: Replica, t: float, reason: str, pinned: bool = False
    ) -> Engine:
        """Queue a load as the runtime does (`POST .../load`, `EngineCache._load`): accepted at
        once, its bytes reserved and its victims evicted only when it gets a load slot; if no
        room can be made then, it fails (`on_refused`)."""
        size = float(self.fleet.sizes[model])
        engine = Engine(model, size, replica.index, self.load_seconds[model], pinned=pinned)
        engine.reserved, engine.reason = False, reason
        return self._queue(replica, engine, t)

    def _queue(self, replica: Replica, engine: Engine, t: float) -> Engine:
        engine.last_used = engine.queued_at = t
        replica.engines[engine.model] = engine
        self.copies[engine.model][replica.index] = engine
        replica.version += 1
        if replica.running < self.cfg.concurrent_loads:
            self._start_load(replica, engine, t)
        else:
            replica.load_queue.append(engine)
            replica.queue_peak = max(replica.queue_peak, len(replica.load_queue))
        return engine

    def _reserve(self, replica: Replica, engine: Engine, t: float) -> bool:
        victims = self.victims(replica, engine.size, t, lru_key)
        if victims is None:
            del replica.engines[engine.model]
            del self.copies[engine.model][replica.index]
            replica.version += 1
            waiters, engine.waiters = engine.waiters, []
            replica.waiting -= len(waiters)
            for i in waiters:
                self.fail(i)
            if self.on_refused is not None:
                self.on_refused(self, engine, t)
            return False
        for v in victims:
            self.evict(v)
        replica.used += engine.size
        engine.reserved = True
        self.loads.append(LoadRecord(t, engine.model, replica.index, engine.size, engine.reason))
        self.max_used = max(self.max_used, replica.used / replica.budget)
        return True

    def _start_load(self, replica: Replica, engine: Engine, t: float) -> None:
        if not engine.reserved and not self._reserve(replica, engine, t):
            if replica.load_queue and replica.running < self.cfg.concurrent_loads:
                self._start_load(replica, replica.load_queue.popleft(), t)
            return
        replica.running += 1
        engine.started = True
        replica.version += 1
        self.load_waits.append(t - engine.queued_at)
        slots = replica.slots
        start = slots[0] if slots[0] > t else t
        end = start + engine.load_seconds
        heapq.heapreplace(slots, end)
        engine.ready_at = end
        self._seq += 1
        heapq.heappush(self.events, (end, self._seq, engine))

    def _load_done(self, engine: Engine, t: float) -> None:
        replica = self.replicas[engine.replica]
        engine.state = READY
        replica.running -= 1
        replica.version += 1
        replica.measured[engine.model] = engine.size
        replica.measured_load[engine.model] = engine.load_seconds
        waiters, engine.waiters = engine.waiters, []
        replica.waiting -= len(waiters)
        for i in waiters:
            self._join(i, engine, t)
        if replica.load_queue:
            self._start_load(replica, replica.load_queue.popleft(), t)
        if self.on_ready is not None:
            self.on_ready(self, engine, t)


def lru_key(e: Engine) -> float:
    return e.last_used


# ------------------------------------------------------------------------------------------
# Policies


class Policy(Protocol):
    name: str
    tick_seconds: float | None

    def start(self, sim: Sim) -> None: ...

    def route(self, sim: Sim, i: int, model: int, t: float) -> None: ...

    def tick(self, sim: Sim, t: float) -> None: ...

    def finish(self, sim: Sim) -> None: ...


class RandomLRU:
    """tidal v0.1: any replica; the replica loads on a miss and evicts LRU."""

    name = "random+LRU"
    tick_seconds: float | None = None

    def start(self, sim: Sim) -> None:
        rng = np.random.default_rng([sim.cfg.seed, 4, len(sim.trace)])
        self.choice = rng.integers(0, sim.cfg.replicas, len(sim.trace)).tolist()

    def route(self, sim: Sim, i: int, model: int, t: float) -> None:
        replica = sim.replicas[self.choice[i]]
        engine = replica.engines.get(model)
        if engine is None:
            victims = sim.victims(replica, sim.fleet.sizes[model], t, lru_key)
            if victims is None:
                sim.fail(i)  # the runtime's 503 (Overloaded): nothing idle to evict
                return
            engine = sim.load(model, replica, t, victims, "miss")
        sim.send(i, engine, t)

    def tick(self, sim: Sim, t: float) -> None:
        pass

    def finish(self, sim: Sim) -> None:
        pass


class ModelMeshLike:
    """Route to loaded copies; load on a miss, LRU; another copy when busy; no forecast."""

    name = "ModelMesh-like"

    def __init__(self, cfg: FleetConfig) -> None:
        self.tick_seconds: float | None = cfg.modelmesh_tick_seconds
        self.busy = cfg.busy_outstanding
        self.rpm = cfg.modelmesh_rpm_per_copy

    def start(self, sim: Sim) -> None:
        self.counts = np.zeros(sim.cfg.models)
        self.window: deque[np.ndarray] = deque()

    def place_new(self, sim: Sim, model: int, t: float, reason: str) -> Engine | None:
        """Load one more copy: on a replica with room if any (least outstanding first), else on
        the least loaded replica that can make room by evicting LRU."""
        size = sim.fleet.sizes[model]
        best: tuple[tuple[int, int, int], Replica, list[Engine]] | None = None
        for replica in sim.replicas:
            if model in replica.engines:
                continue
            victims = sim.victims(replica, size, t, lru_key)
            if victims is None:
                continue
            rank = (1 if victims else 0, replica.outstanding(t), replica.index)
            if best is None or rank < best[0]:
                best = (rank, replica, victims)
        if best is None:
            return None
        return sim.load(model, best[1], t, best[2], reason)

    def route(self, sim: Sim, i: int, model: int, t: float) -> None:
        self.counts[model] += 1
        copies = sim.copies[model]
        if not copies:
            engine = self.place_new(sim, model, t, "miss")
            if engine is None:
                sim.fail(i)
                return
            sim.send(i, engine, t)
            return
        ready = [e for e in copies.values() if e.state == READY]
        if not ready:  # only loading copies: wait for the least loaded one
            engine = min(copies.values(), key=lambda e: sim.replicas[e.replica].outstanding(t))
            sim.send(i, engine, t)
            return
        engine = min(ready, key=lambda e: sim.replicas[e.replica].outstanding(t))
        if (
            len(ready) == len(copies)
            and len(copies) < sim.cfg.replicas
            and all(e.in_flight(t) >= self.busy for e in ready)
        ):
            self.place_new(sim, model, t, "busy")
        sim.send(i, engine, t)

    def tick(self, sim: Sim, t: float) -> None:
        """rateTrackingTask: more copies for models above the per-copy rate threshold."""
        self.window.append(self.counts)
        self.counts = np.zeros(sim.cfg.models)
        period = self.tick_seconds or 60.0
        per_minute = max(1, round(60.0 / period))
        while len(self.window) > per_minute:
            self.window.popleft()
        rpm = np.sum(self.window, axis=0) * 60.0 / (period * len(self.window))
        for model in np.nonzero(rpm > self.rpm)[0]:
            copies = len(sim.copies[model])
            if copies == 0 or rpm[model] / copies <= self.rpm:
                continue
            want = min(math.ceil(rpm[model] / self.rpm), sim.cfg.replicas)
            for _ in range(min(want - copies, max(2, sim.cfg.replicas // 3))):
                if self.place_new(sim, int(model), t, "rate") is None:
                    break

    def finish(self, sim: Sim) -> None:
        pass


class Belady:
    """Offline optimum (demand loading): evict what is needed farthest in the future."""

    name = "optimum"
    tick_seconds: float | None = None

    def start(self, sim: Sim) -> None:
        trace = sim.trace
        self.next_time = trace.next_times().tolist()
        self.next_use = np.full(sim.cfg.models, np.inf)
        # Before its first request, a model's next use is that request.
        models, firsts = np.unique(trace.models, return_index=True)
        self.next_use[models] = trace.times[firsts]

    def route(self, sim: Sim, i: int, model: int, t: float) -> None:
        next_use = self.next_use
        next_use[model] = self.next_time[i]
        copies = sim.copies[model]
        if copies:
            engine = min(copies.values(), key=lambda e: sim.replicas[e.replica].outstanding(t))
            sim.send(i, engine, t)
            return
        size = sim.fleet.sizes[model]

        def farthest_first(e: Engine) -> float:
            return float(-next_use[e.model])

        best: tuple[tuple[float, int, int], Replica, list[Engine]] | None = None
        for replica in sim.replicas:
            victims = sim.victims(replica, size, t, farthest_first)
            if victims is None:
                continue
            # The cost of a choice: how soon the first victim is needed again (later is better).
            soonest = min((float(next_use[v.model]) for v in victims), default=math.inf)
            rank = (-soonest, replica.outstanding(t), replica.index)
            if best is None or rank < best[0]:
                best = (rank, replica, victims)
        if best is None:
            sim.fail(i)
            return
        sim.send(i, sim.load(model, best[1], t, best[2], "miss"), t)

    def tick(self, sim: Sim, t: float) -> None:
        pass

    def finish(self, sim: Sim) -> None:
        pass


@dataclass(eq=False)
class _GatewayReplica:
    """The gateway's state of one replica: its last snapshot (rebuilt only when the replica
    changes), its own loads there and its refusals; as `tidal.gateway.server.Replica`."""

    version: int = -1  # the replica's version the snapshot was taken at
    snapshot: Snapshot = field(default_factory=Snapshot)
    own: OwnLoads = NO_LOADS
    refused: dict[int, float] = field(default_factory=dict)  # model -> forgiven at
    forgive_at: float = math.inf  # the earliest of those
    views: dict[int, ReplicaView] = field(default_factory=dict)  # by outstanding


class Tidal:
    """tidal v0.2: the gateway's routing core and the operator's forecast + placement cores."""

    name = "tidal"
    # The gateway's maxLoadsTotal where a variant fixes it (None: the config's).
    loads_total: int | None = None
    # A refusal naming the requests that hold the room is retried when they end (issue 45);
    # False: after refusedCooldownSeconds, as before.
    retry_when_room = True
    # The operator's rateWindowSeconds (None: the config's), placement's landing share, and
    # whether the gateway counts background pin loads in its per-replica load limit.
    rate_window: float | None = None
    landing_share = 0.25  # spec.fleet.placement.landingShare
    pin_loads_count = False
    # Issue 23: hot models may pin into the headroom; a rise to the hot rate is taken at once.
    hot_in_headroom = True
    slow_rise = False
    # Lead (c): placement knows which sizes are guesses (False: every guess counts as known).
    learn_sizes = True
    # Issue 23, third pass: the number of landing replicas follows the tail's share of demand,
    # and a load that fits in free bytes goes beyond the gateway's load limits.
    landing_follows_tail = True
    loads_beyond_into_free = True
    # Issue 30: free bytes count the loads queued at the runtime and the gateway's own loads,
    # and loads into free bytes stop at the replica's load slots (False: as before the fix).
    count_loads_under_way = True
    # Issue 23, sixth pass: placement's rates are at least each model's mean over the
    # forecast's period (`fleet.placement_rates`, as the shell); tried and not adopted
    # (`TidalDailyMeanForecast`): the forecast at least that mean instead.
    daily_mean_rate = True
    daily_mean_forecast = False

    def __init__(self, cfg: FleetConfig, only_models_with_traffic: bool = False) -> None:
        self.cfg = cfg
        self.only_models_with_traffic = only_models_with_traffic
        self.tick_seconds: float | None = cfg.placement_interval
        self.placement_policy = PlacementPolicy(
            rate_per_copy=cfg.rate_per_copy,
            max_copies=None,
            min_rate=cfg.min_rate,
            headroom_fraction=cfg.headroom,
            landing_share=self.landing_share,
            hot_in_headroom=self.hot_in_headroom,
            landing_follows_tail=self.landing_follows_tail,
        )
        self.forecast_policy = ForecastPolicy(
            period_seconds=cfg.day_seconds, slots=cfg.forecast_slots
        )
        self.budget = LoadBudget(
            per_replica=cfg.loads_per_replica,
            total=cfg.loads_total if self.loads_total is None else self.loads_total,
            beyond_into_free=self.loads_beyond_into_free,
        )
        self.decisions: dict[str, int] = {}
        self.placement_seconds = 0.0

    # -- set-up ----------------------------------------------------------------------------
    def start(self, sim: Sim) -> None:
        self.names = sim.fleet.names
        # The service's models (a fleet of only the hot models for the hot-only traces).
        self.served = (
            sorted({int(m) for m in np.unique(sim.trace.models)})
            if self.only_models_with_traffic
            else list(range(sim.cfg.models))
        )
        self.all_names = frozenset(self.names[m] for m in self.served)
        self.index = {n: k for k, n in enumerate(self.names)}
        self.rindex = {r.name: r.index for r in sim.replicas}
        self.gw = [_GatewayReplica() for _ in sim.replicas]
        self.requests = np.zeros((len(sim.replicas), sim.cfg.models))  # forwarded, per replica
        self.demand = DemandState()
        self.models = [
            Model.model_validate({"name": self.names[k], "engines": [{"uri": "file:///e.onnx"}]})
            for k in self.served
        ]
        self.pins: dict[str, frozenset[str]] = {r.name: frozenset() for r in sim.replicas}
        self.placement: Placement | None = None  # the last one (its landing and hot sets)
        self.pending: list[list[int]] = [[] for _ in sim.replicas]
        self.hints: Mapping[str, tuple[str, ...]] = {}
        self.held: list[int] = []
        self.models_of = sim.trace.models
        sim.on_ready = self.on_ready
        sim.on_refused = self.on_refused

    # -- the gateway -----------------------------------------------------------------------
    def snapshot(self, sim: Sim, replica: Replica) -> Snapshot:
        """What the replica's runtime reports (`GET /v2/tidal/models`, `runtime.server`):
        `residentBytes` counts engines ready and loads holding a load slot (`_reserve` runs
        when a load starts), every accepted load is LOADING, and `pendingLoads` names the
        queued ones with their last size measured on that replica (0: never loaded there)."""
        names = self.names
        engines = replica.engines.values()
        queued = [e for e in engines if e.state == LOADING and not e.started]
        return Snapshot(
            generation=replica.version,
            ready=True,
            models=self.all_names,
            hot=frozenset(names[e.model] for e in engines if e.state == READY),
            loading=frozenset(names[e.model] for e in engines if e.state == LOADING),
            budget_bytes=int(replica.budget),
            resident_bytes=int(
                sum(e.size for e in engines if e.reserved and (e.state == READY or e.started))
            ),
            sizes={names[m]: int(b) for m, b in replica.measured.items()},
            pinned=self.pins[replica.name],
            pending={names[e.model]: int(replica.measured.get(e.model, 0)) for e in queued},
            load_slots=sim.cfg.concurrent_loads,
            load_queue=len(replica.load_queue),
        )

    def views(self, sim: Sim, t: float) -> list[ReplicaView]:
        """The gateway's view of every replica at `t`, by `tidal.gateway.core.views` as the
        gateway builds it (cached while a replica, its own loads and refusals are unchanged)."""
        out = []
        names = self.names
        for replica, gw in zip(sim.replicas, self.gw, strict=True):
            if gw.forgive_at <= t:
                gw.refused = {m: until for m, until in gw.refused.items() if until > t}
                gw.forgive_at = min(gw.refused.values(), default=math.inf)
                gw.views = {}
            if gw.version != replica.version:
                gw.snapshot = self.snapshot(sim, replica)
                gw.version = replica.version
                gw.views = {}
            done = replica.done
            while done and done[0] <= t:
                done.popleft()
            outstanding = len(done) + replica.waiting
            v = gw.views.get(outstanding)
            if v is None:
                snapshot = gw.snapshot
                if not self.count_loads_under_way:  # before issue 30: residentBytes only
                    snapshot = replace(snapshot, pending={}, load_slots=1_000_000)
                v = replica_view(
                    replica.name,
                    snapshot,
                    healthy=True,
                    outstanding=outstanding,
                    own=gw.own if self.count_loads_under_way else NO_LOADS,
                    refused=frozenset(names[m] for m in gw.refused),
                )
                if self.pin_loads_count:
                    v = replace(v, loads_in_flight=len(v.loading), room_bytes=None)
                gw.views[outstanding] = v
            out.append(v)
        return out

    def dispatch(self, sim: Sim, i: int, model: int, t: float) -> bool:
        """One pass of the gateway's dispatch loop; True when the request was forwarded."""
        name = self.names[model]
        size = model_bytes((gw.snapshot for gw in self.gw), name)
        for _ in range(len(sim.replicas) + 1):
            views = self.views(sim, t)
            route = choose_route(
                name,
                views,
                self.budget,
                self.hints,
                busy_outstanding=self.cfg.busy_outstanding,
                model_bytes=size,
            )
            self.decisions[route.reason] = self.decisions.get(route.reason, 0) + 1
            if route.action == "forward":
                assert route.replica is not None
                if route.extra_load is not None:
                    self.gateway_load(sim, self.rindex[route.extra_load], model, t)
                r = self.rindex[route.replica]
                self.requests[r, model] += 1  # the runtime's `requests` counter
                sim.send(i, sim.replicas[r].engines[model], t)
                return True
            if route.action == "load":
                assert route.replica is not None
                if not self.gateway_load(sim, self.rindex[route.replica], model, t):
                    continue  # refused (no room there): the gateway routes again
            return False  # held: wait for a change
        return False

    def gateway_load(self, sim: Sim, r: int, model: int, t: float) -> bool:
        """`POST /v2/repository/models/{m}/load` on replica `r`; False if it answers 503."""
        replica = sim.replicas[r]
        if model in replica.engines:
            return True
        gw = self.gw[r]
        name = self.names[model]
        if sim.fleet.sizes[model] > replica.budget:  # too large: 503 at once
            self.refuse(r, model, t)
            return False
        # Reserved on dispatch, released when the load answers (`on_ready`, `on_refused`).
        gw.own = gw.own.reserve(name, model_bytes((g.snapshot for g in self.gw), name))
        gw.views = {}
        pinned = name in self.pins[replica.name]
        sim.accept_load(model, replica, t, "gateway", pinned=pinned)
        return True

    def refuse(self, r: int, model: int, t: float, room_at: float | None = None) -> None:
        """A load answered 503 (no room there now): not asked there again for a while, or
        only until the requests it names as holding the room end (`room_at`, issue 45)."""
        gw = self.gw[r]
        until = t + self.cfg.refused_cooldown
        if room_at is not None and self.retry_when_room:
            until = min(until, max(room_at, t))
        gw.refused[model] = until
        gw.forgive_at = min(gw.forgive_at, until)
        gw.own = gw.own.release(self.names[model])
        gw.views = {}

    def on_refused(self, sim: Sim, engine: Engine, t: float) -> None:
        replica = sim.replicas[engine.replica]
        self.refuse(engine.replica, engine.model, t, sim.room_at(replica, engine.size, t))
        self.retry_held(sim, t)

    def route(self, sim: Sim, i: int, model: int, t: float) -> None:
        if not self.dispatch(sim, i, model, t):
            sim.cold[i] = True
            self.held.append(i)

    def retry_held(self, sim: Sim, t: float) -> None:
        """Something changed: every held request is routed again, oldest first.

        Once one request for a model stays held, the later ones for it would too (nothing has
        changed for them since), so they are not routed again in this pass."""
        held, self.held = self.held, []
        arrivals, models = sim.arrivals, self.models_of
        stuck: set[int] = set()
        for i in held:
            model = int(models[i])
            if t - arrivals[i] >= self.cfg.hold_timeout:
                sim.fail(i)  # 503 with Retry-After
            elif model in stuck or not self.dispatch(sim, i, model, t):
                stuck.add(model)
                self.held.append(i)

    # -- the runtime's pinned loads ----------------------------------------------------------
    def admit_pins(self, sim: Sim, r: int, t: float) -> None:
        """Start the next pinned model's background load (one at a time per replica)."""
        replica = sim.replicas[r]
        if any(e.background and e.state == LOADING for e in replica.engines.values()):
            return
        pending = self.pending[r]
        while pending:
            model = pending[0]
            if model in replica.engines:
                pending.pop(0)
                continue
            victims = sim.victims(replica, sim.fleet.sizes[model], t, lru_key)
            if victims is None:
                return  # the runtime retries later (here: at the next change or tick)
            pending.pop(0)
            engine = sim.load(model, replica, t, victims, "pin", pinned=True)
            engine.background = True
            return

    def on_ready(self, sim: Sim, engine: Engine, t: float) -> None:
        gw = self.gw[engine.replica]
        name = self.names[engine.model]
        if name in gw.own:  # the gateway's POST .../load answers 200
            gw.own = gw.own.release(name)
            gw.views = {}
        self.admit_pins(sim, engine.replica, t)
        self.retry_held(sim, t)

    # -- the operator's fleet loop -----------------------------------------------------------
    def reports(self, sim: Sim, t: float) -> list[ReplicaReport]:
        """What each runtime's `GET /v2/tidal/models` tells the operator's fleet loop: every
        model's state, sizes and load time measured there, its pin and its request counter
        (cumulative, here counted as the gateway forwards)."""
        out = []
        names = self.names
        for replica in sim.replicas:
            engines = replica.engines
            pins = self.pins[replica.name]
            counters = self.requests[replica.index]
            models = {}
            for k in self.served:
                engine = engines.get(k)
                state = "UNAVAILABLE"
                if engine is not None:
                    state = "READY" if engine.state == READY else "LOADING"
                models[names[k]] = ModelReport(
                    state=state,
                    size_bytes=int(engine.size) if engine is not None and engine.reserved else 0,
                    last_size_bytes=int(replica.measured.get(k, 0)),
                    load_seconds=replica.measured_load.get(k, 0.0),
                    requests=float(counters[k]),
                    pinned=names[k] in pins,
                )
            out.append(
                ReplicaReport(
                    name=replica.name,
                    url=replica.name,
                    at=t,
                    generation=replica.version,
                    ready=True,
                    budget_bytes=int(replica.budget),
                    resident_bytes=int(sum(e.size for e in engines.values() if e.reserved)),
                    models=models,
                )
            )
        return out

    def tick(self, sim: Sim, t: float) -> None:
        """One interval of the operator's fleet loop, by the shell's own steps
        (`fleet.learn_demands`, `fleet.plan_placement`); the runtimes load the pins."""
        started = time.perf_counter()
        reports = self.reports(sim, t)
        window = self.cfg.rate_window if self.rate_window is None else self.rate_window
        self.demand, demands = learn_demands(
            self.demand,
            self.models,
            reports,
            t,
            t,
            window_seconds=window,
            forecast=self.forecast_policy if self.cfg.forecast else None,
            lead_seconds=self.cfg.lead_seconds,
            fast_attack=not self.slow_rise,
            daily_mean=self.daily_mean_rate,
        )
        if self.daily_mean_forecast:
            forecasts = self.demand.forecasts
            demands = [
                replace(d, forecast_rate=max(d.forecast_rate, period_mean(forecasts[d.name])))
                if d.name in forecasts
                else d
                for d in demands
            ]
        if not self.learn_sizes:
            demands = [replace(d, size_known=True) for d in demands]
        demands = self.adjust_demands(sim, demands)
        placement = plan_placement(
            self.placement_policy, demands, reports, self.pins, self.placement, t
        )
        self.placement = placement
        self.hints = {m: where for m, where in placement.assignments.items() if where}
        for replica in sim.replicas:
            pins = placement.pinned[replica.name]
            if pins != self.pins[replica.name]:
                replica.version += 1  # the runtime reports its new pins
            self.pins[replica.name] = pins
            for engine in replica.engines.values():
                pinned = self.names[engine.model] in pins
                if engine.pinned != pinned:
                    engine.pinned = pinned
                    replica.version += 1  # the gateway sees the room change
            self.pending[replica.index] = [
                self.index[n] for n in sorted(pins) if self.index[n] not in replica.engines
            ]
            self.admit_pins(sim, replica.index, t)
        self.retry_held(sim, t)
        self.placement_seconds += time.perf_counter() - started

    def adjust_demands(self, sim: Sim, demands: list[ModelDemand]) -> list[ModelDemand]:
        """What placement is told (a variant's hook; the demands as measured here)."""
        return demands

    def finish(self, sim: Sim) -> None:
        for i in self.held:
            sim.fail(i)
        self.held = []


class TidalPinnableOnly(Tidal):
    """The alternative to hot models pinning into the headroom (issue 23), same run: every
    model pins within the pinnable share (the headroom is the tail's alone) and placement ranks
    by the smoothed rates only (a viral rise waits for the window)."""

    name = "tidal, hot within pin share"
    hot_in_headroom = False
    slow_rise = True


class TidalOracleHot(Tidal):
    """An oracle, not a policy (issue 23): tidal told which three models the run will count as
    hot (`Trace.hot`, the busiest over the measured days), each kept hot all day at twice the
    hot threshold whatever its rate now. What meeting the hot-P99 goal would cost if a policy
    knew the future; the models it pays for in `Tidal` are the ones whose rate falls far below
    the threshold at their daily low, or that rise from the tail."""

    name = "tidal, day's hot set known (oracle)"

    def adjust_demands(self, sim: Sim, demands: list[ModelDemand]) -> list[ModelDemand]:
        hot = {self.names[m] for m in sim.trace.hot}
        floor = 2.0 * self.placement_policy.hot_threshold(sum(d.rate for d in demands))
        return [replace(d, rate=max(d.rate, floor)) if d.name in hot else d for d in demands]


class TidalDailyMeanForecast(Tidal):
    """Tried in the sixth pass (issue 23), not adopted: the forecast given to placement is at
    least the model's mean rate over the forecast's period, so that a model busy part of each
    day keeps its rank through its daily low."""

    name = "tidal, forecast >= daily mean (tried)"
    daily_mean_forecast = True


class TidalNoDailyMean(Tidal):
    """tidal before the sixth pass (issue 23), same run: placement ranks by the smoothed rates
    of the moment, not at least each model's mean over the forecast's period."""

    name = "tidal, rates of the moment"
    daily_mean_rate = False


class TidalFixedLanding(Tidal):
    """The third pass's comparison (issue 23), same run: landing room on a fixed quarter of
    the replicas (`landingShare` alone), as in the second pass."""

    name = "tidal, fixed landing quarter"
    landing_follows_tail = False


class TidalFixedLimits(Tidal):
    """The third pass's comparison (issue 23), same run: the gateway's load limits hold every
    load, also one that fits in free bytes (`LoadBudget.beyond_into_free` off)."""

    name = "tidal, fixed load limits"
    loads_beyond_into_free = False


class TidalLoadsTotal4(Tidal):
    """The gateway before issue 45, same run: at most 4 loads that evict across the fleet,
    whatever its size (`maxLoadsTotal` 4, the old default), and every refusal skips the
    replica for `refusedCooldownSeconds`."""

    name = "tidal, before issue 45"
    loads_total = 4
    retry_when_room = False


class TidalRefusalCooldown(Tidal):
    """Issue 45's fleet-sized load limit alone: every refusal still skips the replica for
    `refusedCooldownSeconds`."""

    name = "tidal, refusal cooldown"
    retry_when_room = False


class TidalBeforeIssue30(Tidal):
    """The gateway before issue 30, same run: free bytes are `budgetBytes - residentBytes` of
    the last snapshot (neither the runtime's queued loads nor the gateway's own counted) and a
    load into free bytes goes beyond every limit, the replica's load slots included."""

    name = "tidal, before issue 30"
    count_loads_under_way = False


class TidalSecondPass(Tidal):
    """tidal as the second pass left it (issue 23), same run: both of the above."""

    name = "tidal, second pass"
    landing_follows_tail = False
    loads_beyond_into_free = False


class TidalBefore(Tidal):
    """tidal as it was before these inputs (`--before`, for a same-run comparison): placement
    ranks by one interval's rates, keeps no landing room, and the gateway counts background pin
    loads in its per-replica load limit and knows no evictable room."""

    name = "tidal, before"
    hot_in_headroom = False
    slow_rise = True
    rate_window = 0.0
    landing_share = 0.0
    pin_loads_count = True
    landing_follows_tail = False
    loads_beyond_into_free = False


# ------------------------------------------------------------------------------------------
# Running and reporting


@dataclass
class Result:
    trace: str
    policy: str
    requests: int
    cold_share: float
    failed_share: float
    hot_p99: float
    p99: float
    gb_per_hour: float
    loads_per_hour: float
    max_used_share: float  # the fullest replica's reserved bytes over its budget (<= 1)
    seconds: float
    notes: str = ""
    load_queue_peak: int = 0  # the longest any replica's load queue was (whole run)
    load_wait_p99: float = 0.0  # seconds a load waited for a load slot, P99 (whole run)


def run_sim(cfg: FleetConfig, fleet: Fleet, trace: Trace, policy: Policy) -> Sim:
    """Play `trace` through `policy`; the final state (per-request outcomes, loads) stays."""
    sim = Sim(cfg, fleet, trace)
    policy.start(sim)
    period = policy.tick_seconds
    next_tick = period if period else math.inf
    advance, route, tick = sim.advance, policy.route, policy.tick
    for i, (t, m) in enumerate(zip(trace.times.tolist(), trace.models.tolist(), strict=True)):
        while next_tick <= t:
            advance(next_tick)
            tick(sim, next_tick)
            next_tick += period  # type: ignore[operator]
        advance(t)
        route(sim, i, m, t)
    # The trace ends, the fleet does not: requests still held (those of the last seconds, waiting
    # for a load or a refused replica's cool-down) are routed at the next ticks until served or
    # timed out, as the gateway would. Failing them at the end counted requests that arrived in
    # the last second as lost (0.02-0.04 % of some traces, every one of them within a second
    # of the end).
    last = float(trace.times[-1]) if len(trace.times) else 0.0
    while (
        period and getattr(policy, "held", None) and next_tick <= last + cfg.hold_timeout + period
    ):
        advance(next_tick)
        tick(sim, next_tick)
        next_tick += period
    advance(math.inf)
    policy.finish(sim)
    return sim


def simulate(
    cfg: FleetConfig, fleet: Fleet, trace: Trace, policy: Policy, hot: Sequence[int]
) -> Result:
    started = time.perf_counter()
    sim = run_sim(cfg, fleet, trace, policy)
    return summarise(cfg, trace, policy, sim, hot, time.perf_counter() - started)


def summarise(
    cfg: FleetConfig, trace: Trace, policy: Policy, sim: Sim, hot: Sequence[int], seconds: float
) -> Result:
    window = trace.times >= cfg.measure_from
    hours = (cfg.duration - cfg.measure_from) / 3600.0
    served = window & ~sim.failed
    is_hot = served & np.isin(trace.models, np.asarray(hot))
    loads = [ld for ld in sim.loads if ld.at >= cfg.measure_from]
    n = int(window.sum())
    reasons: dict[str, int] = {}
    for ld in loads:
        reasons[ld.reason] = reasons.get(ld.reason, 0) + 1
    notes = "loads " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    if isinstance(policy, Tidal):  # and its earlier form
        top = sorted(policy.decisions.items(), key=lambda kv: -kv[1])
        notes += "; routes " + ", ".join(f"{k} {v}" for k, v in top)
    return Result(
        trace=trace.name,
        policy=policy.name,
        requests=n,
        cold_share=float(sim.cold[window].sum() / n) if n else 0.0,
        failed_share=float(sim.failed[window].sum() / n) if n else 0.0,
        hot_p99=_p99(sim.latency[is_hot]),
        p99=_p99(sim.latency[served]),
        gb_per_hour=sum(ld.size for ld in loads) / GB / hours,
        loads_per_hour=len(loads) / hours,
        max_used_share=sim.max_used,
        seconds=seconds,
        notes=notes,
        load_queue_peak=max((r.queue_peak for r in sim.replicas), default=0),
        load_wait_p99=_p99(np.asarray(sim.load_waits)) if sim.load_waits else 0.0,
    )


def _p99(latencies: np.ndarray) -> float:
    return float(np.quantile(latencies, 0.99)) if len(latencies) else math.nan


HOT_ONLY = " hot only"


def make_policies(cfg: FleetConfig, hot_only: bool = False, before: bool = False) -> list[Policy]:
    policies: list[Policy] = [RandomLRU(), ModelMeshLike(cfg), Tidal(cfg, hot_only)]
    if before:
        policies.append(TidalBefore(cfg, hot_only))
    return [*policies, Belady()]


def run_all(
    cfg: FleetConfig, alphas: Sequence[float], hot_only: bool = True, before: bool = False
) -> list[Result]:
    fleet = make_fleet(cfg)
    results = []
    for alpha in alphas:
        trace = make_trace(cfg, alpha)
        for policy in make_policies(cfg, before=before):
            results.append(simulate(cfg, fleet, trace, policy, trace.hot))
        if hot_only:
            hot_trace = trace.only(trace.hot, trace.name + HOT_ONLY)
            for policy in make_policies(cfg, hot_only=True, before=before):
                results.append(simulate(cfg, fleet, hot_trace, policy, trace.hot))
    return results


@dataclass(frozen=True)
class Goal:
    trace: str
    what: str
    met: bool
    detail: str


def goals(results: Sequence[Result]) -> list[Goal]:
    """Issue 10's goals for tidal on each full trace, with the exact gap."""
    out: list[Goal] = []
    by = {(r.trace, r.policy): r for r in results}
    for trace in dict.fromkeys(r.trace for r in results if not r.trace.endswith(HOT_ONLY)):
        tidal, rnd = by[(trace, Tidal.name)], by[(trace, RandomLRU.name)]
        mesh, best = by[(trace, ModelMeshLike.name)], by[(trace, Belady.name)]
        quiet = by.get((trace + HOT_ONLY, Tidal.name))
        bound = rnd.cold_share / 3
        out.append(
            Goal(
                trace,
                "cold share <= 1/3 of random+LRU",
                tidal.cold_share <= bound,
                f"{_pct(tidal.cold_share)} vs {_pct(bound)} ({_gap_pp(tidal.cold_share, bound)})",
            )
        )
        bound = best.cold_share * 1.1
        out.append(
            Goal(
                trace,
                "cold share within 10 % of the optimum",
                tidal.cold_share <= bound,
                f"{_pct(tidal.cold_share)} vs 1.1 x {_pct(best.cold_share)} = {_pct(bound)} "
                f"({_gap_pp(tidal.cold_share, bound)})",
            )
        )
        if quiet is not None:
            bound = quiet.hot_p99 * 1.1
            out.append(
                Goal(
                    trace,
                    "hot-model P99 unaffected by cold traffic (<= 1.1 x without it)",
                    tidal.hot_p99 <= bound,
                    f"{_ms(tidal.hot_p99)} with vs {_ms(quiet.hot_p99)} without "
                    f"({tidal.hot_p99 / quiet.hot_p99:.2f}x)",
                )
            )
        bound = mesh.gb_per_hour / 2
        out.append(
            Goal(
                trace,
                "churn <= 1/2 of ModelMesh-like",
                tidal.gb_per_hour <= bound,
                f"{tidal.gb_per_hour:,.0f} vs {bound:,.0f} GB/h "
                f"({tidal.gb_per_hour / mesh.gb_per_hour:.2f}x ModelMesh-like)",
            )
        )
    return out


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def _gap_pp(value: float, bound: float) -> str:
    if value <= bound:
        return f"met with {(bound - value) * 100:.1f} points to spare"
    return f"{(value - bound) * 100:.1f} points over"


def _ratio(a: float, b: float) -> str:
    if b == 0:
        return "—" if a == 0 else "inf"
    return f"{a / b:.2f}"


def describe(cfg: FleetConfig, fleet: Fleet) -> str:
    total = fleet.sizes.sum()
    loads = [cfg.load_seconds(s) for s in (fleet.sizes.min(), fleet.sizes.max())]
    return (
        f"{cfg.models} models, engines {fleet.sizes.min() / GB:.2f}-{fleet.sizes.max() / GB:.2f} "
        f"GB ({total / GB:.0f} GB in all); {cfg.replicas} replicas x {fleet.budget / GB:.2f} GB "
        f"budget = {cfg.replicas * fleet.budget / total * 100:.1f} % of all engine bytes; load "
        f"= bytes / {cfg.pinned_gbps:g} GB/s + {cfg.load_overhead:g} s "
        f"({loads[0]:.2f}-{loads[1]:.2f} s), {cfg.concurrent_loads} at a time per replica; "
        f"{cfg.slots} slots x {cfg.service_seconds * 1000:g} ms per replica; "
        f"{cfg.mean_rate:g} req/s on average; day = {cfg.day_seconds:g} s x {cfg.days}, "
        f"measured from {cfg.measure_from:g} s; viral model rank {cfg.viral_rank} at "
        f"{cfg.viral_at_days * cfg.day_seconds:g} s; tidal: placement every "
        f"{cfg.placement_interval:g} s, minRate {cfg.min_rate:g}, headroom "
        f"{cfg.headroom * 100:g} %, lead {cfg.lead_seconds:g} s, loads {cfg.loads_per_replica}"
        f"/replica {cfg.loads_total} in all; seed {cfg.seed}"
    )


def report(cfg: FleetConfig, fleet: Fleet, results: Sequence[Result], elapsed: float) -> bool:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    console.print(describe(cfg, fleet))
    table = Table(title="fleet placement simulation (hot = the 3 busiest models)")
    columns = (
        "trace",
        "policy",
        "cold %",
        "503 %",
        "hot P99 ms",
        "hot P99 w/o cold ms",
        "P99 ms",
        "GB/h",
        "loads/h",
        "cold / random",
        "cold / optimum",
        "churn / ModelMesh",
    )
    for col in columns:
        table.add_column(col, justify="left" if col in ("trace", "policy") else "right")
    by = {(r.trace, r.policy): r for r in results}
    traces = [t for t in dict.fromkeys(r.trace for r in results) if not t.endswith(HOT_ONLY)]
    for trace in traces:
        rows = [r for r in results if r.trace == trace]
        rnd, mesh = by[(trace, RandomLRU.name)], by[(trace, ModelMeshLike.name)]
        best = by[(trace, Belady.name)]
        for r in rows:
            quiet = by.get((trace + HOT_ONLY, r.policy))
            table.add_row(
                trace if r is rows[0] else "",
                r.policy,
                f"{r.cold_share * 100:.1f}",
                f"{r.failed_share * 100:.2f}",
                f"{r.hot_p99 * 1000:.0f}",
                f"{quiet.hot_p99 * 1000:.0f}" if quiet else "",
                f"{r.p99 * 1000:.0f}",
                f"{r.gb_per_hour:,.0f}",
                f"{r.loads_per_hour:,.0f}",
                _ratio(r.cold_share, rnd.cold_share),
                _ratio(r.cold_share, best.cold_share),
                _ratio(r.gb_per_hour, mesh.gb_per_hour),
            )
        table.add_section()
    console.print(table)
    verdicts = goals(results)
    for g in verdicts:
        console.print(f"goal {g.trace}: {g.what}: {'met' if g.met else 'NOT met'} — {g.detail}")
    for r in results:
        if r.policy.startswith(Tidal.name) and not r.trace.endswith(HOT_ONLY):
            console.print(f"{r.policy} {r.trace}: {r.notes}")
    console.print(f"simulated {len(results)} runs in {elapsed:.1f} s")
    return all(g.met for g in verdicts)


# ------------------------------------------------------------------------------------------
# Many traces (issue 23): seeds x families, median and worst seed of every metric


# The families: (label, Zipf alpha, config changes). The sweep's base shortens the day to
# 200 s (3 days, the first for warm-up; the forecast's period is the day) so that 60 traces
# run in under half an hour on 2 shared cores.
FAMILIES: dict[str, tuple[float, dict[str, object]]] = {
    "zipf 0.8": (0.8, {}),
    "zipf 1.1": (1.1, {}),
    "rotating hot set": (1.0, {"family": "rotating"}),
    "3 viral at once": (0.9, {"family": "viral"}),
    "bursty tail": (0.9, {"family": "bursty"}),
    "cold bursts": (0.9, {"family": "coldburst"}),
    # Issue 45: heavier than the rest, as a skeptical user would try it: ~40 req/s over 300
    # models on 12 replicas with full caches (a small cache share), so nearly every cold load
    # evicts.
    "heavy full caches": (
        0.9,
        {"models": 300, "replicas": 12, "mean_rate": 40.0, "cache_share": 0.08},
    ),
    "small easy fleet": (
        1.0,
        {"models": 30, "replicas": 4, "cache_share": 0.5, "mean_rate": 6.0, "viral_rank": 25},
    ),
}
SWEEP_BASE: dict[str, object] = {"day_seconds": 200.0, "rotate_seconds": 60.0}
SWEEP_QUICK: dict[str, object] = {
    "day_seconds": 150.0,
    "rotate_seconds": 25.0,
    "mean_rate": 4.0,
    "viral_ramp_seconds": 10.0,
}
SWEEP_VARIANTS: tuple[type[Tidal], ...] = (
    Tidal,
    TidalFixedLimits,
    TidalBeforeIssue30,
)
# --variants: the sweep's policies by a short name.
VARIANT_NAMES: dict[str, type[Tidal]] = {
    "tidal": Tidal,
    "fixed-landing": TidalFixedLanding,
    "fixed-limits": TidalFixedLimits,
    "second-pass": TidalSecondPass,
    "pin-share": TidalPinnableOnly,
    "oracle-hot": TidalOracleHot,
    "daily-mean-forecast": TidalDailyMeanForecast,
    "no-daily-mean": TidalNoDailyMean,
    "before-issue-30": TidalBeforeIssue30,
    "before-issue-45": TidalLoadsTotal4,
    "refusal-cooldown": TidalRefusalCooldown,
}


def sweep_config(family: str, seed: int, quick: bool = False) -> tuple[FleetConfig, float]:
    alpha, changes = FAMILIES[family]
    cfg = replace(FleetConfig(seed=seed), **{**SWEEP_BASE, **changes})  # type: ignore[arg-type]
    if quick:
        small = {"models": min(cfg.models, 40), "viral_rank": min(cfg.viral_rank, 30)}
        cfg = replace(cfg, **{**SWEEP_QUICK, **small})  # type: ignore[arg-type]
    return cfg, alpha


def sweep_one(job: tuple[str, int, bool]) -> list[dict[str, object]]:
    """One trace of a family: every tidal variant against ModelMesh-like and the optimum."""
    family, seed, quick = job
    cfg, alpha = sweep_config(family, seed, quick)
    fleet = make_fleet(cfg)
    trace = make_trace(cfg, alpha)
    quiet = trace.only(trace.hot, trace.name + HOT_ONLY)
    mesh = simulate(cfg, fleet, trace, ModelMeshLike(cfg), trace.hot)
    best = simulate(cfg, fleet, trace, Belady(), trace.hot)
    rows: list[dict[str, object]] = []
    for variant in SWEEP_VARIANTS:
        full = simulate(cfg, fleet, trace, variant(cfg), trace.hot)
        alone = simulate(cfg, fleet, quiet, variant(cfg, True), trace.hot)
        rows.append(
            {
                "family": family,
                "seed": seed,
                "policy": variant.name,
                "hot_p99": full.hot_p99,
                "hot_p99_alone": alone.hot_p99,
                "hot_ratio": full.hot_p99 / alone.hot_p99,
                "p99": full.p99,
                "mesh_p99": mesh.p99,
                "p99_vs_mesh": full.p99 / mesh.p99,
                "cold": full.cold_share,
                "cold_vs_mesh": full.cold_share / mesh.cold_share if mesh.cold_share else 0.0,
                "cold_vs_opt": full.cold_share / best.cold_share if best.cold_share else 0.0,
                "max_used": full.max_used_share,
                "lost": full.failed_share,
                "queue_peak": full.load_queue_peak,
                "load_wait_p99": full.load_wait_p99,
            }
        )
    return rows


# metric, label, goal bound on the worst seed (None: shown only), format
SWEEP_METRICS: tuple[tuple[str, str, float | None, str], ...] = (
    ("hot_ratio", "hot P99 with / without tail", 1.1, "{:.2f}x"),
    ("hot_p99", "hot P99 ms", None, "ms"),
    ("p99_vs_mesh", "all P99 / ModelMesh", 1.0, "{:.2f}x"),
    ("cold_vs_mesh", "cold / ModelMesh", 0.75, "{:.2f}x"),
    ("cold_vs_opt", "cold / optimum", 1.1, "{:.2f}x"),
    ("max_used", "fullest budget", 1.0, "{:.3f}"),
    ("lost", "lost", 0.0, "pct"),
    ("queue_peak", "load queue peak", None, "{:.0f}"),
    ("load_wait_p99", "load wait P99 s", None, "{:.1f}"),
)


def _fmt(kind: str, x: float) -> str:
    if kind == "ms":
        return f"{x * 1000:,.0f}"
    if kind == "pct":
        return f"{x * 100:.2f} %"
    return kind.format(x)


def sweep(
    families: Sequence[str],
    seeds: Sequence[int],
    quick: bool = False,
    workers: int = 2,
    log: str | None = None,
) -> list[dict[str, object]]:
    """Every family on every seed (seed by seed, so that a run cut short still covers every
    family); each trace's rows are appended to `log` (JSON lines) as it finishes."""
    import json
    import multiprocessing

    jobs = [(f, s, quick) for s in seeds for f in families]
    rows: list[dict[str, object]] = []

    def keep(part: list[dict[str, object]]) -> None:
        rows.extend(part)
        if log:
            with open(log, "a") as out:
                for row in part:
                    out.write(json.dumps(row) + "\n")

    if workers <= 1:
        for job in jobs:
            keep(sweep_one(job))
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for part in pool.imap_unordered(sweep_one, jobs, chunksize=1):
                keep(part)
    order = {(f, s): k for k, (f, s, _) in enumerate(jobs)}
    rows.sort(key=lambda r: order[(str(r["family"]), int(r["seed"]))])  # type: ignore[call-overload]
    return rows


def sweep_report(rows: Sequence[dict[str, object]], elapsed: float) -> list[str]:
    """Median and worst seed of every metric per family and policy; the goals' verdicts on
    the worst seed. Returns the unmet goals."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    table = Table(title="fleet simulator over many traces: median / worst (seed)")
    table.add_column("family", justify="left")
    table.add_column("policy", justify="left")
    for _, label, _, _ in SWEEP_METRICS:
        table.add_column(label, justify="right")
    unmet: list[str] = []
    families = list(dict.fromkeys(str(r["family"]) for r in rows))
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    for family in families:
        for policy in policies:
            mine = [r for r in rows if r["family"] == family and r["policy"] == policy]
            cells = []
            for key, label, bound, kind in SWEEP_METRICS:
                values = [float(r[key]) for r in mine]  # type: ignore[arg-type]
                worst = max(mine, key=lambda r: float(r[key]))  # type: ignore[arg-type]
                w = float(worst[key])  # type: ignore[arg-type]
                cells.append(
                    f"{_fmt(kind, float(np.median(values)))} / {_fmt(kind, w)} ({worst['seed']})"
                )
                if bound is not None and policy == Tidal.name and w > bound + 1e-9:
                    unmet.append(
                        f"{family}: {label} <= {_fmt(kind, bound)} not met on seed "
                        f"{worst['seed']}: {_fmt(kind, w)}"
                    )
            table.add_row(family, policy, *cells)
        table.add_section()
    console.print(table)
    seeds = sorted({int(r["seed"]) for r in rows})  # type: ignore[call-overload]
    console.print(f"seeds {seeds}; {len(rows)} policy runs in {elapsed:.0f} s")
    for line in unmet:
        console.print("goal NOT met — " + line)
    if not unmet:
        console.print("every goal met on the worst seed of every family")
    return unmet


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--alpha", default="0.8,1.1", help="comma-separated Zipf exponents")
    parser.add_argument("--seed", type=int, default=FleetConfig.seed)
    parser.add_argument("--quick", action="store_true", help="a small trace (smoke test)")
    parser.add_argument(
        "--before",
        action="store_true",
        help="also run tidal as it was before smoothed rates, landing room and pin-load "
        "accounting (a same-run comparison)",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="many traces: --seeds per family of --families, median and worst seed",
    )
    parser.add_argument(
        "--seeds", default="23,5,7,11,1-4,6,8", help="sweep seeds, e.g. 1-10 or 5,7,11,23"
    )
    parser.add_argument("--families", default=",".join(FAMILIES), help="sweep families")
    parser.add_argument("--workers", type=int, default=2, help="sweep worker processes")
    parser.add_argument("--tidal-only", action="store_true", help="sweep: no alternative")
    parser.add_argument(
        "--variants",
        default="tidal,fixed-limits,before-issue-30",
        help=f"sweep: the tidal variants to run, of {', '.join(VARIANT_NAMES)}",
    )
    parser.add_argument("--log", help="sweep: append each trace's rows here (JSON lines)")
    parser.add_argument("--from-log", help="sweep: report the rows of a log instead of running")
    args = parser.parse_args(argv)
    if args.from_log:
        import json

        with open(args.from_log) as f:
            logged = [json.loads(line) for line in f if line.strip()]
        sweep_report(logged, 0.0)
        return 0
    if args.sweep:
        global SWEEP_VARIANTS
        if args.tidal_only:
            SWEEP_VARIANTS = (Tidal,)
        else:
            unknown = [v for v in args.variants.split(",") if v not in VARIANT_NAMES]
            if unknown:
                parser.error(
                    f"--variants: unknown {', '.join(unknown)}; known: {list(VARIANT_NAMES)}"
                )
            SWEEP_VARIANTS = tuple(VARIANT_NAMES[v] for v in args.variants.split(","))
        seeds: list[int] = []
        for part in args.seeds.split(","):
            lo, _, hi = part.partition("-")
            seeds.extend(range(int(lo), int(hi or lo) + 1))
        started = time.perf_counter()
        rows = sweep(args.families.split(","), seeds, args.quick, args.workers, args.log)
        sweep_report(rows, time.perf_counter() - started)
        return 0
    cfg = FleetConfig(seed=args.seed)
    if args.quick:
        cfg = replace(cfg, **QUICK)  # type: ignore[arg-type]
    alphas = [float(a) for a in args.alpha.split(",") if a]
    started = time.perf_counter()
    results = run_all(cfg, alphas, before=args.before)
    report(cfg, make_fleet(cfg), results, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
