"""Glue of the fleet loop: runtime reports in, placement inputs and status out, without I/O.

This module owns the pure steps between what the fleet loop (``tidal.operator.shell.fleet``)
reads from the runtime pods and what it hands on:

* :func:`parse_replica_report`: one runtime's ``GET /v2/tidal/models`` answer as typed data
  (a pod that answers garbage is treated like one that does not answer);
* :func:`model_rates`: per-model arrival rates from the runtimes' cumulative request counters
  (a restarted pod's counter reset counts as a fresh start, never as negative traffic);
* :func:`model_demands`: the placement core's input per model: byte size (measured on a
  replica, else declared in the spec, else the largest known, marked as a guess), load time
  (measured, else estimated from bytes) and the rate now and forecast over the load-time horizon;
* :func:`learn_demands` and :func:`plan_placement`: one placement interval of the fleet loop,
  from the reports to ``place(...)``'s answer (rates over the interval, their smoothing, the
  forecast's observe and predict), what the shell and ``bench/fleet_sim.py`` both call
  (DESIGN.md §9);
* :func:`gateway_push`: the document the gateway gets (replicas and placement hints);
* :func:`fleet_status` and :func:`too_large_problems`: ``status.fleet`` and the ``Degraded``
  reasons for models no replica can hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .api import FleetStatus, InferenceService, Model, quantity_bytes
from .forecast import (
    ForecastPolicy,
    ModelForecast,
    observe,
    period_mean,
    predict_peak,
)
from .placement import (
    ModelDemand,
    Placement,
    PlacementPolicy,
    ReplicaSlot,
    place,
)

# Until a replica has measured a model's load: a fixed cost (process-side deserialize and
# warm-up) plus the bytes at a conservative staging bandwidth.
DEFAULT_LOAD_OVERHEAD_SECONDS = 1.0
DEFAULT_LOAD_BYTES_PER_SECOND = 2e9
# A model nobody has measured or declared, before any is known: assume this many bytes.
DEFAULT_MODEL_BYTES = 256 * 2**20
# The fast attack of `smooth_rates` needs at least this many requests in one interval.
RISE_MIN_REQUESTS = 3
READY = "READY"
LOADING = "LOADING"


@dataclass(frozen=True)
class ModelReport:
    """One model as one runtime pod reports it."""

    state: str
    size_bytes: int = 0
    last_size_bytes: int = 0
    load_seconds: float = 0.0
    outstanding: int = 0
    requests: float = 0.0
    pinned: bool = False
    last_error: str | None = None


@dataclass(frozen=True)
class ReplicaReport:
    """One runtime pod's hot set (``GET /v2/tidal/models``), read at ``at`` (monotonic)."""

    name: str
    url: str
    at: float
    generation: int
    ready: bool
    budget_bytes: int
    resident_bytes: int
    models: Mapping[str, ModelReport] = field(default_factory=dict)

    @property
    def resident(self) -> frozenset[str]:
        return frozenset(m for m, r in self.models.items() if r.state in (READY, LOADING))

    @property
    def hot(self) -> frozenset[str]:
        return frozenset(m for m, r in self.models.items() if r.state == READY)

    @property
    def pinned(self) -> frozenset[str]:
        return frozenset(m for m, r in self.models.items() if r.pinned)


