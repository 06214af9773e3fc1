"""The signal shell without the sandbox: the runtime's real exposition, real HTTP servers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from tidal.operator.core.signals import PodMissing, PodScrape, PodTarget, PoolKey
from tidal.operator.shell.podmetrics import (
    MetricsFormatError,
    new_scrape_session,
    parse_pod_metrics,
    scrape_pods,
)
from tidal.operator.shell.signals import PrometheusSignals, SignalCollector
from tidal.runtime.metrics import RuntimeMetrics


def runtime_exposition() -> str:
    """What a runtime with two models, some traffic and errors exposes."""
    m = RuntimeMetrics()
    for model in ("a", "b"):
        for cache in ("hot", "cold"):
            for code in ("200", "500", "503"):
                m.request_duration.labels(model, cache, code).observe(0.01)
                m.requests.labels(model, code).inc(2)
        m.engine_load.labels(model, "fetch").observe(0.25)
        m.engine_load.labels(model, "warmup").observe(0.5)
        m.cache_hits.labels(model).inc(7)
    m.cache_misses.labels("a").inc(1)
    m.queue_depth.labels("a").set(3)
    m.queue_depth.labels("b").set(1)
    m.inflight.set(6)
    m.model_ready.labels("a").set(1)
    m.model_ready.labels("b").set(0)
    m.startup_seconds.set(4.5)
    m.gpu_memory.labels("budget").set(1e9)
    return generate_latest(m.registry).decode()


def test_parse_the_runtimes_exposition() -> None:
    scrape = parse_pod_metrics(runtime_exposition(), "p", at=12.5)
    assert scrape == PodScrape(
        pod="p",
        at=12.5,
        in_flight=6,
        queued=4,
        answered=24,  # 2 models x 2 caches x 3 codes x 2
        failed=16,  # the 500s and 503s
        models_ready=1,
        models=2,
        cache_hits=14,
        cache_misses=1,
        startup_seconds=4.5,
        engine_load_seconds=1.5,
        gpu_memory_used_bytes=None,  # CPU backend: only the budget is exposed
        gpu_memory_total_bytes=None,
        load_phases=(("fetch", 0.5), ("warmup", 1.0)),  # summed over both models
    )


def test_parse_the_runtimes_batch_work_and_deadlines() -> None:
    from tidal.operator.core.autoscaler import BatchWork

    m = RuntimeMetrics()
    m.inflight.set(5)
    for model, rows, seconds, slots, timeout in (("a", 8, 0.1, 1, 2.0), ("b", 2, 0.05, 2, 0.0)):
        m.backend_batches.labels(model).inc(2)
        m.backend_rows.labels(model).inc(2 * rows)
        m.backend_requests.labels(model).inc(2 * rows)
        m.backend_seconds.labels(model).inc(2 * seconds)
        m.backend_row_seconds.labels(model).inc(2 * rows * seconds)
        m.backend_rows_squared.labels(model).inc(2 * rows * rows)
        m.backend_slots.labels(model).set(slots)
        m.max_batch_rows.labels(model).set(rows)
        m.request_timeout.labels(model).set(timeout)
        m.queue_reachable.labels(model).set(1)
    scrape = parse_pod_metrics(generate_latest(m.registry).decode(), "p", at=1.0)
    assert scrape.work is not None
    want = BatchWork(
        batches=4, rows=20, requests=20, seconds=0.3, row_seconds=1.8, rows_squared=136
    )
    for name in ("batches", "rows", "requests", "seconds", "row_seconds", "rows_squared"):
        assert getattr(scrape.work, name) == pytest.approx(getattr(want, name)), name
    assert (scrape.slots, scrape.max_batch_rows) == (2, 8)
    assert scrape.reachable == 2 and scrape.request_timeout_seconds == 2.0


def test_a_fresh_runtime_has_no_startup_time_yet() -> None:
    m = RuntimeMetrics()
    scrape = parse_pod_metrics(generate_latest(m.registry).decode(), "p", at=0.0)
    assert scrape.in_flight == 0 and scrape.answered == 0
    assert scrape.startup_seconds is None and scrape.engine_load_seconds is None


@pytest.mark.parametrize("text", ["", "some_other_metric 1\n", "tidal_inflight_requests{ 1\n"])
def test_text_without_the_runtimes_gauge_is_an_error(text: str) -> None:
    with pytest.raises(MetricsFormatError):
        parse_pod_metrics(text, "p", at=0.0)


@pytest.fixture
async def pods() -> AsyncIterator[dict[str, str]]:
    """Four real HTTP servers: a runtime, a slow one, a failing one, one answering garbage."""
    release = asyncio.Event()

    async def good(_: web.Request) -> web.Response:
        return web.Response(text=runtime_exposition())

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text=runtime_exposition())

    async def failing(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html>not metrics</html>")

    runners, addresses = [], {}
    for name, handler in (
        ("good", good),
        ("slow", slow),
        ("failing", failing),
        ("garbage", garbage),
    ):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        addresses[name] = f"127.0.0.1:{port}"
        runners.append(runner)
    yield addresses
    release.set()
    for runner in runners:
        await runner.cleanup()


async def test_scrape_round_reports_each_failure_as_missing(pods: dict[str, str]) -> None:
    targets = [PodTarget(name, address) for name, address in pods.items()]
    targets.append(PodTarget("refused", "127.0.0.1:9"))
    loop = asyncio.get_running_loop()
    async with new_scrape_session() as session:
        t0 = loop.time()
        results = {r.pod: r for r in await scrape_pods(session, targets, scrape_timeout=0.3)}
        took = loop.time() - t0
    assert isinstance(results["good"], PodScrape) and results["good"].in_flight == 6
    errors = {n: r.error for n, r in results.items() if isinstance(r, PodMissing)}
    assert set(errors) == {"slow", "failing", "garbage", "refused"}
    assert errors["slow"].startswith("timeout") and errors["failing"] == "HTTP 500"
    assert "MetricsFormatError" in errors["garbage"]
    # Concurrent: the round is bounded by one timeout, not the sum of them.
    assert took < 0.3 + 0.4


class BlockingClient:
    """A stand-in for InstantQueries whose answer waits for the test (threads, not sleeps)."""

    def __init__(self) -> None:
        self.calls = 0
        self.go = threading.Event()

    def custom_query(self, query: str, params: dict[str, Any], timeout: float) -> list[Any]:
        self.calls += 1
        self.go.wait(5)
        metric = {"namespace": "ns", "isvc": "s", "pool": "primary", "signal": "in_flight"}
        return [{"metric": metric, "value": [0, "3"]}]


async def test_one_round_serves_many_pools_and_never_blocks_a_tick() -> None:
    client = BlockingClient()
    now = [100.0]
    prom = PrometheusSignals("http://unused", client=client, min_interval=1.0, clock=lambda: now[0])
    # Three pools ask in the same tick while Prometheus is slow: one query, nobody waits long.
    answers = await asyncio.gather(*(prom.latest(wait=0.05) for _ in range(3)))
    assert answers == [None, None, None] and client.calls == 1
    client.go.set()
    await asyncio.wait_for(prom._task, 5)  # type: ignore[arg-type]
    round_ = await prom.latest(wait=0.05)
    assert round_ is not None and client.calls == 1
    pool = round_.pool(PoolKey("ns", "s", "primary"))
    assert pool is not None and pool.in_flight == 3
    # Within min_interval the round is reused; after it a new one starts.
    now[0] += 0.5
    assert await prom.latest(wait=1.0) is round_ and client.calls == 1
    now[0] += 1.0
    fresh = await prom.latest(wait=5.0)
    assert fresh is not None and fresh is not round_ and client.calls == 2
    await prom.close()


async def test_a_pod_that_keeps_failing_is_scraped_less_often_and_reads_as_missing() -> None:
    hits = {"good": 0, "bad": 0}

    def handler(name: str, status: int) -> Any:
        async def answer(_: web.Request) -> web.Response:
            hits[name] += 1
            text = runtime_exposition() if status == 200 else "down"
            return web.Response(status=status, text=text)

        return answer

    app = web.Application()
    app.router.add_get("/good/metrics", handler("good", 200))
    app.router.add_get("/bad/metrics", handler("bad", 500))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def runtime_pod(name: str) -> dict[str, Any]:
        annotations = {"prometheus.io/port": str(port), "prometheus.io/path": f"/{name}/metrics"}
        return {
            "metadata": {"name": name, "annotations": annotations},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }

    now = [0.0]
    key = PoolKey("ns", "svc", "primary")
    pods = [runtime_pod("good"), runtime_pod("bad")]
    try:
        # A generous scrape timeout: on a loaded 2-core machine the good pod's answer took
        # longer than the default 0.3 s and read as missing (a test of the back-off, not speed).
        async with SignalCollector(None, scrape_timeout=10.0, clock=lambda: now[0]) as collector:
            errors = []
            for _ in range(6):  # ticks at 0..5 s: the bad pod is asked at 0, 1, 2 and 4
                reading = await collector.observe_pool(key, pods)
                errors.append(reading.scrapes["bad"].error)  # type: ignore[union-attr]
                assert isinstance(reading.scrapes["good"], PodScrape)
                now[0] += 1.0
    finally:
        await runner.cleanup()
    assert hits == {"good": 6, "bad": 4}, hits
    assert errors[0] == "HTTP 500" and errors[3] == "HTTP 500 (missed 3 in a row; backing off)"
