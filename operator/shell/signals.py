"""Signals of every pool for the autoscaler and the SLO evaluator: Prometheus plus direct scrapes.

Owns the I/O of observing a pool; the arithmetic is pure, in `tidal.operator.core.signals`.

* `PrometheusSignals` runs **one** PromQL expression per tick for all InferenceServices at once
  (`core.signals.pool_signals_query`, grouped ``by (namespace, isvc, pool)``) through
  `InstantQueries`, Prometheus's HTTP API with the standard library. The client is synchronous
  (urllib), so each round runs in a worker thread (`asyncio.to_thread`) and the event loop
  never blocks; one
  round at a time (single flight), and a round younger than `min_interval` is reused, so N
  pools observed in one tick cost one query, not N.
* `SignalCollector.observe_pool` is the one call per pool per tick: it scrapes the pool's pods
  (`podmetrics.scrape_pods`, ~300 ms timeout) while the shared Prometheus round runs, keeps the
  per-pool rate memory, and returns a `PoolReading` with the autoscaler's `Observation`, the
  SLO evaluator's `PoolSignals` and the notes explaining missing or stale signals.

Failures never raise out of a round: an unreachable Prometheus gives an empty round with an
`error`, an unreachable pod a `PodMissing`; the merge turns both into None (hold), never zero.
Queries, windows and freshness rules are documented in ``operator/SIGNALS.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ...common.clock import CLOCK
from ..core.signals import (
    DEFAULT_COLD_WINDOW,
    DEFAULT_LATENCY_WINDOW,
    DEFAULT_RATE_WINDOW,
    FastPoolSignals,
    ObservedPool,
    PodCounts,
    PodScrape,
    PoolKey,
    PromPoolSignals,
    RateMemory,
    ScrapeBackoff,
    ScrapeResult,
    advance_backoff,
    count_pods,
    fold_scrapes,
    measured_warmup_seconds,
    observation_from_signals,
    parse_pool_signals,
    plan_scrapes,
    pod_ready,
    pool_signals_from_prometheus,
    pool_signals_query,
    scrape_targets,
)
from ..core.slo import PoolSignals
from . import metrics
from .podmetrics import (
    DEFAULT_SCRAPE_TIMEOUT,
    new_scrape_session,
    scrape_pods,
)

log = logging.getLogger("tidal.operator.signals")

__all__ = [
    "InstantQueries",
    "PoolReading",
    "PrometheusQueryError",
    "PrometheusRound",
    "PrometheusSignals",
    "SignalCollector",
]


@dataclass(frozen=True)
class PrometheusRound:
    """One answer of Prometheus for all pools. `pools` is empty when `error` is set."""

    queried_at: float
    duration_seconds: float
    pools: Mapping[PoolKey, PromPoolSignals] = field(default_factory=dict)
    error: str | None = None

    def pool(self, key: PoolKey) -> PromPoolSignals | None:
        return self.pools.get(key)


class PrometheusQueryError(RuntimeError):
    """Prometheus answered an instant query with an error (HTTP status or ``status: error``)."""


class InstantQueries:
    """Prometheus's instant-query API (``POST /api/v1/query``) over plain HTTP: one request per
    call, no retries (the next tick is the retry). The operator's only Prometheus client: a
    client library brought pandas and numpy into the operator's image for this one call."""

    def __init__(self, url: str) -> None:
        self.endpoint = url.rstrip("/") + "/api/v1/query"

    def custom_query(
        self, query: str, params: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> list[Any]:
        """The ``data.result`` of an instant query (a vector: metric labels and value each)."""
        form = urllib.parse.urlencode({"query": query, **(params or {})}).encode()
        request = urllib.request.Request(
            self.endpoint,
            data=form,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode(errors="replace")
            raise PrometheusQueryError(f"HTTP {exc.code} from {self.endpoint}: {detail}") from None
        if body.get("status") != "success":
            raise PrometheusQueryError(f"{body.get('errorType')}: {body.get('error')}")
        return list(body["data"]["result"])


class PrometheusSignals:
    """All pools' latency and load signals from Prometheus, one query per round.

    `matchers` narrows every selector (e.g. ``namespace=~"team-a|team-b"``); windows are PromQL
    durations. `at` (query) evaluates at another Prometheus time (tests, replays).
    """

    def __init__(
        self,
        url: str,
        *,
        matchers: str = "",
        timeout: float = 2.0,
        min_interval: float = 1.0,
        latency_window: str = DEFAULT_LATENCY_WINDOW,
        cold_window: str = DEFAULT_COLD_WINDOW,
        rate_window: str = DEFAULT_RATE_WINDOW,
        clock: Callable[[], float] = CLOCK.monotonic,
        client: InstantQueries | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.min_interval = min_interval
        self.clock = clock
        self.query_text = pool_signals_query(
            matchers,
            latency_window=latency_window,
            cold_window=cold_window,
            rate_window=rate_window,
        )
        # No retries inside a round: the next tick is the retry (a client library's default
        # retries with back-off once turned one refused connection into a 6 s round).
        self._client = client or InstantQueries(url)
        self._lock = asyncio.Lock()
        self._last: PrometheusRound | None = None
        self._task: asyncio.Task[None] | None = None

    async def query(self, at: float | None = None) -> PrometheusRound:
        """Run one round now (serialised with other rounds: the client is not shared across
        threads)."""
        async with self._lock:
            return await self._query(at)

    async def latest(self, wait: float | None = None) -> PrometheusRound | None:
        """The most recent round, refreshed in the background.

        Starts a round when the last one is older than `min_interval` and none is running (so
        N pools observed in one tick share one query), then waits for it at most `wait` seconds
        (default: the query timeout). A slow Prometheus therefore never delays a tick by more
        than `wait`: the caller gets the previous round, whose age says how old it is. None
        before the first round has completed.
        """
        if self._task is None or self._task.done():
            last = self._last
            if last is None or self.clock() - last.queried_at >= self.min_interval:
                self._task = asyncio.create_task(self._refresh())
        task = self._task
        if task is not None and not task.done():
            budget = self.timeout + 0.5 if wait is None else wait
            await asyncio.wait([task], timeout=budget)
        return self._last

    async def _refresh(self) -> None:
        self._last = await self.query()

    async def close(self) -> None:
        """Cancel a round still running (its thread finishes on its own, within the timeout)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _query(self, at: float | None) -> PrometheusRound:
        params: dict[str, Any] = {"timeout": f"{self.timeout:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        started = self.clock()
        try:
            result = await asyncio.to_thread(
                self._client.custom_query, self.query_text, params, self.timeout
            )
        except Exception as exc:  # requests/HTTP/JSON errors alike: the round has no data
            duration = self.clock() - started
            # Messages can carry the whole (long) query URL: keep the head.
            error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("Prometheus query failed after %.2fs: %s", duration, error)
            return PrometheusRound(started, duration, error=error)
        duration = self.clock() - started
        return PrometheusRound(started, duration, parse_pool_signals(result, started))


@dataclass(frozen=True)
class PoolReading:
    """Everything observed of one pool in one tick.

    `observed.observation` goes to `autoscaler.decide_scale`, `slo` to `slo.evaluate_slo`;
    `observed.notes` explain held or missing signals (for a condition message); `scrapes` give
    per-pod in-flight and cache state (`core.signals.pod_views`).
    """

    key: PoolKey
    counts: PodCounts
    fast: FastPoolSignals
    prom: PromPoolSignals | None
    prometheus_error: str | None
    observed: ObservedPool
    slo: PoolSignals
    scrapes: Mapping[str, ScrapeResult]

    @property
    def pod_scrapes(self) -> dict[str, PodScrape]:
        return {k: v for k, v in self.scrapes.items() if isinstance(v, PodScrape)}


class SignalCollector:
    """Observes pools tick by tick: pod scrapes + the shared Prometheus round, merged.

    Keeps one `RateMemory` per pool (bounded by the pool's pods); call `forget` when an
    InferenceService is deleted. Use as an async context manager or call `close`.
    """

    def __init__(
        self,
        prometheus: PrometheusSignals | None,
        *,
        scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT,
        max_age_seconds: float = 5.0,
        clock: Callable[[], float] = CLOCK.monotonic,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.prometheus = prometheus
        self.scrape_timeout = scrape_timeout
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self._session = session
        self._owns_session = session is None
        self._memory: dict[PoolKey, RateMemory] = {}
        self._backoff: dict[PoolKey, ScrapeBackoff] = {}

    async def __aenter__(self) -> SignalCollector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.prometheus is not None:
            await self.prometheus.close()
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def forget(self, key: PoolKey) -> None:
        self._memory.pop(key, None)
        self._backoff.pop(key, None)

    async def observe_pool(self, key: PoolKey, pods: Sequence[Mapping[str, Any]]) -> PoolReading:
        """Observe one pool from its current pod objects (plain dicts, as the API returns them;
        the caller selects the pool's pods, e.g. by ``serving.tidal.dev/{isvc,pool}``)."""
        if self._session is None:
            self._session = new_scrape_session()
        counts = count_pods(pods)
        targets = scrape_targets(pods)
        backoff = self._backoff.get(key, ScrapeBackoff())
        ready = {str((p.get("metadata") or {}).get("name", "")) for p in pods if pod_ready(p)}
        asked, skipped = plan_scrapes(targets, backoff, self.clock(), ready)
        scrape = scrape_pods(
            self._session, asked, scrape_timeout=self.scrape_timeout, clock=self.clock
        )
        if self.prometheus is not None:
            # The Prometheus round may take at most as long as the scrapes; a slower one is
            # used by a later tick (its age tells the merge how old it is).
            latest = self.prometheus.latest(wait=self.scrape_timeout)
            results, prom_round = await asyncio.gather(scrape, latest)
        else:
            results, prom_round = await scrape, None
        self._backoff[key] = advance_backoff(backoff, results, targets, ready)
        if skipped:
            metrics.SCRAPES_SKIPPED.inc(len(skipped))
        results = [*results, *skipped]
        fast, memory = fold_scrapes(results, self._memory.get(key, RateMemory()), counts.serving)
        self._memory[key] = memory
        prom = prom_round.pool(key) if prom_round is not None else None
        observed = observation_from_signals(
            self.clock(),
            counts,
            fast,
            prom,
            warmup_seconds=measured_warmup_seconds(pods),
            max_age_seconds=self.max_age_seconds,
            prometheus_error=prom_round.error if prom_round is not None else None,
        )
        return PoolReading(
            key=key,
            counts=counts,
            fast=fast,
            prom=prom,
            prometheus_error=(
                prom_round.error if prom_round is not None else "no Prometheus round yet"
            ),
            observed=observed,
            slo=pool_signals_from_prometheus(prom),
            scrapes={r.pod: r for r in results},
        )