def _number(value: Any, kind: type[int] | type[float], what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be finite")
    return kind(value)


def parse_replica_report(name: str, url: str, body: Any, at: float) -> ReplicaReport:
    """Typed view of a runtime's hot-set answer; raises ``ValueError`` when it is not one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("models"), Mapping):
        raise ValueError("not a tidal runtime hot-set document (no 'models' object)")
    models: dict[str, ModelReport] = {}
    for model, raw in body["models"].items():
        if not isinstance(raw, Mapping):
            raise ValueError(f"model {model!r}: not an object")
        error = raw.get("lastError")
        models[str(model)] = ModelReport(
            state=str(raw.get("state", "UNAVAILABLE")),
            size_bytes=_number(raw.get("sizeBytes", 0), int, "sizeBytes"),
            last_size_bytes=_number(raw.get("lastSizeBytes", 0), int, "lastSizeBytes"),
            load_seconds=_number(raw.get("loadSeconds", 0.0), float, "loadSeconds"),
            outstanding=_number(raw.get("outstanding", 0), int, "outstanding"),
            requests=_number(raw.get("requests", 0), float, "requests"),
            pinned=bool(raw.get("pinned", False)),
            last_error=str(error) if error else None,
        )
    return ReplicaReport(
        name=name,
        url=url,
        at=at,
        generation=_number(body.get("generation", 0), int, "generation"),
        ready=bool(body.get("ready", False)),
        budget_bytes=_number(body.get("budgetBytes", 0), int, "budgetBytes"),
        resident_bytes=_number(body.get("residentBytes", 0), int, "residentBytes"),
        models=models,
    )


@dataclass(frozen=True)
class FleetView:
    """What the fleet loop hands the reconciler: ``status.fleet`` and ``Degraded`` reasons."""

    status: FleetStatus
    problems: tuple[str, ...] = ()


# -- rates -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RateState:
    """The request counters seen last, per (replica, model), and when (monotonic)."""

    counters: Mapping[tuple[str, str], float] = field(default_factory=dict)
    at: float | None = None


def model_rates(
    previous: RateState, reports: Sequence[ReplicaReport], now: float
) -> tuple[dict[str, float], RateState]:
    """Requests per second per model since the previous call, summed over the replicas.

    A counter that went down belongs to a restarted pod: its whole value is new traffic. A
    replica seen for the first time contributes nothing until its second report (its counter
    holds traffic of unknown age). The first call returns no rates.
    """
    counters = {(r.name, m): rep.requests for r in reports for m, rep in r.models.items()}
    rates: dict[str, float] = {}
    if previous.at is not None and now > previous.at:
        elapsed = now - previous.at
        for (replica, model), value in counters.items():
            before = previous.counters.get((replica, model))
            if before is None:
                continue
            delta = value - before if value >= before else value
            rates[model] = rates.get(model, 0.0) + delta / elapsed
    return rates, RateState(counters=counters, at=now)


def smooth_rates(
    previous: Mapping[str, float],
    rates: Mapping[str, float],
    elapsed: float,
    window_seconds: float,
    *,
    rise_to: float | None = None,
    before_rates: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Per-model rates averaged over about ``window_seconds`` (an exponentially weighted mean
    with that time constant), what placement ranks models by.

    ``rise_to`` (placement's hot rate): an interval rate at or above it that is above the
    smoothed value is taken at once (fast attack, slow decay) when the interval's count is a
    real rise: at least ``RISE_MIN_REQUESTS`` requests and more than a Poisson process at the
    smoothed rate would give short of a 3-sigma fluke (mean + 3 sqrt(mean)). A model that goes
    viral is then ranked by its new rate at the next placement instead of ~a window later; a
    tail model's single request moves nothing, even when the hot rate (a share of all demand)
    is below one request per interval: taken at once, every tail request read as 0.5 req/s,
    the sum of smoothed rates as 6-7x the real demand, and placement's hot threshold (a share
    of that sum) rose above the real hot models (fleet simulator, rotating hot set seed 4: the
    threshold 1.4-1.9 req/s, the three busiest models 0.5-1 req/s, unpinned for minutes).

    ``before_rates`` (the interval before this one's rates; the operator passes them): the rise
    must then hold over both intervals, each a real rise on its own. A cold burst (a batch job
    touching 40 tail models at once, a few requests each within one second) otherwise read as
    40 viral models: their rates taken at once doubled the sum of smoothed rates, placement's
    hot threshold rose above the busiest models, and they were unpinned for the minute the
    burst took to decay, then evicted by the burst's own loads (fleet simulator, cold bursts
    seed 1, quick trace: the sum 21 -> 41 req/s, the threshold 0.43 -> 0.83 req/s, the busiest
    model at 0.81 req/s unpinned). A viral model is still taken at once, one interval later.

    One placement interval is too short a window for a tail model: one request in 2 s reads
    as 0.5 req/s, 50x ``minRate``, and pins would follow single requests (churn, and hot models
    at their lows displaced by tail models that just had one request). A model missing from
    ``rates`` had none in the interval; a model not seen before starts from its first rate.
    """
    if elapsed <= 0:
        return dict(previous)
    if window_seconds <= 0:
        return {name: max(rate, 0.0) for name, rate in rates.items()}
    keep = math.exp(-elapsed / window_seconds)
    out: dict[str, float] = {}
    for name in set(previous) | set(rates):
        now = max(rates.get(name, 0.0), 0.0)
        before = previous.get(name)
        if before is None or (
            rise_to is not None
            and now >= rise_to
            and now > before
            and _rose(before, now, elapsed)
            and (
                before_rates is None or _held(before, before_rates.get(name, 0.0), rise_to, elapsed)
            )
        ):
            out[name] = now
        else:
            out[name] = before * keep + now * (1.0 - keep)
    return out


def placement_rates(
    smoothed: Mapping[str, float], forecasts: Mapping[str, ModelForecast]
) -> dict[str, float]:
    """The rates placement ranks by: each model's smoothed rate, but at least its mean over the
    forecast's period once a whole period is learned (`forecast.period_mean`).

    Placement's hot threshold is a share of all rates, and the tail's share of demand sets the
    landing count: from the rates of the moment, both follow the fleet's daily trough, where
    2 % of a third of the peak demand is a low bar and the hot models' pins take the tail's
    room, and a model busy part of each day drops out at its low and is loaded again as it
    rises. Fleet simulator, 6 trace families x 10 seeds: the median P99 of all requests
    1.6-1.9x ModelMesh-like's instead of 1.8-2.6x (rotating hot set, worst seed 6.3 -> 2.2x),
    the worst seeds' hot-model P99 the same or lower in every family, the small fleet's
    hot models never slower with the tail than without, cold share within 0.02.
    """
    out = dict(smoothed)
    for name, state in forecasts.items():
        mean = period_mean(state)
        if mean > out.get(name, 0.0):
            out[name] = mean
    return out


def _held(before: float, earlier: float, rise_to: float, elapsed: float) -> bool:
    """Whether the interval before this one (``earlier`` req/s) was a real rise too."""
    return earlier >= rise_to and earlier > before and _rose(before, earlier, elapsed)


def _rose(before: float, now: float, elapsed: float) -> bool:
    """Whether ``now`` (req/s over ``elapsed`` s) is a real rise from ``before``, not noise."""
    count, mean = now * elapsed, before * elapsed
    return count >= RISE_MIN_REQUESTS and count > mean + 3.0 * math.sqrt(mean)


# -- placement inputs --------------------------------------------------------------------------


def known_sizes(models: Sequence[Model], reports: Sequence[ReplicaReport]) -> dict[str, int]:
    """Bytes of the models whose size is known: measured (largest seen), else declared."""
    measured: dict[str, int] = {}
    for report in reports:
        for name, rep in report.models.items():
            size = max(rep.size_bytes, rep.last_size_bytes)
            if size > 0:
                measured[name] = max(measured.get(name, 0), size)
    sizes: dict[str, int] = {}
    for model in models:
        if model.name in measured:
            sizes[model.name] = measured[model.name]
        elif model.memory is not None:
            sizes[model.name] = quantity_bytes(model.memory)
    return sizes


def model_sizes(models: Sequence[Model], reports: Sequence[ReplicaReport]) -> dict[str, int]:
    """Bytes of each model on the device: measured (largest seen), declared, or else the
    largest known (a model nobody measured is possibly the largest; placement knows it is a
    guess, see `model_demands`)."""
    sizes = known_sizes(models, reports)
    fallback = max(sizes.values()) if sizes else DEFAULT_MODEL_BYTES
    return {m.name: sizes.get(m.name, fallback) for m in models}


def model_load_seconds(
    sizes: Mapping[str, int], reports: Sequence[ReplicaReport]
) -> dict[str, float]:
    """Seconds a load of each model takes: the longest measured, else estimated from bytes."""
    measured: dict[str, float] = {}
    for report in reports:
        for name, rep in report.models.items():
            if rep.load_seconds > 0:
                measured[name] = max(measured.get(name, 0.0), rep.load_seconds)
    return {
        name: measured.get(
            name, DEFAULT_LOAD_OVERHEAD_SECONDS + size / DEFAULT_LOAD_BYTES_PER_SECOND
        )
        for name, size in sizes.items()
    }


def model_demands(
    models: Sequence[Model],
    reports: Sequence[ReplicaReport],
    rates: Mapping[str, float],
    forecast_rates: Mapping[str, float],
) -> list[ModelDemand]:
    """What placement needs per model (``forecast_rates``: the forecast peak over each model's
    load-time horizon; missing: no forecast, the rate now counts)."""
    sizes = model_sizes(models, reports)
    known = known_sizes(models, reports)
    loads = model_load_seconds(sizes, reports)
    return [
        ModelDemand(
            name=m.name,
            size_bytes=sizes[m.name],
            load_seconds=loads[m.name],
            rate=max(0.0, rates.get(m.name, 0.0)),
            forecast_rate=max(0.0, forecast_rates.get(m.name, 0.0)),
            size_known=m.name in known,
        )
        for m in models
    ]


def replica_slots(
    reports: Sequence[ReplicaReport],
    pinned: Mapping[str, frozenset[str]],
    landing: frozenset[str] = frozenset(),
) -> list[ReplicaSlot]:
    """Placement's view of the replicas: budgets and hot sets from their reports, the pins the
    last placement gave them (which a replica may not have acknowledged yet) and whether it
    kept landing room there."""
    return [
        ReplicaSlot(
            name=r.name,
            budget_bytes=r.budget_bytes,
            resident=r.resident,
            pinned=pinned.get(r.name, r.pinned),
            landing=r.name in landing,
        )
        for r in reports
    ]


# -- one placement interval --------------------------------------------------------------------


@dataclass(frozen=True)
class DemandState:
    """What the fleet loop learns of demand from one placement to the next."""

    rates: RateState = field(default_factory=RateState)
    last_rates: Mapping[str, float] = field(default_factory=dict)  # the last interval's
    smoothed: Mapping[str, float] = field(default_factory=dict)  # ``smooth_rates``
    forecasts: Mapping[str, ModelForecast] = field(default_factory=dict)


def learn_demands(
    state: DemandState,
    models: Sequence[Model],
    reports: Sequence[ReplicaReport],
    now: float,
    wall: float,
    *,
    window_seconds: float,
    forecast: ForecastPolicy | None,
    lead_seconds: float,
    fast_attack: bool = True,
    daily_mean: bool = True,
) -> tuple[DemandState, list[ModelDemand]]:
    """One interval's learning: the rates since the last call (``now``, monotonic), smoothed
    over ``window_seconds``; the forecast (None: off) learns each model's interval rate at
    ``wall`` and predicts its peak over its load time + ``lead_seconds``; placement ranks by
    the smoothed rates, at least each model's mean over the forecast's period
    (``placement_rates``). Models no longer in ``models`` are forgotten. The first call only
    reads the counters (no rates yet).

    ``fast_attack`` and ``daily_mean`` are on in the operator; the simulator turns them off
    to measure what each brings.
    """
    first = state.rates.at is None
    elapsed = 0.0 if state.rates.at is None else now - state.rates.at
    rates, counters = model_rates(state.rates, reports, now)
    last_rates, smoothed = state.last_rates, state.smoothed
    if not first:
        last_rates = rates
        rise_to = PlacementPolicy().hot_threshold(sum(rates.values())) if fast_attack else None
        smoothed = smooth_rates(
            smoothed, rates, elapsed, window_seconds, rise_to=rise_to, before_rates=state.last_rates
        )
    forecasts = dict(state.forecasts)
    forecast_rates: dict[str, float] = {}
    if forecast is not None and not first:
        # The forecast learns from each interval's rates; placement ranks by the smoothed ones.
        for demand in model_demands(models, reports, last_rates, {}):
            learned = observe(forecast, forecasts.get(demand.name), demand.rate, wall)
            forecasts[demand.name] = learned
            horizon = demand.load_seconds + lead_seconds
            forecast_rates[demand.name] = predict_peak(forecast, learned, wall, horizon)
    ranks = placement_rates(smoothed, forecasts) if daily_mean else smoothed
    demands = model_demands(models, reports, ranks, forecast_rates)
    names = {m.name for m in models}
    return (
        DemandState(
            rates=counters,
            last_rates=last_rates,
            smoothed={n: r for n, r in smoothed.items() if n in names},
            forecasts={n: f for n, f in forecasts.items() if n in names},
        ),
        demands,
    )


def plan_placement(
    policy: PlacementPolicy,
    demands: Sequence[ModelDemand],
    reports: Sequence[ReplicaReport],
    pins_sent: Mapping[str, frozenset[str]],
    previous: Placement | None,
    wall: float,
) -> Placement:
    """``place(...)`` over the replicas as reported, with the pins last sent to each (which a
    replica may not have acknowledged yet) and the previous placement's landing and hot sets;
    after a restart (no previous placement), the pins the runtimes report count as one."""
    landing = previous.landing if previous is not None else frozenset()
    return place(
        policy,
        demands,
        replica_slots(reports, pins_sent, landing),
        wall,
        history=True if previous is not None else None,
        hot_before=previous.hot if previous is not None else None,
    )


# -- outputs -----------------------------------------------------------------------------------


def gateway_push(reports: Sequence[ReplicaReport], placement: Placement | None) -> dict[str, Any]:
    """The gateway's ``PUT /v2/tidal/replicas`` document: serving replicas, placement hints."""
    names = {r.name for r in reports}
    hints: dict[str, list[str]] = {}
    if placement is not None:
        for model, replicas in placement.assignments.items():
            kept = [r for r in replicas if r in names]
            if kept:
                hints[model] = kept
    return {
        "replicas": [{"name": r.name, "url": r.url} for r in sorted(reports, key=lambda r: r.name)],
        "placement": dict(sorted(hints.items())),
    }


def too_large_problems(isvc: InferenceService, placement: Placement | None) -> list[str]:
    """``Degraded`` reasons for models larger than every replica's engine budget (measured)."""
    if placement is None:
        return []
    return [
        f"model {name!r} is {gap} bytes larger than the largest replica's engine budget: raise "
        "spec.memory.engineCacheBudget (or lower spec.memory.reserve), or serve it from a "
        "service with larger replicas"
        for name, gap in sorted(placement.too_large.items())
    ]


def fleet_status(
    models: Sequence[Model],
    reports: Iterable[ReplicaReport],
    placement: Placement | None,
    rates: Mapping[str, float],
    gateways_ready: int,
    loaded_bytes: int,
    placed_at: datetime | None,
    top: int = 5,
) -> FleetStatus:
    """``status.fleet``: models hot / total, copies, the busiest models."""
    reports = list(reports)
    names = {m.name for m in models}
    copies: dict[str, int] = {}
    for report in reports:
        for name in report.hot & names:
            copies[name] = copies.get(name, 0) + 1
    pinned = sum(len(p) for p in placement.pinned.values()) if placement is not None else 0
    busiest = sorted(names, key=lambda n: (-rates.get(n, 0.0), n))[:top]
    hottest = [f"{n}:{copies.get(n, 0)}@{rates.get(n, 0.0):.1f}/s" for n in busiest if rates.get(n)]
    return FleetStatus(
        summary=f"{len(copies)}/{len(names)}",
        models_hot=len(copies),
        models_total=len(names),
        hot_copies=sum(copies.values()),
        pinned_copies=pinned,
        replicas=len(reports),
        gateways_ready=gateways_ready,
        loaded_bytes=loaded_bytes,
        placed_at=placed_at.strftime("%Y-%m-%dT%H:%M:%SZ") if placed_at is not None else None,
        too_large=[
            f"{n}: {gap} bytes over budget"
            for n, gap in sorted((placement.too_large if placement else {}).items())
        ][:64],
        hottest=hottest,
    )
