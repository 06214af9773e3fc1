"""Prometheus metrics of the runtime: the names the operator reads are the contract's
(:mod:`tidal.common.contract`, DESIGN.md §3), each metric one row of :data:`DEFINITIONS`.

Every metric is documented in runtime/README.md ("Metrics reference").  Each server owns its
own registry so that several servers can live in one test process.

:class:`ModelStats` holds the per-model figures of the statistics extension
(``GET /v2/models/{m}/stats``, Triton's JSON shape): plain counters updated on the event loop,
a few integer additions per request and per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from ..common import contract

# The *_created series double the exposition size and nothing reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Fine enough for millisecond-level P99 on the hot path, wide enough for cold requests.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
)  # fmt: skip
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# A transfer wait is milliseconds on a pinned PCIe path, minutes for a large engine on a bad one.
TRANSFER_BUCKETS = (*LATENCY_BUCKETS, 15.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


Kind = type[Counter] | type[Gauge] | type[Histogram]
# Every metric: (attribute of RuntimeMetrics, kind, name, labels, help, histogram buckets).
DEFINITIONS: tuple[tuple[str, Kind, str, tuple[str, ...], str, tuple[float, ...]], ...] = (
    ("queue_depth", Gauge, contract.METRIC_QUEUE_DEPTH, ("model",),
     "Requests queued in the dynamic batcher and not yet sent to the backend (exact).", ()),
    ("inflight", Gauge, contract.METRIC_INFLIGHT_REQUESTS, (),
     "Infer requests received and not yet answered (queued, loading or executing).", ()),
    ("request_duration", Histogram, contract.METRIC_REQUEST_DURATION_SECONDS,
     ("model", "cache", "code"),
     "Infer request latency, arrival to response; cache=cold when it waited for a load.",
     LATENCY_BUCKETS),
    ("requests", Counter, contract.METRIC_REQUESTS, ("model", "code"),
     "Infer requests answered, by HTTP status code.", ()),
    ("engine_load", Histogram, contract.METRIC_ENGINE_LOAD_SECONDS, ("model", "phase"),
     "Duration of each engine load phase: fetch, deserialize, warmup.", LOAD_BUCKETS),
    ("cold_start", Histogram, contract.METRIC_COLD_START_SECONDS, ("model",),
     "Latency of the first request served by an engine it had to wait to load.", LOAD_BUCKETS),
    ("transfer_wait", Histogram, contract.METRIC_TRANSFER_WAIT_SECONDS, ("model",),
     "Time a request waited on host->device weight transfer (the stage and h2d phases of the "
     "engine load it waited for).", TRANSFER_BUCKETS),
    ("cache_hits", Counter, contract.METRIC_ENGINE_CACHE_HITS, ("model",),
     "Requests whose engine was resident.", ()),
    ("cache_misses", Counter, contract.METRIC_ENGINE_CACHE_MISSES, ("model",),
     "Requests whose engine was not resident (they waited for a load).", ()),
    ("cache_evictions", Counter, "tidal_engine_cache_evictions", ("model",),
     "Engines evicted from the device to make room.", ()),
    ("cache_bytes", Gauge, "tidal_engine_cache_bytes", ("tier",),
     "Bytes held by the engine cache: tier=gpu the device hot set, tier=host local files.", ()),
    ("gpu_memory", Gauge, contract.METRIC_GPU_MEMORY_BYTES, ("kind",),
     "Device memory: total, used (whole device), budget (engine cache budget).", ()),
    ("batch_size", Histogram, "tidal_batch_size", ("model",),
     "Rows in each batch sent to the backend.", BATCH_BUCKETS),
    # What a batch costs, for the operator's capacity estimate (operator/SIGNALS.md,
    # "Capacity"): counted when a batch completes, so that every counter of one batch moves
    # together. Rows x seconds and rows squared let a reader fit batch time = a + b x rows by
    # least squares over any window of increases.
    ("backend_batches", Counter, contract.METRIC_BACKEND_BATCHES, ("model",),
     "Batches the backend completed.", ()),
    ("backend_rows", Counter, contract.METRIC_BACKEND_ROWS, ("model",),
     "Rows of the batches the backend completed.", ()),
    ("backend_requests", Counter, contract.METRIC_BACKEND_REQUESTS, ("model",),
     "Requests of the batches the backend completed.", ()),
    ("backend_seconds", Counter, contract.METRIC_BACKEND_SECONDS, ("model",),
     "Seconds batches held an execution slot (busy time, summed over concurrent batches).", ()),
    ("backend_row_seconds", Counter, contract.METRIC_BACKEND_ROW_SECONDS, ("model",),
     "Sum over completed batches of rows x seconds.", ()),
    ("backend_rows_squared", Counter, contract.METRIC_BACKEND_ROWS_SQUARED, ("model",),
     "Sum over completed batches of rows squared.", ()),
    ("backend_slots", Gauge, contract.METRIC_BACKEND_SLOTS, ("model",),
     "Batches of the model that may execute at once.", ()),
    ("max_batch_rows", Gauge, contract.METRIC_MAX_BATCH_ROWS, ("model",),
     "The model's maxBatchSize, in rows.", ()),
    ("queue_reachable", Gauge, contract.METRIC_QUEUE_REACHABLE, ("model",),
     "Queued requests that can still be served before their deadline at the recent batch time "
     "(all queued requests when they have no deadline).", ()),
    ("request_timeout", Gauge, contract.METRIC_REQUEST_TIMEOUT_SECONDS, ("model",),
     "The model's per-request deadline from arrival (batching.timeoutMs); 0: none.", ()),
    ("model_ready", Gauge, contract.METRIC_MODEL_READY, ("model",),
     "1 when the model's engine is resident and warm.", ()),
    ("startup_seconds", Gauge, contract.METRIC_STARTUP_SECONDS, (),
     "Seconds from the server's start (after the interpreter and its imports) until "
     "/v2/health/ready turned true.", ()),
)  # fmt: skip


class RuntimeMetrics:
    """Every metric of :data:`DEFINITIONS`, as an attribute, in the server's own registry."""

    queue_depth: Gauge
    inflight: Gauge
    request_duration: Histogram
    requests: Counter
    engine_load: Histogram
    cold_start: Histogram
    transfer_wait: Histogram
    cache_hits: Counter
    cache_misses: Counter
    cache_evictions: Counter
    cache_bytes: Gauge
    gpu_memory: Gauge
    batch_size: Histogram
    backend_batches: Counter
    backend_rows: Counter
    backend_requests: Counter
    backend_seconds: Counter
    backend_row_seconds: Counter
    backend_rows_squared: Counter
    backend_slots: Gauge
    max_batch_rows: Gauge
    queue_reachable: Gauge
    request_timeout: Gauge
    model_ready: Gauge
    startup_seconds: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for attribute, kind, name, labels, text, buckets in DEFINITIONS:
            extra: dict[str, Any] = {"buckets": buckets} if buckets else {}
            metric = kind(name, text, labels, registry=self.registry, **extra)
            setattr(self, attribute, metric)
        self.stats: dict[str, ModelStats] = {}  # the statistics extension, by model
        self._request_series: dict[str, RequestSeries] = {}

    def stats_for(self, model: str) -> ModelStats:
        stats = self.stats.get(model)
        if stats is None:
            stats = self.stats[model] = ModelStats()
        return stats

    def request_series(self, model: str) -> RequestSeries:
        """The per-request series of one model, their labelled children looked up once."""
        series = self._request_series.get(model)
        if series is None:
            series = self._request_series[model] = RequestSeries(self, model)
        return series


