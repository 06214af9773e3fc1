"""The fast path: read the runtime pods' `/metrics` directly, concurrently, with a short timeout.

Owns `scrape_pods` (one round over a list of `PodTarget`s) and `parse_pod_metrics` (exposition
text to a `PodScrape`). A pod that does not answer within the timeout, refuses, answers non-200
or unparseable text is a `PodMissing` — never a pod with zero load. The load arithmetic (sums,
arrival rates, extrapolation) is pure and lives in `tidal.operator.core.signals`.

Why not only Prometheus: a queue change reaches the operator through Prometheus after a scrape
interval plus the query, and Prometheus' interval is set for the whole cluster; reading the
pods on the autoscaler's own tick gives the queue as of this tick.

Cost: ``prometheus_client``'s text parser needs ~20 ms for one runtime's full exposition (the
latency histograms' buckets are most of it), so lines of families the operator does not read
are dropped before parsing (~0.7 ms per pod).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ...common import contract as c
from ...common.clock import CLOCK
from ..core.autoscaler import BatchWork
from ..core.podfaults import NO_ANSWER, ProbeAnswer
from ..core.signals import PodMissing, PodScrape, PodTarget, ScrapeResult

DEFAULT_SCRAPE_TIMEOUT = 0.3

# Sample names of the runtime's counters and histogram sums (the contract has the base names).
_REQUESTS_TOTAL = f"{c.METRIC_REQUESTS}_total"
_HITS_TOTAL = f"{c.METRIC_ENGINE_CACHE_HITS}_total"
_MISSES_TOTAL = f"{c.METRIC_ENGINE_CACHE_MISSES}_total"
_LOAD_SECONDS_SUM = f"{c.METRIC_ENGINE_LOAD_SECONDS}_sum"
# Batch work counters (capacity evidence), sample name -> BatchWork field.
_WORK = {
    f"{c.METRIC_BACKEND_BATCHES}_total": "batches",
    f"{c.METRIC_BACKEND_ROWS}_total": "rows",
    f"{c.METRIC_BACKEND_REQUESTS}_total": "requests",
    f"{c.METRIC_BACKEND_SECONDS}_total": "seconds",
    f"{c.METRIC_BACKEND_ROW_SECONDS}_total": "row_seconds",
    f"{c.METRIC_BACKEND_ROWS_SQUARED}_total": "rows_squared",
}
# Sample names read from the runtime (runtime/README.md "Metrics reference").
_WANTED = frozenset(
    {
        c.METRIC_QUEUE_DEPTH,
        c.METRIC_INFLIGHT_REQUESTS,
        _REQUESTS_TOTAL,
        c.METRIC_MODEL_READY,
        _HITS_TOTAL,
        _MISSES_TOTAL,
        c.METRIC_STARTUP_SECONDS,
        _LOAD_SECONDS_SUM,
        c.METRIC_GPU_MEMORY_BYTES,
        c.METRIC_BACKEND_SLOTS,
        c.METRIC_MAX_BATCH_ROWS,
        c.METRIC_QUEUE_REACHABLE,
        c.METRIC_REQUEST_TIMEOUT_SECONDS,
        *_WORK,
    }
)
# Family names as they appear in "# TYPE"/"# HELP" lines (counters drop their _total there).
_WANTED_FAMILIES = _WANTED | {
    c.METRIC_REQUESTS,
    c.METRIC_ENGINE_CACHE_HITS,
    c.METRIC_ENGINE_CACHE_MISSES,
    c.METRIC_ENGINE_LOAD_SECONDS,
    *(name.removesuffix("_total") for name in _WORK),
}


class MetricsFormatError(ValueError):
    """A pod answered `/metrics` with text that is not the exposition the runtime writes."""


def _keep(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] in _WANTED_FAMILIES:
                lines.append(line)
        elif line:
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in _WANTED:
                lines.append(line)
    return "\n".join(lines) + "\n"


def parse_pod_metrics(text: str, pod: str, at: float) -> PodScrape:
    """Read the load of one pod from its exposition text (`at`: when it was fetched)."""
    try:
        families = list(text_string_to_metric_families(_keep(text)))
    except (ValueError, IndexError) as exc:
        raise MetricsFormatError(f"{pod}: unparseable metrics: {exc}") from exc
    tally = _Tally()
    for family in families:
        for sample in family.samples:
            tally.add(sample.name, sample.labels, float(sample.value))
    if tally.in_flight is None:
        raise MetricsFormatError(f"{pod}: no tidal_inflight_requests (not a tidal runtime?)")
    return tally.scrape(pod, at, tally.in_flight)


@dataclass
class _Tally:
    """The runtime's series that matter, summed over their labels as a scrape reads them."""

    in_flight: float | None = None
    queued: float = 0.0
    answered: float = 0.0
    failed: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    load_seconds: float = 0.0
    saw_load: bool = False
    models: dict[str, float] = field(default_factory=dict)
    startup: float | None = None
    gpu: dict[str, float] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)
    slots: list[float] = field(default_factory=list)
    batch_rows: list[float] = field(default_factory=list)
    reachable: float | None = None
    timeouts: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        if name == c.METRIC_INFLIGHT_REQUESTS:
            self.in_flight = value
        elif name == c.METRIC_QUEUE_DEPTH:
            self.queued += value
        elif name == _REQUESTS_TOTAL:
            self.answered += value
            if labels.get("code", "").startswith("5"):
                self.failed += value
        elif name == c.METRIC_MODEL_READY:
            self.models[labels.get("model", "")] = value
        elif name == _HITS_TOTAL:
            self.hits += value
        elif name == _MISSES_TOTAL:
            self.misses += value
        elif name == c.METRIC_STARTUP_SECONDS:
            self.startup = value if value > 0 else None  # 0 until the pod turned ready
        elif name == _LOAD_SECONDS_SUM:
            self.load_seconds += value
            self.saw_load = True
            phase = labels.get("phase", "")
            self.phases[phase] = self.phases.get(phase, 0.0) + value
        elif name == c.METRIC_GPU_MEMORY_BYTES:
            self.gpu[labels.get("kind", "")] = value
        elif name in _WORK:
            self.work[_WORK[name]] = self.work.get(_WORK[name], 0.0) + max(value, 0.0)
        elif name == c.METRIC_BACKEND_SLOTS:
            self.slots.append(value)
        elif name == c.METRIC_MAX_BATCH_ROWS:
            self.batch_rows.append(value)
        elif name == c.METRIC_QUEUE_REACHABLE:
            self.reachable = (self.reachable or 0.0) + max(value, 0.0)
        elif name == c.METRIC_REQUEST_TIMEOUT_SECONDS and value > 0:
            self.timeouts.append(value)

    def scrape(self, pod: str, at: float, in_flight: float) -> PodScrape:
        return PodScrape(
            pod=pod,
            at=at,
            in_flight=in_flight,
            queued=self.queued,
            answered=self.answered,
            failed=self.failed,
            models_ready=sum(1 for v in self.models.values() if v >= 1),
            models=len(self.models),
            cache_hits=self.hits,
            cache_misses=self.misses,
            startup_seconds=self.startup,
            engine_load_seconds=self.load_seconds if self.saw_load else None,
            gpu_memory_used_bytes=self.gpu.get("used"),
            gpu_memory_total_bytes=self.gpu.get("total"),
            work=BatchWork(**self.work) if len(self.work) == len(_WORK) else None,
            slots=max(1, round(max(self.slots))) if self.slots else None,
            max_batch_rows=max(1, round(max(self.batch_rows))) if self.batch_rows else None,
            reachable=self.reachable,
            request_timeout_seconds=min(self.timeouts) if self.timeouts else None,
            load_phases=tuple(sorted(self.phases.items())),
        )


