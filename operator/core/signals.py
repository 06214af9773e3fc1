"""What the operator observes of a pool: pod counts, load and latency, merged for the decisions.

This module owns the pure half of signal gathering (the shell, `tidal.operator.shell.signals`
and `podmetrics`, does the I/O):

* **Pods.** `count_pods` turns plain pod dicts (as the API server returns them) into the counts
  the autoscaler needs (ready serving, warming, ready standby, pending unschedulable);
  `scrape_targets` lists the addresses to scrape; `measured_warmup_seconds` times scheduling to
  readiness; `pod_views` feeds the scale-down victim choice.
* **Fast path (direct pod scrapes).** `PodScrape` / `PodMissing` are one pod's `/metrics` read or
  its failure; `fold_scrapes` sums a pool's in-flight requests and derives the arrival rate by
  differencing two scrapes per pod (`RateMemory`). A pod that could not be read is *missing*,
  never zero.
* **Capacity evidence.** `fold_scrapes` also differences each pod's batch work counters
  (`PodScrape.work`, summed over all scraped pods into a `WorkSample`: what a replica does, not
  the pool's load) and sums the queued requests that can no longer meet their deadline
  (`unreachable`); the autoscaler learns capacity from the first and leaves the second out of
  its backlog (``operator/SIGNALS.md``, "Capacity").
* **Prometheus path.** `pool_signals_query` is the one PromQL expression that returns every
  signal of every pool (grouped ``by (namespace, isvc, pool)``) in one round trip;
  `parse_pool_signals` turns its answer into `PromPoolSignals` per pool, NaN becoming None.
* **Merging.** `observation_from_signals` builds the autoscaler's `Observation` (queue from the
  pods when fresh, Prometheus otherwise; P99 from Prometheus; stale signals dropped with a note);
  `pool_signals_from_prometheus` builds the SLO evaluator's `PoolSignals`.

Why in-flight alone is the queue signal: the runtime's ``tidal_inflight_requests`` counts every
infer request received and not yet answered — queued in the batcher, waiting for a load, or
executing — so it already includes ``tidal_queue_depth``; adding the two would count queued
requests twice.

Why arrivals = answered + change in in-flight: ``tidal_requests_total`` counts *answered*
requests. Under saturation answers lag arrivals, and a rate of answers would hide exactly the
surge the autoscaler must see. Every request that arrived in an interval was either answered in
it or is still in flight at its end, so arrivals = Δanswered + Δin-flight, exactly.

Times: `at` / `now` / `queried_at` are monotonic seconds from the shell's clock; Prometheus ages
are computed by Prometheus itself (``time() - timestamp(...)``), so the two hosts' clocks never
have to agree. Wall-clock timestamps appear only in pod dicts (RFC 3339), parsed, never read.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...common.backoff import Backoff
from ...common.contract import (
    METRIC_COLD_START_SECONDS,
    METRIC_ENGINE_LOAD_SECONDS,
    METRIC_GPU_MEMORY_BYTES,
    METRIC_INFLIGHT_REQUESTS,
    METRIC_REQUEST_DURATION_SECONDS,
    METRIC_REQUESTS,
    METRIC_STARTUP_SECONDS,
    METRIC_TRANSFER_WAIT_SECONDS,
)
from .api import LABEL_ISVC, LABEL_POOL, LABEL_ROLE, TimeToRoutable
from .autoscaler import BatchWork, Observation, WorkSample
from .autoscaler_pods import PodView
from .resources import ROLE_STANDBY, RUNTIME_PORT
from .slo import PoolSignals

__all__ = [
    "DEFAULT_COLD_WINDOW",
    "DEFAULT_LATENCY_WINDOW",
    "DEFAULT_RATE_WINDOW",
    "FastPoolSignals",
    "ObservedPool",
    "PodCounts",
    "PodMissing",
    "PodScrape",
    "PodTarget",
    "PoolKey",
    "PromPoolSignals",
    "RateMemory",
    "ScrapeResult",
    "count_pods",
    "fold_scrapes",
    "measured_warmup_seconds",
    "observation_from_signals",
    "parse_pool_signals",
    "pod_views",
    "pool_of",
    "pool_signals_from_prometheus",
    "pool_signals_query",
    "scrape_targets",
]


class PoolKey(NamedTuple):
    """One pool of one InferenceService; also the Prometheus grouping labels."""

    namespace: str
    isvc: str
    pool: str


# -- pods ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodCounts:
    """A pool's pods by state; `serving` names the ready serving pods (those in the Service)."""

    ready_serving: int = 0
    warming: int = 0
    ready_standby: int = 0
    pending_unschedulable: int = 0
    terminating: int = 0
    serving: tuple[str, ...] = ()


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


def _conditions(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = pod.get("status") or {}
    return {str(c.get("type")): c for c in status.get("conditions") or []}


def _terminating(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return _meta(pod).get("deletionTimestamp") is not None or phase in ("Succeeded", "Failed")


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    cond = _conditions(pod).get("PodScheduled") or {}
    return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"


def _ready(pod: Mapping[str, Any]) -> bool:
    cond = _conditions(pod).get("Ready") or {}
    return cond.get("status") == "True"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (pods as plain dicts, as the API returns them)."""
    return _ready(pod)


def pod_labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return dict(_meta(pod).get("labels") or {})


def _standby(pod: Mapping[str, Any]) -> bool:
    return (_meta(pod).get("labels") or {}).get(LABEL_ROLE) == ROLE_STANDBY


def pool_of(pod: Mapping[str, Any]) -> PoolKey | None:
    """The pool a pod belongs to by its labels, or None for a pod that is not tidal's."""
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    if LABEL_ISVC not in labels or LABEL_POOL not in labels:
        return None
    return PoolKey(str(meta.get("namespace", "")), labels[LABEL_ISVC], labels[LABEL_POOL])


def count_pods(pods: Iterable[Mapping[str, Any]]) -> PodCounts:
    """Count one pool's pods (the caller selects the pool).

    Terminating pods (deletionTimestamp, or phase Succeeded/Failed) are no capacity; pods the
    scheduler reported ``PodScheduled=False`` with reason ``Unschedulable`` are pending; ready
    pods are standby by the role label, serving otherwise; every other pod is warming (created,
    scheduled or about to be, not ready yet).
    """
    serving: list[str] = []
    warming = standby = pending = terminating = 0
    for pod in pods:
        if _terminating(pod):
            terminating += 1
        elif _unschedulable(pod):
            pending += 1
        elif _ready(pod):
            if _standby(pod):
                standby += 1
            else:
                serving.append(str(_meta(pod).get("name", "")))
        else:
            warming += 1
    return PodCounts(
        ready_serving=len(serving),
        warming=warming,
        ready_standby=standby,
        pending_unschedulable=pending,
        terminating=terminating,
        serving=tuple(sorted(serving)),
    )


@dataclass(frozen=True, slots=True)
class PodTarget:
    """A pod to scrape: its name and ``host:port`` of the runtime's `/metrics`."""

    pod: str
    address: str
    path: str = "/metrics"

    @property
    def url(self) -> str:
        return f"http://{self.address}{self.path}"


def _port(pod: Mapping[str, Any], default: int) -> int:
    annotations = _meta(pod).get("annotations") or {}
    raw = annotations.get("prometheus.io/port")
    if raw is not None and str(raw).isdigit():
        return int(raw)
    return default


def pod_address(pod: Mapping[str, Any], default_port: int = RUNTIME_PORT) -> str | None:
    """``host:port`` of the runtime in ``pod`` (port from ``prometheus.io/port``), None
    without an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"{host}:{_port(pod, default_port)}"


def scrape_targets(
    pods: Iterable[Mapping[str, Any]], default_port: int = RUNTIME_PORT
) -> list[PodTarget]:
    """Pods worth scraping: not terminating, with an IP (warming pods included: a pod turning
    ready is then already known to the rate memory). Port from ``prometheus.io/port``."""
    targets = []
    for pod in pods:
        address = pod_address(pod, default_port)
        if address is None or _terminating(pod):
            continue
        meta = _meta(pod)
        path = (meta.get("annotations") or {}).get("prometheus.io/path") or "/metrics"
        targets.append(PodTarget(str(meta.get("name", "")), address, path))
    return sorted(targets, key=lambda t: t.pod)


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def measured_warmup_seconds(pods: Iterable[Mapping[str, Any]]) -> float | None:
    """Median seconds from a pod being scheduled to it turning ready, over the ready pods.

    Scheduled (not created) is the start so that time spent Pending for a GPU does not count as
    warm-up. Resolution is the API's one second. None when no pod has both timestamps.
    """
    samples = []
    for pod in pods:
        if _terminating(pod) or not _ready(pod):
            continue
        conds = _conditions(pod)
        start = _timestamp((conds.get("PodScheduled") or {}).get("lastTransitionTime"))
        ready = _timestamp((conds.get("Ready") or {}).get("lastTransitionTime"))
        if start is not None and ready is not None and ready >= start:
            samples.append(ready - start)
    return statistics.median(samples) if samples else None


ROUTABLE_WINDOW_SECONDS = 600.0


def time_to_routable(
    pods: Iterable[Mapping[str, Any]],
    scrapes: Mapping[str, PodScrape],
    wall_now: float,
    window_seconds: float = ROUTABLE_WINDOW_SECONDS,
) -> TimeToRoutable | None:
    """Medians, over the pods that turned Ready within ``window_seconds`` of ``wall_now``, of
    each phase from creation to Ready: scheduling and process start from the API's timestamps
    (one second resolution), the runtime's start to Ready and its engine load phases from the
    pod's own metrics (``scrapes``; sub-millisecond). None when no pod qualifies."""
    totals: list[float] = []
    schedule: list[float] = []
    start: list[float] = []
    runtime: list[float] = []
    phases: dict[str, list[float]] = {}
    for pod in pods:
        if _terminating(pod) or not _ready(pod):
            continue
        meta, conds = _meta(pod), _conditions(pod)
        created = _timestamp(meta.get("creationTimestamp"))
        scheduled = _timestamp((conds.get("PodScheduled") or {}).get("lastTransitionTime"))
        ready = _timestamp((conds.get("Ready") or {}).get("lastTransitionTime"))
        if ready is None or wall_now - ready > window_seconds:
            continue
        running = [
            _timestamp(((c.get("state") or {}).get("running") or {}).get("startedAt"))
            for c in (pod.get("status") or {}).get("containerStatuses") or []
        ]
        started = max((t for t in running if t is not None), default=None)
        if created is not None and ready >= created:
            totals.append(ready - created)
        if created is not None and scheduled is not None and scheduled >= created:
            schedule.append(scheduled - created)
        if scheduled is not None and started is not None and started >= scheduled:
            start.append(started - scheduled)
        scrape = scrapes.get(str(meta.get("name", "")))
        if scrape is not None and scrape.startup_seconds is not None:
            runtime.append(scrape.startup_seconds)
            for phase, seconds in scrape.load_phases:
                phases.setdefault(phase, []).append(seconds)
    if not totals and not runtime:
        return None

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    return TimeToRoutable(
        samples=max(len(totals), len(runtime)),
        total_seconds=median(totals),
        schedule_seconds=median(schedule),
        process_start_seconds=median(start),
        runtime_seconds=median(runtime),
        phases={p: round(statistics.median(v), 4) for p, v in sorted(phases.items())},
    )


# -- fast path: direct pod scrapes ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodScrape:
    """One successful read of one pod's `/metrics` at monotonic time `at`.

    Totals are sums over the pod's models and codes. `failed` counts 5xx answers (server
    errors, queue timeouts and overload). Optional fields are None when the runtime did not
    expose them (e.g. GPU memory on the CPU backend; startup time before readiness).
    """

    pod: str
    at: float
    in_flight: float
    queued: float
    answered: float
    failed: float = 0.0
    models_ready: int = 0
    models: int = 0
    cache_hits: float = 0.0
    cache_misses: float = 0.0
    startup_seconds: float | None = None
    engine_load_seconds: float | None = None
    gpu_memory_used_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    # Capacity evidence (None from a runtime that does not expose it): completed batch totals,
    # execution slots and the largest batch (most over the pod's models), queued requests that
    # can still meet their deadline, and the shortest request deadline (None: no deadline).
    work: BatchWork | None = None
    slots: int | None = None
    max_batch_rows: int | None = None
    reachable: float | None = None
    request_timeout_seconds: float | None = None
    # Seconds spent per engine load phase over the pod's life (summed over its models).
    load_phases: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PodMissing:
    """A pod whose `/metrics` could not be read at `at` (timeout, refused, bad answer)."""

    pod: str
    at: float
    error: str


ScrapeResult = PodScrape | PodMissing


@dataclass(frozen=True, slots=True)
class _Last:
    at: float
    answered: float
    in_flight: float
    rate: float | None
    work: BatchWork | None = None


@dataclass(frozen=True, slots=True)
class RateMemory:
    """Per pod, the last totals and the time they were read (what differencing needs).

    Bounded: pods that were not in the last round of targets are forgotten, and so is a pod
    missing for longer than `forget_after` seconds.
    """

    last: Mapping[str, _Last] = field(default_factory=dict)


# A pod whose scrapes keep failing is asked less often: after SCRAPE_MISSES_BEFORE_BACKOFF
# misses in a row, 1 s between tries, doubling up to SCRAPE_BACKOFF_MAX_SECONDS.
SCRAPE_MISSES_BEFORE_BACKOFF = 2
SCRAPE_BACKOFF_MAX_SECONDS = 8.0
SCRAPE_BACKOFF = Backoff(first_seconds=1.0, max_seconds=SCRAPE_BACKOFF_MAX_SECONDS)


@dataclass(frozen=True, slots=True)
class ScrapeBackoff:
    """Per pod, its scrape misses in a row and when it may be asked again.

    A pod that does not answer (an address nobody listens on, a stopped process) would hold one
    of the operator's scrape connections for the whole timeout every tick, delaying the scrapes
    of every other pod once there are many; backing off frees them. A pod skipped reads as
    missing with its last error, exactly as a timeout would; one answer resets it, and a pod
    that has just turned Ready is asked at once (its runtime has started answering).
    """

    misses: Mapping[str, int] = field(default_factory=dict)
    retry_at: Mapping[str, float] = field(default_factory=dict)
    last_error: Mapping[str, str] = field(default_factory=dict)
    ready: frozenset[str] = frozenset()


def plan_scrapes(
    targets: Sequence[PodTarget],
    backoff: ScrapeBackoff,
    now: float,
    ready: Collection[str] = (),
) -> tuple[list[PodTarget], list[PodMissing]]:
    """The targets to scrape now, and the skipped ones as already-missing results (``ready``:
    the pods Ready now)."""
    due: list[PodTarget] = []
    skipped: list[PodMissing] = []
    for target in targets:
        retry = backoff.retry_at.get(target.pod)
        turned_ready = target.pod in ready and target.pod not in backoff.ready
        if retry is not None and now < retry and not turned_ready:
            misses = backoff.misses.get(target.pod, 0)
            error = backoff.last_error.get(target.pod, "")
            skipped.append(
                PodMissing(target.pod, now, f"{error} (missed {misses} in a row; backing off)")
            )
        else:
            due.append(target)
    return due, skipped


def advance_backoff(
    backoff: ScrapeBackoff,
    scraped: Iterable[ScrapeResult],
    targets: Iterable[PodTarget],
    ready: Collection[str] = (),
) -> ScrapeBackoff:
    """Fold one round's scrape results (only the pods actually asked) into the back-off;
    pods no longer among the targets are forgotten."""
    keep = {t.pod for t in targets}
    misses = {p: n for p, n in backoff.misses.items() if p in keep}
    retry_at = {p: t for p, t in backoff.retry_at.items() if p in keep}
    last_error = {p: e for p, e in backoff.last_error.items() if p in keep}
    for result in scraped:
        pod = result.pod
        if not isinstance(result, PodMissing):
            misses.pop(pod, None)
            retry_at.pop(pod, None)
            last_error.pop(pod, None)
            continue
        n = misses.get(pod, 0) + 1
        misses[pod], last_error[pod] = n, result.error
        if n >= SCRAPE_MISSES_BEFORE_BACKOFF:
            retry_at[pod] = result.at + SCRAPE_BACKOFF.nth(n - SCRAPE_MISSES_BEFORE_BACKOFF + 1)
    return ScrapeBackoff(misses, retry_at, last_error, frozenset(ready) & keep)


@dataclass(frozen=True, slots=True)
class FastPoolSignals:
    """A pool's load as its pods reported it, summed over the ready serving pods.

    `in_flight` is None when too many serving pods are missing to estimate it; when a few are
    missing it is extrapolated from the others (mean per pod) and a note says so. `at` is the
    time of the oldest scrape used.
    """

    at: float | None
    in_flight: float | None
    queued: float | None
    arrival_rate: float | None
    pods_scraped: int
    missing: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    per_pod_in_flight: Mapping[str, float] = field(default_factory=dict)
    # Batch work of all scraped pods since their previous base (None: no pod reported any),
    # queued requests of the serving pods that cannot meet their deadline (scaled like the
    # queue), and the shortest request deadline of the pool's pods.
    work: WorkSample | None = None
    unreachable: float | None = None
    deadline_seconds: float | None = None


def _work_delta(prev: BatchWork | None, cur: BatchWork | None) -> BatchWork | None:
    """What a pod's batch totals grew by; None without both or after a reset."""
    if prev is None or cur is None:
        return None
    names = ("batches", "rows", "requests", "seconds", "row_seconds", "rows_squared")
    deltas = [getattr(cur, n) - getattr(prev, n) for n in names]
    if min(deltas) < 0:
        return None
    return BatchWork(*deltas)


def _arrival_rate(
    prev: _Last | None, cur: PodScrape, min_interval: float
) -> tuple[_Last, float | None, BatchWork | None]:
    """The pod's new base, its arrival rate and the batch work done since the old base."""
    if prev is None or cur.answered < prev.answered:
        # First sight, or a counter reset (the process restarted): no interval to measure.
        return _Last(cur.at, cur.answered, cur.in_flight, None, cur.work), None, None
    elapsed = cur.at - prev.at
    if elapsed < min_interval - 1e-9:  # tolerate float rounding of the timestamps
        # Too short to difference without noise: keep the older base, repeat its rate (its
        # work was counted when that base was set).
        return prev, prev.rate, None
    arrived = (cur.answered - prev.answered) + (cur.in_flight - prev.in_flight)
    rate = max(arrived, 0.0) / elapsed
    work = _work_delta(prev.work, cur.work)
    return _Last(cur.at, cur.answered, cur.in_flight, rate, cur.work), rate, work


def fold_scrapes(
    results: Sequence[ScrapeResult],
    memory: RateMemory,
    serving: Collection[str],
    *,
    min_rate_interval: float = 0.5,
    forget_after: float = 30.0,
    max_missing_fraction: float = 0.5,
) -> tuple[FastPoolSignals, RateMemory]:
    """Sum one round of scrapes of a pool into its load, and advance the rate memory.

    `serving` names the ready serving pods (`PodCounts.serving`): only their in-flight requests
    and arrivals are the pool's load (warming and standby pods get no traffic). A serving pod
    without a scrape is missing: if at most `max_missing_fraction` of them are, the sums are
    scaled up by serving/reported (their share is taken as the mean of the others), else the
    signal is None. Never zero for a pod that did not answer.
    """
    last = dict(memory.last)
    scraped: dict[str, PodScrape] = {}
    rates: dict[str, float] = {}
    missing_now: dict[str, PodMissing] = {}
    work: BatchWork | None = None
    for result in results:
        if isinstance(result, PodMissing):
            missing_now[result.pod] = result
            continue
        scraped[result.pod] = result
        entry, rate, done = _arrival_rate(last.get(result.pod), result, min_rate_interval)
        last[result.pod] = entry
        if rate is not None:
            rates[result.pod] = rate
        if done is not None:
            # Work is evidence of what a replica does, not the pool's load: every pod's counts,
            # serving or not, and no extrapolation for pods that did not answer.
            work = done if work is None else work.plus(done)
    seen = set(scraped) | set(missing_now)
    newest = max((r.at for r in results), default=None)
    kept = {
        pod: entry
        for pod, entry in last.items()
        if pod in seen and (newest is None or newest - entry.at <= forget_after)
    }

    serving_set = set(serving)
    reported = sorted(serving_set & set(scraped))
    missing = tuple(sorted(serving_set - set(scraped)))
    notes: list[str] = []
    n_serving = len(serving_set)
    in_flight: float | None
    queued: float | None
    unreachable: float | None = None
    if n_serving == 0:
        in_flight, queued = 0.0, 0.0
    elif len(missing) > max_missing_fraction * n_serving:
        in_flight = queued = None
        notes.append(f"queue:missing {len(missing)}/{n_serving} pods")
    else:
        scale = n_serving / len(reported)
        in_flight = sum(scraped[p].in_flight for p in reported) * scale
        queued = sum(scraped[p].queued for p in reported) * scale
        dead = [
            max(0.0, scraped[p].queued - r)
            for p in reported
            if (r := scraped[p].reachable) is not None
        ]
        if dead:
            unreachable = sum(dead) * n_serving / len(dead)
        if missing:
            notes.append(f"queue:extrapolated {len(missing)}/{n_serving} pods missing")

    with_rate = [p for p in reported if p in rates]
    arrival: float | None
    if n_serving == 0:
        arrival = 0.0
    elif len(with_rate) == 0 or n_serving - len(with_rate) > max_missing_fraction * n_serving:
        arrival = None
        notes.append(f"rate:unknown for {n_serving - len(with_rate)}/{n_serving} pods")
    else:
        arrival = sum(rates[p] for p in with_rate) * n_serving / len(with_rate)
        if len(with_rate) < n_serving:
            notes.append(f"rate:extrapolated {n_serving - len(with_rate)}/{n_serving} pods")

    sample = None
    if work is not None and work.batches > 0:
        slots = [s.slots for s in scraped.values() if s.slots]
        rows = [s.max_batch_rows for s in scraped.values() if s.max_batch_rows]
        sample = WorkSample(work, max(slots, default=1), max(rows, default=1))
    timeouts = [
        t for s in scraped.values() if (t := s.request_timeout_seconds) is not None and t > 0
    ]
    used = [scraped[p].at for p in reported]
    signals = FastPoolSignals(
        at=min(used) if used else newest,
        in_flight=in_flight,
        queued=queued,
        arrival_rate=arrival,
        pods_scraped=len(scraped),
        missing=missing,
        notes=tuple(notes),
        per_pod_in_flight={p: s.in_flight for p, s in sorted(scraped.items())},
        work=sample,
        unreachable=unreachable,
        deadline_seconds=min(timeouts) if timeouts else None,
    )
    return signals, RateMemory(kept)


def pod_views(
    pods: Iterable[Mapping[str, Any]],
    scrapes: Mapping[str, PodScrape],
    wall_now: float,
) -> list[PodView]:
    """`PodView`s for the scale-down choice: in-flight and cache warmth from the pods' scrapes
    (warmth = share of the pod's models resident and warm), time ready from its Ready condition."""
    views = []
    for pod in pods:
        if _terminating(pod):
            continue
        name = str(_meta(pod).get("name", ""))
        scrape = scrapes.get(name)
        ready = _ready(pod)
        since = _timestamp((_conditions(pod).get("Ready") or {}).get("lastTransitionTime"))
        warmth = scrape.models_ready / scrape.models if scrape and scrape.models else 0.0
        views.append(
            PodView(
                name=name,
                ready=ready,
                standby=_standby(pod),
                in_flight=int(scrape.in_flight) if scrape else 0,
                cache_warmth=min(max(warmth, 0.0), 1.0),
                scheduled=not _unschedulable(pod),
                ready_for_seconds=max(wall_now - since, 0.0) if ready and since else 0.0,
            )
        )
    return views


# -- Prometheus path -----------------------------------------------------------------------------

DEFAULT_LATENCY_WINDOW = "30s"
DEFAULT_COLD_WINDOW = "5m"
DEFAULT_RATE_WINDOW = "10s"
_GROUP = "namespace, isvc, pool"


def _selector(extra: str, *matchers: str) -> str:
    parts = [*matchers, 'isvc!=""']
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


def _increase(series: str, window: str) -> str:
    """How much counters grew over `window`, counting series born inside it in full.

    ``increase()`` needs two samples and measures from the first one, so it cannot see what a
    series held when it first appeared — and the runtime creates a labelled series with its
    first observation (the first cold start of a model, the first 500 of a pod). A series absent
    `window` ago (``unless ... offset``) grew by everything it holds; the rest by ``increase``.
    The ``role`` label is summed away first: relabelling a pod serving <-> standby starts new
    series with the pod's lifetime totals, which are not new requests.
    """
    s, w = series, window
    drop = "sum without (role)"
    born = f"({drop} ({s}) unless {drop} ({s} offset {w}))"
    return f"({born} or {drop} (increase({s}[{w}])))"


def pool_signals_query(
    matchers: str = "",
    *,
    latency_window: str = DEFAULT_LATENCY_WINDOW,
    cold_window: str = DEFAULT_COLD_WINDOW,
    rate_window: str = DEFAULT_RATE_WINDOW,
) -> str:
    """One PromQL expression answering every signal of every pool.

    Each sub-query is grouped ``by (namespace, isvc, pool)`` and tagged with a ``signal`` label
    (``label_replace`` on an empty source); ``or`` joins them (their label sets differ by
    ``signal``, so nothing is dropped). One HTTP round per tick, whatever the number of
    InferenceServices. `matchers` narrows every selector (e.g. ``namespace="prod"``).
    GPU memory is returned per pod (``signal=gpu_used|gpu_total``) so the pool's worst pod can
    be picked.
    """

    def sel(*m: str) -> str:
        return _selector(matchers, *m)

    w, cw, rw = latency_window, cold_window, rate_window
    by = f"sum by ({_GROUP})"
    hot, cold = sel('cache="hot"'), sel('cache="cold"')
    errors, warmups, gpu_kinds = (
        sel('code=~"5.."'),
        sel('phase="warmup"'),
        sel('kind=~"used|total"'),
    )

    def p99(selector: str) -> str:
        buckets = _increase(f"{METRIC_REQUEST_DURATION_SECONDS}_bucket{selector}", w)
        return f"histogram_quantile(0.99, sum by ({_GROUP}, le) ({buckets}))"

    parts = {
        "p99_hot": p99(hot),
        "p99_cold": p99(cold),
        "requests": f"{by} ({_increase(f'{METRIC_REQUESTS}_total{sel()}', w)})",
        "errors": f"{by} ({_increase(f'{METRIC_REQUESTS}_total{errors}', w)})",
        "cold_start": (
            f"{by} ({_increase(f'{METRIC_COLD_START_SECONDS}_sum{sel()}', cw)})"
            f" / {by} ({_increase(f'{METRIC_COLD_START_SECONDS}_count{sel()}', cw)})"
        ),
        "cold_samples": f"{by} ({_increase(f'{METRIC_COLD_START_SECONDS}_count{sel()}', cw)})",
        # Requests held by an engine load, waiting on its weight transfer: a cold signal.
        "transfer_wait": (
            "histogram_quantile(0.99, sum by ("
            f"{_GROUP}, le) ({_increase(f'{METRIC_TRANSFER_WAIT_SECONDS}_bucket{sel()}', cw)}))"
        ),
        "transfer_samples": (
            f"{by} ({_increase(f'{METRIC_TRANSFER_WAIT_SECONDS}_count{sel()}', cw)})"
        ),
        "startup": f"avg by ({_GROUP}) ({METRIC_STARTUP_SECONDS}{sel()} > 0)",
        "engine_load": (
            f"{by} ({METRIC_ENGINE_LOAD_SECONDS}_sum{sel()})"
            f" / {by} ({METRIC_ENGINE_LOAD_SECONDS}_count{warmups})"
        ),
        "in_flight": f"{by} ({METRIC_INFLIGHT_REQUESTS}{sel()})",
        "arrival_rate": f"{by} (rate({METRIC_REQUESTS}_total{sel()}[{rw}]))",
        "pods": f"count by ({_GROUP}) ({METRIC_INFLIGHT_REQUESTS}{sel()})",
        "age": f"time() - max by ({_GROUP}) (timestamp({METRIC_INFLIGHT_REQUESTS}{sel()}))",
    }
    tagged = [f'label_replace({expr}, "signal", "{name}", "", "")' for name, expr in parts.items()]
    gpu = f'label_replace({METRIC_GPU_MEMORY_BYTES}{gpu_kinds}, "signal", "gpu_$1", "kind", "(.+)")'
    return " or ".join([*tagged, gpu])


@dataclass(frozen=True, slots=True)
class PromPoolSignals:
    """What Prometheus says about one pool. None: no series (or NaN, e.g. a quantile of nothing).

    `age_seconds` is how old the pool's freshest ``tidal_inflight_requests`` sample was when
    Prometheus evaluated the query (its own clock); `queried_at` when the shell sent it (the
    shell's monotonic clock). Latencies in ms; `requests`/`errors` are counts over the latency
    window, `cold_samples` and `transfer_samples` (with the transfer wait's P99) over the cold
    window. GPU memory is the pod with the least headroom.
    """

    key: PoolKey
    queried_at: float
    p99_hot_ms: float | None = None
    p99_cold_ms: float | None = None
    requests: float | None = None
    errors: float | None = None
    cold_start_ms: float | None = None
    cold_samples: float | None = None
    transfer_wait_ms: float | None = None
    transfer_samples: float | None = None
    startup_seconds: float | None = None
    engine_load_seconds: float | None = None
    in_flight: float | None = None
    arrival_rate: float | None = None
    pods_reporting: int | None = None
    age_seconds: float | None = None
    gpu_memory_used_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None

    @property
    def error_rate(self) -> float | None:
        """Failed / all over the window; None without requests (no sample, no rate)."""
        if not self.requests or self.requests <= 0:
            return None
        return min(max((self.errors or 0.0) / self.requests, 0.0), 1.0)

    @property
    def observed_at(self) -> float:
        """When the freshest sample was taken, on the shell's clock."""
        return self.queried_at - (self.age_seconds or 0.0)


_MS = {"p99_hot", "p99_cold", "cold_start", "transfer_wait"}
_FIELDS = {
    "p99_hot": "p99_hot_ms",
    "p99_cold": "p99_cold_ms",
    "requests": "requests",
    "errors": "errors",
    "cold_start": "cold_start_ms",
    "cold_samples": "cold_samples",
    "transfer_wait": "transfer_wait_ms",
    "transfer_samples": "transfer_samples",
    "startup": "startup_seconds",
    "engine_load": "engine_load_seconds",
    "in_flight": "in_flight",
    "arrival_rate": "arrival_rate",
    "pods": "pods_reporting",
    "age": "age_seconds",
}


def _number(sample: Mapping[str, Any]) -> float | None:
    value = sample.get("value")
    try:
        number = float(value[1]) if isinstance(value, (list, tuple)) else None
    except (TypeError, ValueError, IndexError):
        return None
    if number is None or math.isnan(number) or math.isinf(number):
        return None
    return number


def parse_pool_signals(
    result: Sequence[Mapping[str, Any]], queried_at: float
) -> dict[PoolKey, PromPoolSignals]:
    """Turn the vector answered to `pool_signals_query` into signals per pool."""
    values: dict[PoolKey, dict[str, Any]] = {}
    gpu: dict[PoolKey, dict[str, dict[str, float]]] = {}
    for sample in result:
        labels = sample.get("metric") or {}
        signal = labels.get("signal", "")
        key = PoolKey(labels.get("namespace", ""), labels.get("isvc", ""), labels.get("pool", ""))
        if not key.isvc:
            continue
        fields = values.setdefault(key, {})
        number = _number(sample)
        if signal.startswith("gpu_"):
            if number is not None:
                pod = gpu.setdefault(key, {}).setdefault(labels.get("pod", ""), {})
                pod[signal.removeprefix("gpu_")] = number
            continue
        name = _FIELDS.get(signal)
        if name is None or number is None:
            continue
        if signal in _MS:
            number *= 1000.0
        elif signal == "pods":
            number = int(number)
        elif signal == "age":
            number = max(number, 0.0)
        fields[name] = number
    for key, pods in gpu.items():
        complete = [p for p in pods.values() if p.get("total", 0.0) > 0 and "used" in p]
        if complete:
            worst = max(complete, key=lambda p: p["used"] / p["total"])
            values[key]["gpu_memory_used_bytes"] = worst["used"]
            values[key]["gpu_memory_total_bytes"] = worst["total"]
    return {key: PromPoolSignals(key, queried_at, **fields) for key, fields in values.items()}


# -- merging ---------------------------------------------------------------------------------------


# The note that starts a pool's notes while Prometheus does not answer (``MetricsStale``).
NOTE_PROMETHEUS_UNAVAILABLE = "prometheus:unavailable"


@dataclass(frozen=True, slots=True)
class ObservedPool:
    """The autoscaler's `Observation` plus where each signal came from and what was dropped.

    `notes` are short, machine-friendly strings (``queue:stale 7.2s``, ``p99:missing``) for the
    shell's condition message when the autoscaler holds.
    """

    observation: Observation
    queue_source: str  # "pods" | "prometheus" | "none"
    notes: tuple[str, ...] = ()


def observation_from_signals(
    now: float,
    counts: PodCounts,
    fast: FastPoolSignals | None,
    prom: PromPoolSignals | None,
    *,
    warmup_seconds: float | None = None,
    max_age_seconds: float = 5.0,
    prometheus_error: str | None = None,
) -> ObservedPool:
    """Merge the two paths into the autoscaler's `Observation` at monotonic `now`.

    Queue depth and arrival rate come from the pod scrapes when they are fresh (≤
    `max_age_seconds`), else from Prometheus when it is fresh, else they are None (the
    autoscaler holds). Hot P99 comes from Prometheus only; a stale P99 is dropped (None) rather
    than holding the whole pool, so a Prometheus outage cannot block a surge response (the
    autoscaler still refuses to scale down without P99 while the pool is busy). Warm-up time:
    `warmup_seconds` (e.g. `measured_warmup_seconds`) first, then the runtime's startup time,
    then its mean engine-load time. `metrics_age_seconds` is the age of the oldest signal kept.
    `prometheus_error`: why the last Prometheus round failed (Prometheus unreachable or
    erroring): noted, and the observation says so (the autoscaler then removes nothing).
    """
    notes: list[str] = list(fast.notes) if fast else []
    if prometheus_error is not None:
        notes.append(f"{NOTE_PROMETHEUS_UNAVAILABLE} ({prometheus_error[:120]})")
    ages: list[float] = []
    prom_age = None
    if prom is not None and prom.age_seconds is not None:
        prom_age = max(now - prom.queried_at, 0.0) + prom.age_seconds
    prom_fresh = prom_age is not None and prom_age <= max_age_seconds

    queue: float | None = None
    rate: float | None = None
    source = "none"
    fast_age = max(now - fast.at, 0.0) if fast is not None and fast.at is not None else None
    if fast is not None and fast.in_flight is not None and fast_age is not None:
        if fast_age <= max_age_seconds:
            queue, rate, source = fast.in_flight, fast.arrival_rate, "pods"
            ages.append(fast_age)
        else:
            notes.append(f"queue:stale pods {fast_age:.1f}s")
    if source == "none" and prom is not None and prom.in_flight is not None:
        reporting = prom.pods_reporting or 0
        if not prom_fresh or prom_age is None:
            notes.append(f"queue:stale prometheus {_fmt_age(prom_age)}")
        elif reporting < counts.ready_serving:
            # Prometheus lost pods too: its sum would count them as idle.
            notes.append(f"queue:prometheus has {reporting}/{counts.ready_serving} pods")
        else:
            queue, rate, source = prom.in_flight, prom.arrival_rate, "prometheus"
            ages.append(prom_age)
    if source == "none" and counts.ready_serving == 0:
        # Nothing serves, so nothing can be queued: an empty pool's queue is known to be zero.
        queue, rate, source = 0.0, 0.0, "pods"
    if source == "none":
        notes.append("queue:missing")
    elif rate is None:
        # Not all of the time: the queue alone decides when the rate is unknown.
        notes.append(f"rate:missing ({source})")

    p99: float | None = None
    if prom is None:
        notes.append("p99:missing prometheus")
    elif not prom_fresh:
        notes.append(f"p99:stale {_fmt_age(prom_age)}")
    else:
        p99 = prom.p99_hot_ms
        if p99 is not None and prom_age is not None:
            ages.append(prom_age)

    warmup = warmup_seconds
    if warmup is None and prom is not None:
        warmup = prom.startup_seconds or prom.engine_load_seconds

    from_pods = source == "pods" and fast is not None
    observation = Observation(
        now=now,
        ready_serving=counts.ready_serving,
        warming=counts.warming,
        ready_standby=counts.ready_standby,
        pending_unschedulable=counts.pending_unschedulable,
        queue_depth=queue,
        hot_p99_ms=p99,
        arrival_rate=rate,
        warmup_seconds=warmup,
        metrics_age_seconds=max(ages) if ages else (0.0 if source != "none" else None),
        unreachable=fast.unreachable if from_pods and fast is not None else None,
        deadline_seconds=fast.deadline_seconds if fast is not None else None,
        work=fast.work if fast is not None else None,
        prometheus_unavailable=prometheus_error is not None,
    )
    return ObservedPool(observation, source, tuple(notes))


def _fmt_age(age: float | None) -> str:
    return "unknown age" if age is None else f"{age:.1f}s"


def pool_signals_from_prometheus(prom: PromPoolSignals | None) -> PoolSignals:
    """The SLO evaluator's input. `observedAt` is when the freshest sample was taken (shell
    clock), so the evaluator's own staleness rule sees data Prometheus stopped refreshing."""
    if prom is None:
        return PoolSignals()
    used, total = prom.gpu_memory_used_bytes, prom.gpu_memory_total_bytes
    return PoolSignals(
        p99_hot_ms=prom.p99_hot_ms,
        error_rate=prom.error_rate,
        cold_start_ms=prom.cold_start_ms,
        gpu_memory_used_bytes=int(used) if used is not None else None,
        gpu_memory_total_bytes=int(total) if total is not None else None,
        requests=round(prom.requests) if prom.requests is not None else None,
        cold_samples=round(prom.cold_samples) if prom.cold_samples is not None else None,
        transfer_wait_ms=prom.transfer_wait_ms,
        transfer_samples=(
            round(prom.transfer_samples) if prom.transfer_samples is not None else None
        ),
        observed_at=prom.observed_at,
    )