class RequestSeries:
    """One model's per-request metrics: ``tidal_request_duration_seconds``, ``tidal_requests``
    and the statistics extension's figures.

    prometheus_client's ``labels()`` takes a lock, checks and joins the label values on every
    call; the few children a model uses (one per cache state and status code) are kept here.
    """

    def __init__(self, metrics: RuntimeMetrics, model: str) -> None:
        self._metrics = metrics
        self.model = model
        self.stats = metrics.stats_for(model)
        self._durations: dict[tuple[bool, int], Any] = {}
        self._counts: dict[int, Any] = {}

    def observe(self, cold: bool, code: int, seconds: float) -> None:
        """One answered request: its latency under (cache state, code), counted under code."""
        duration = self._durations.get((cold, code))
        if duration is None:
            duration = self._durations[cold, code] = self._metrics.request_duration.labels(
                self.model, "cold" if cold else "hot", str(code)
            )
        duration.observe(seconds)
        count = self._counts.get(code)
        if count is None:
            count = self._counts[code] = self._metrics.requests.labels(self.model, str(code))
        count.inc()


@dataclass
class DurationStat:
    """A count and a cumulative duration, Triton's ``$duration_stat``."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9) * count

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStat:
    compute_input: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    compute_output: DurationStat = field(default_factory=DurationStat)


@dataclass
class ModelStats:
    """One model's statistics since start, in the terms of Triton's statistics extension.

    Per request: ``success``/``fail`` (arrival to answer), ``queue`` (arrival to its batch
    starting), ``compute_*`` (its batch's merge, execution and split). Per batch:
    ``execution_count``, ``inference_count`` (rows) and ``batch_stats`` by batch size.
    ``last_inference`` is wall time (ms since the epoch) of the last answered request.
    """

    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: DurationStat = field(default_factory=DurationStat)
    fail: DurationStat = field(default_factory=DurationStat)
    queue: DurationStat = field(default_factory=DurationStat)
    compute_input: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    compute_output: DurationStat = field(default_factory=DurationStat)
    batches: dict[int, BatchStat] = field(default_factory=dict)

    def record_batch(
        self, rows: int, requests: int, merge_s: float, infer_s: float, split_s: float
    ) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.compute_input.add(merge_s, requests)
        self.compute_infer.add(infer_s, requests)
        self.compute_output.add(split_s, requests)
        batch = self.batches.get(rows)
        if batch is None:
            batch = self.batches[rows] = BatchStat()
        batch.compute_input.add(merge_s)
        batch.compute_infer.add(infer_s)
        batch.compute_output.add(split_s)

    def as_json(self, name: str, version: str) -> dict[str, Any]:
        zero = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": dict(zero),  # no response cache
                "cache_miss": dict(zero),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": batch.compute_input.as_json(),
                    "compute_infer": batch.compute_infer.as_json(),
                    "compute_output": batch.compute_output.as_json(),
                }
                for size, batch in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