async def scrape_pod(
    session: aiohttp.ClientSession,
    target: PodTarget,
    *,
    scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT,
    clock: Callable[[], float] = CLOCK.monotonic,
) -> ScrapeResult:
    """One pod's `/metrics`, or why it could not be read. Never raises for the pod's faults."""
    try:
        async with asyncio.timeout(scrape_timeout):
            async with session.get(target.url) as response:
                if response.status != 200:
                    return PodMissing(target.pod, clock(), f"HTTP {response.status}")
                text = await response.text()
        # The time the answer arrived: the gauges were read by the pod just before.
        at = clock()
        return parse_pod_metrics(text, target.pod, at)
    except TimeoutError:
        return PodMissing(target.pod, clock(), f"timeout after {scrape_timeout:.3g}s")
    except (aiohttp.ClientError, OSError, MetricsFormatError, UnicodeDecodeError) as exc:
        return PodMissing(target.pod, clock(), f"{type(exc).__name__}: {exc}")


async def scrape_pods(
    session: aiohttp.ClientSession,
    targets: Sequence[PodTarget],
    *,
    scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT,
    clock: Callable[[], float] = CLOCK.monotonic,
) -> list[ScrapeResult]:
    """Scrape every target at once; the round takes at most `scrape_timeout` (plus parsing)."""
    return list(
        await asyncio.gather(
            *(scrape_pod(session, t, scrape_timeout=scrape_timeout, clock=clock) for t in targets)
        )
    )


# Readiness probes of not-Ready pods are few (each at most every 3 s) and their runtimes are
# busy loading: they get longer than a metrics scrape.
PROBE_TIMEOUT = 1.0


async def probe_ready(
    session: aiohttp.ClientSession, url: str, *, limit_seconds: float = PROBE_TIMEOUT
) -> ProbeAnswer:
    """Why a runtime is not ready: the ``error`` of its readiness answer (``url`` is its
    ``/v2/health/ready``). None when it is ready or gives no reason; ``NO_ANSWER`` when it
    does not answer in time (that says nothing about it)."""
    try:
        async with asyncio.timeout(limit_seconds), session.get(url) as response:
            if response.status == 200:
                return None
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return NO_ANSWER
    error = body.get("error") if isinstance(body, dict) else None
    return str(error) if error else None


def new_scrape_session(connections: int = 256) -> aiohttp.ClientSession:
    """A session suited to scraping: bounded connections, keep-alive, no cookies, no proxy
    from the environment (pod addresses are cluster-internal)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )
