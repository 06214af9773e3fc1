"""The signal paths against real parts: runtime pods on the sandbox, its Prometheus, real HTTP.

Runtime pods run from a plain Deployment (no operator): the same labels, annotations and
readiness probe the operator gives them. Requests go straight to the pods' addresses. Freshness
figures (time from a load change to a signal showing it) are printed with ``-s`` and recorded in
operator/SIGNALS.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from kubernetes import client

from tidal.operator.core.signals import (
    PodMissing,
    PodScrape,
    PoolKey,
    RateMemory,
    count_pods,
    fold_scrapes,
    observation_from_signals,
    pool_signals_from_prometheus,
    scrape_targets,
)
from tidal.operator.core.slo import Signal, SignalStatus, SloPolicy, SloState, evaluate_slo
from tidal.operator.shell.podmetrics import new_scrape_session, scrape_pods
from tidal.operator.shell.signals import PrometheusSignals, SignalCollector
from tidal.runtime.modelgen import ModelInfo, write_mlp
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox

ISVC = "sig"


# -- helpers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return write_mlp(tmp_path_factory.mktemp("models") / "mlp.onnx", hidden=32)


def runtime_config(model: ModelInfo, added_latency_ms: float = 0.0) -> dict[str, Any]:
    engine = {"uri": model.uri, "sha256": model.sha256}
    return {
        "backend": "onnxruntime",
        "models": [
            {
                "name": "mlp",
                "engines": [engine],
                "maxBatchSize": 8,
                "warmup": {"batchSizes": [1], "iterations": 1},
            },
            # Loaded by its first request: that request is a cold start.
            {"name": "lazy", "engines": [engine], "maxBatchSize": 8, "preload": False},
        ],
        "onnxruntime": {"intraOpThreads": 1},
        "faults": {"addedLatencyMs": added_latency_ms},
    }


def runtime_deployment(
    name: str, pool: str, replicas: int, config: dict[str, Any]
) -> dict[str, Any]:
    labels = {
        "serving.tidal.dev/isvc": ISVC,
        "serving.tidal.dev/pool": pool,
        "serving.tidal.dev/role": "serving",
    }
    container = {
        "name": "runtime",
        "image": "tidal.dev/runtime:sandbox",
        "command": ["tidal-runtime"],
        "env": [
            {"name": "TIDAL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "TIDAL_PORT", "value": "8080"},
            {"name": "TIDAL_LOG_LEVEL", "value": "WARNING"},
            {"name": "TIDAL_RUNTIME_CONFIG_JSON", "value": json.dumps(config)},
        ],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": 8080},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
    }
    selector = {"serving.tidal.dev/isvc": ISVC, "serving.tidal.dev/pool": pool}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8080",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }


def pool_pods(sandbox: Any, namespace: str, pool: str) -> list[dict[str, Any]]:
    api = sandbox.api_client()
    selector = f"serving.tidal.dev/isvc={ISVC},serving.tidal.dev/pool={pool}"
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    return [api.sanitize_for_serialization(p) for p in pods]


def start_pool(
    sandbox: Any, namespace: str, pool: str, replicas: int, config: dict[str, Any]
) -> list[dict[str, Any]]:
    doc = runtime_deployment(f"{ISVC}-{pool}", pool, replicas, config)
    sandbox.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(doc))
    return wait_for(
        lambda: (
            (pods := pool_pods(sandbox, namespace, pool))
            and count_pods(pods).ready_serving == replicas
            and pods
        ),
        timeout=120,
        interval=0.5,
        what=f"{replicas} ready runtime pods",
    )


def pod_url(pod: dict[str, Any]) -> str:
    return f"http://{pod['status']['podIP']}:8080"


def pod_pid(pod: dict[str, Any]) -> int:
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    return int(container_id.rsplit("/", 1)[-1])


INPUT = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


async def infer(session: aiohttp.ClientSession, base: str, model: str = "mlp") -> int:
    async with session.post(f"{base}/v2/models/{model}/infer", json=INPUT) as response:
        await response.read()
        return response.status


async def send(session: aiohttp.ClientSession, bases: list[str], n: int, rate: float) -> None:
    """`n` requests spread over the pods at about `rate` per second, all awaited."""
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(infer(session, bases[i % len(bases)])))
        await asyncio.sleep(1.0 / rate)
    codes = await asyncio.gather(*tasks)
    assert codes == [200] * n


async def poll(fn: Any, what: str, within: float = 30.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture
def prometheus(sandbox: Any, namespace: str) -> PrometheusSignals:
    # min_interval=0: every call is a fresh round, for measuring.
    return PrometheusSignals(
        sandbox.prometheus_url, matchers=f'namespace="{namespace}"', min_interval=0.0
    )


@pytest.fixture
def stopped_pids() -> Iterator[list[int]]:
    """Processes a test stopped with SIGSTOP, resumed whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# -- tests ----------------------------------------------------------------------------------


async def test_signals_see_requests_latency_cold_starts_and_warmup(
    sandbox: Any, namespace: str, model: ModelInfo, prometheus: PrometheusSignals
) -> None:
    pods = start_pool(sandbox, namespace, "primary", 2, runtime_config(model, added_latency_ms=20))
    key = PoolKey(namespace, ISVC, "primary")
    bases = [pod_url(p) for p in pods]
    async with new_scrape_session() as session, SignalCollector(prometheus) as collector:
        # One request per pod and model first: Prometheus' increase() cannot count the samples
        # that create a series, so the measured batch must come after the series exist.
        for base in bases:
            assert await infer(session, base) == 200
        assert await infer(session, bases[0], "lazy") == 200  # the cold start
        await poll(lambda: _has_pool(prometheus, key), "the pool in Prometheus")
        await asyncio.sleep(2.5)  # two scrapes past the priming requests
        before = await collector.observe_pool(key, pods)
        n = 120
        await send(session, bases, n, rate=60.0)
        after = await collector.observe_pool(key, pods)

        # Fast path: exact counts; each pod's rate = its arrivals / time between its scrapes.
        deltas = {
            p: (s.answered - before.pod_scrapes[p].answered, s.at - before.pod_scrapes[p].at)
            for p, s in after.pod_scrapes.items()
        }
        assert sum(d for d, _ in deltas.values()) == n
        expected_rate = sum(d / t for d, t in deltas.values())
        assert after.fast.arrival_rate == pytest.approx(expected_rate, rel=1e-9)
        assert after.fast.in_flight == 0 and after.fast.missing == ()

        # Prometheus: wait until the last scrape holds every request, then check the window.
        reading = await poll(
            lambda: _reading_with(collector, key, pods, lambda r: (r.prom.requests or 0) >= n),
            "Prometheus to count the requests",
            within=10,
            interval=0.25,
        )
        round_seconds = (await prometheus.query()).duration_seconds
    prom = reading.prom
    assert prom is not None and prom.pods_reporting == 2
    # increase() extrapolates to the window's edges; the batch (~2 s) sits well inside 30 s.
    assert n <= prom.requests <= n * 1.15 + 5
    assert prom.errors is None and prom.error_rate == 0.0
    assert prom.p99_hot_ms is not None and 20.0 <= prom.p99_hot_ms <= 300.0, prom.p99_hot_ms
    assert prom.p99_cold_ms is not None and prom.p99_cold_ms > 0
    assert prom.cold_samples is not None and prom.cold_samples >= 1
    assert prom.cold_start_ms is not None and prom.cold_start_ms > 0
    assert prom.startup_seconds is not None and prom.startup_seconds > 0
    assert prom.engine_load_seconds is not None and prom.engine_load_seconds > 0
    # The CPU backend reports no device memory: absent, not zero.
    assert prom.gpu_memory_used_bytes is None and prom.gpu_memory_total_bytes is None
    assert prom.age_seconds is not None and prom.age_seconds < 3.0

    obs = reading.observed.observation
    assert (obs.ready_serving, obs.warming, obs.ready_standby) == (2, 0, 0)
    assert obs.hot_p99_ms == prom.p99_hot_ms and obs.queue_depth == 0
    assert reading.observed.queue_source == "pods"
    assert obs.metrics_age_seconds is not None and obs.metrics_age_seconds < 3.0
    assert obs.warmup_seconds is not None and 0 <= obs.warmup_seconds < 60
    slo = reading.slo
    assert slo.p99_hot_ms == prom.p99_hot_ms and slo.error_rate == 0.0
    assert slo.requests is not None and slo.requests >= n
    print(
        f"\nsignals: requests={prom.requests:.1f} (sent {n}) p99_hot={prom.p99_hot_ms:.1f}ms "
        f"p99_cold={prom.p99_cold_ms:.1f}ms cold_start={prom.cold_start_ms:.0f}ms "
        f"startup={prom.startup_seconds:.2f}s load={prom.engine_load_seconds:.3f}s "
        f"warmup(pods)={obs.warmup_seconds}s prometheus round={round_seconds:.3f}s"
    )


async def _has_pool(prometheus: PrometheusSignals, key: PoolKey) -> bool:
    return (await prometheus.query()).pool(key) is not None


async def _reading_with(
    collector: SignalCollector, key: PoolKey, pods: list[dict[str, Any]], check: Any
) -> Any:
    reading = await collector.observe_pool(key, pods)
    return reading if reading.prom is not None and check(reading) else None


async def test_queue_depth_is_exact_while_requests_are_held_and_freshness(
    sandbox: Any, namespace: str, model: ModelInfo, prometheus: PrometheusSignals
) -> None:
    hold_ms = 4000
    pods = start_pool(sandbox, namespace, "primary", 2, runtime_config(model, hold_ms))
    key = PoolKey(namespace, ISVC, "primary")
    targets = scrape_targets(pods)
    counts = count_pods(pods)
    a, b = (pod_url(p) for p in pods)
    async with new_scrape_session() as session:
        await poll(lambda: _has_pool(prometheus, key), "the pool in Prometheus")

        async def fast_in_flight(expected: float) -> float | None:
            results = await scrape_pods(session, targets)
            fast, _ = fold_scrapes(results, RateMemory(), counts.serving)
            return fast.at if fast.in_flight == expected else None

        async def prom_in_flight(expected: float) -> bool:
            pool = (await prometheus.query()).pool(key)
            return pool is not None and pool.in_flight == expected

        assert await fast_in_flight(0)
        t_send = time.monotonic()
        held = [asyncio.create_task(infer(session, a)) for _ in range(4)]
        held += [asyncio.create_task(infer(session, b)) for _ in range(3)]
        await poll(lambda: fast_in_flight(7), "pods to show 7 in flight")
        fast_seen = time.monotonic() - t_send
        results = await scrape_pods(session, targets)
        fast, _ = fold_scrapes(results, RateMemory(), counts.serving)
        by_ip = {p["metadata"]["name"]: pod_url(p) for p in pods}
        assert fast.in_flight == 7
        assert {by_ip[n]: v for n, v in fast.per_pod_in_flight.items()} == {a: 4, b: 3}
        observed = observation_from_signals(time.monotonic(), counts, fast, None)
        assert observed.observation.queue_depth == 7 and observed.queue_source == "pods"

        await poll(lambda: prom_in_flight(7), "Prometheus to show 7 in flight", interval=0.1)
        prom_seen = time.monotonic() - t_send

        assert await asyncio.gather(*held) == [200] * 7
        t_done = time.monotonic()
        await poll(lambda: fast_in_flight(0), "pods to show the queue drained")
        fast_drained = time.monotonic() - t_done

        async def p99_shows_hold() -> bool:
            pool = (await prometheus.query()).pool(key)
            return pool is not None and (pool.p99_hot_ms or 0) >= hold_ms * 0.9

        await poll(p99_shows_hold, "P99 to show the held requests", interval=0.1)
        p99_seen = time.monotonic() - t_done
    print(
        f"\nfreshness: queue via pods {fast_seen:.3f}s, via Prometheus {prom_seen:.3f}s; "
        f"drain via pods {fast_drained:.3f}s; hot P99 after completion {p99_seen:.3f}s"
    )
    assert fast_seen < 1.0
    assert prom_seen < 5.0 and p99_seen < 5.0


async def test_dead_and_hung_pods_are_missing_never_zero(
    sandbox: Any,
    namespace: str,
    model: ModelInfo,
    prometheus: PrometheusSignals,
    stopped_pids: list[int],
) -> None:
    pods = start_pool(sandbox, namespace, "primary", 3, runtime_config(model, 3000))
    key = PoolKey(namespace, ISVC, "primary")
    pods.sort(key=lambda p: p["metadata"]["name"])
    live, hung, dead = pods
    async with new_scrape_session() as session, SignalCollector(prometheus) as collector:
        await poll(lambda: _has_pool(prometheus, key), "the pool in Prometheus")
        # Two requests held on the live pod: its load is 2, so the pool's cannot be 2 + 0 + 0.
        held = [asyncio.create_task(infer(session, pod_url(live))) for _ in range(2)]
        os.kill(pod_pid(hung), signal.SIGSTOP)
        stopped_pids.append(pod_pid(hung))
        os.kill(pod_pid(dead), signal.SIGKILL)
        await asyncio.sleep(0.3)
        # The pod objects still say Ready (the probes have not failed three times yet): the
        # collector sees what the operator would see in that window.
        reading = await collector.observe_pool(key, pods)
        missing = {n: r for n, r in reading.scrapes.items() if isinstance(r, PodMissing)}
        assert set(missing) == {hung["metadata"]["name"], dead["metadata"]["name"]}
        assert "timeout" in missing[hung["metadata"]["name"]].error
        assert isinstance(reading.scrapes[live["metadata"]["name"]], PodScrape)
        assert reading.fast.in_flight is None  # 2 of 3 missing: unknown, not 2
        assert "queue:missing 2/3 pods" in reading.fast.notes
        # Prometheus is the fallback only while it still has every serving pod (its last
        # samples are at most a scrape old); once it lost them, the queue is unknown.
        if reading.observed.queue_source == "prometheus":
            assert reading.prom is not None and (reading.prom.pods_reporting or 0) >= 3
        else:
            assert reading.observed.observation.queue_depth is None
            assert "queue:missing" in reading.observed.notes

        # One of two missing: extrapolated from the live pod (2 per pod), not 2 + 0.
        two = [live, hung]
        reading = await collector.observe_pool(key, two)
        assert reading.fast.in_flight == 4
        assert reading.fast.missing == (hung["metadata"]["name"],)

        async def prometheus_lost_them() -> bool:
            pool = (await prometheus.query()).pool(key)
            return pool is not None and pool.pods_reporting == 1

        t0 = time.monotonic()
        await poll(prometheus_lost_them, "Prometheus to stop reporting the two pods", within=15)
        print(f"\nPrometheus dropped dead/hung pods after {time.monotonic() - t0 + 0.3:.2f}s")
        assert await asyncio.gather(*held) == [200, 200]


async def test_stale_and_unreachable_prometheus_are_detected(
    sandbox: Any,
    namespace: str,
    model: ModelInfo,
    prometheus: PrometheusSignals,
    stopped_pids: list[int],
) -> None:
    pods = start_pool(sandbox, namespace, "primary", 1, runtime_config(model))
    key = PoolKey(namespace, ISVC, "primary")
    async with new_scrape_session() as session:
        for _ in range(30):
            assert await infer(session, pod_url(pods[0])) == 200
    await poll(lambda: _has_pool(prometheus, key), "the pool in Prometheus")

    # Prometheus answering as if its last scrape were 20 s ago (what a stalled scrape loop
    # looks like): evaluate at now + 20 s; the age is computed by Prometheus from the samples.
    stale_round = await prometheus.query(at=time.time() + 20.0)
    stale = stale_round.pool(key)
    assert stale is not None and stale.age_seconds is not None and stale.age_seconds > 18.0
    async with SignalCollector(None) as collector:
        fresh_pods = await collector.observe_pool(key, pods)
    observed = observation_from_signals(
        time.monotonic(), count_pods(pods), fresh_pods.fast, stale, max_age_seconds=5.0
    )
    assert observed.observation.hot_p99_ms is None
    assert any(n.startswith("p99:stale") for n in observed.notes), observed.notes
    assert observed.queue_source == "pods" and observed.observation.queue_depth == 0
    # Without fresh pod scrapes the stale Prometheus queue is refused too: the autoscaler holds.
    alone = observation_from_signals(time.monotonic(), count_pods(pods), None, stale)
    assert alone.observation.queue_depth is None and alone.queue_source == "none"
    # The SLO evaluator sees the sample time and calls it stale.
    policy = SloPolicy(p99_ms=1.0, stale_after_seconds=10, min_requests=1)
    verdict, _ = evaluate_slo(
        policy, pool_signals_from_prometheus(stale), SloState(), time.monotonic()
    )
    p99 = next(r for r in verdict.readings if r.signal is Signal.P99)
    assert p99.status is SignalStatus.STALE, verdict

    # Unreachable: nothing listens there. The round carries the error; no signal is zero.
    down = PrometheusSignals("http://127.0.0.1:9", timeout=0.5)
    async with SignalCollector(down) as collector:
        reading = await collector.observe_pool(key, pods)
    assert reading.prometheus_error and reading.prom is None
    assert reading.observed.observation.hot_p99_ms is None
    assert "p99:missing prometheus" in reading.observed.notes
    assert reading.observed.observation.queue_depth == 0  # the pods still answer

    # Hung: Prometheus stopped (SIGSTOP) for longer than the query timeout.
    prom_pid = _prometheus_pid(sandbox)
    slow = PrometheusSignals(sandbox.prometheus_url, timeout=0.5)
    os.kill(prom_pid, signal.SIGSTOP)
    stopped_pids.append(prom_pid)
    try:
        t0 = time.monotonic()
        hung_round = await slow.query()
        waited = time.monotonic() - t0
    finally:
        os.kill(prom_pid, signal.SIGCONT)
    assert hung_round.error is not None and not hung_round.pools
    assert waited < 2.0


def _prometheus_pid(sandbox: Any) -> int:
    for proc in sandbox.processes:
        if getattr(proc, "name", "") == "prometheus":
            return int(proc.popen.pid)
    raise AssertionError(f"no prometheus process among {[p.name for p in sandbox.processes]}")


async def test_arrival_rate_step_freshness(
    sandbox: Any, namespace: str, model: ModelInfo, prometheus: PrometheusSignals
) -> None:
    """A step from idle to a steady rate: when does each path's arrival rate show 80 % of it?"""
    pods = start_pool(sandbox, namespace, "primary", 1, runtime_config(model))
    key = PoolKey(namespace, ISVC, "primary")
    rate = 40.0
    stop = asyncio.Event()
    async with new_scrape_session() as session, SignalCollector(prometheus) as collector:
        assert await infer(session, pod_url(pods[0])) == 200  # the series exist before the step
        await poll(lambda: _has_pool(prometheus, key), "the pool in Prometheus")
        await asyncio.sleep(2.0)
        await collector.observe_pool(key, pods)  # the rate memory's base

        async def load() -> None:
            sent: list[asyncio.Task[int]] = []
            while not stop.is_set():
                sent.append(asyncio.create_task(infer(session, pod_url(pods[0]))))
                await asyncio.sleep(1.0 / rate)
            assert set(await asyncio.gather(*sent)) == {200}

        t_step = time.monotonic()
        loader = asyncio.create_task(load())
        seen: dict[str, float] = {}
        try:
            while len(seen) < 2 and time.monotonic() - t_step < 30:
                reading = await collector.observe_pool(key, pods)
                elapsed = time.monotonic() - t_step
                if (reading.fast.arrival_rate or 0) >= 0.8 * rate:
                    seen.setdefault("pods", elapsed)
                if reading.prom is not None and (reading.prom.arrival_rate or 0) >= 0.8 * rate:
                    seen.setdefault("prometheus", elapsed)
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await loader
    print(f"\nfreshness: arrival-rate step to 80% via {seen}")
    assert set(seen) == {"pods", "prometheus"}
    assert seen["pods"] < 1.5  # two scrapes at least 0.5 s apart after the step
    assert seen["pods"] < seen["prometheus"]
