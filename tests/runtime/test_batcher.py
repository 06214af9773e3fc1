"""The batcher's capacity limit (emulated service time, execution slots), the counters the
operator learns capacity from, and deadline-aware queue counts."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

from tidal.runtime.batcher import ModelBatcher
from tidal.runtime.config import FaultSpec, ModelSpec, load_config
from tidal.runtime.metrics import RuntimeMetrics


def _post(url: str) -> float:
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    request = urllib.request.Request(
        f"http://{url}/v2/models/mlp/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status == 200
    return time.monotonic() - started


def _burst(url: str, n: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    threads = [threading.Thread(target=lambda: latencies.append(_post(url))) for _ in range(n)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return time.monotonic() - started, latencies


@pytest.mark.parametrize("slots", [1, 2])
def test_service_time_limits_throughput_per_slot(serve, models, model_entry, slots: int) -> None:
    entry = model_entry(models["mlp"], "mlp", maxBatchSize=1, batching={"enabled": False})
    rt = serve({"models": [entry], "faults": {"serviceTimeMs": 60, "maxConcurrentBatches": slots}})
    elapsed, latencies = _burst(rt.url, 8)
    # 8 batches of one row, `slots` at a time, 60 ms each: the burst cannot finish sooner, and
    # some request waited for the ones ahead of it (a queue, not a parallel sleep).
    assert elapsed >= 8 / slots * 0.060 * 0.95
    assert max(latencies) >= 2 * 0.060 * 0.9, latencies
    assert rt.metric("tidal_backend_batches_total", model="mlp") == 8
    assert rt.metric("tidal_backend_requests_total", model="mlp") == 8
    assert rt.metric("tidal_backend_rows_total", model="mlp") == 8
    assert rt.metric("tidal_backend_rows_squared_total", model="mlp") == 8
    busy = rt.metric("tidal_backend_seconds_total", model="mlp")
    assert 8 * 0.060 <= busy < 8 * 0.060 + 0.5
    assert rt.metric("tidal_backend_row_seconds_total", model="mlp") == pytest.approx(busy)
    assert rt.metric("tidal_backend_slots", model="mlp") == slots
    assert rt.metric("tidal_max_batch_rows", model="mlp") == 1


def test_batches_share_the_service_time(serve, models, model_entry) -> None:
    entry = model_entry(models["mlp"], "mlp", maxBatchSize=8, batching={"maxQueueDelayMs": 30})
    rt = serve({"models": [entry], "faults": {"serviceTimeMs": 80, "serviceTimePerRowMs": 5}})
    elapsed, _ = _burst(rt.url, 8)
    batches = rt.metric("tidal_backend_batches_total", model="mlp")
    rows = rt.metric("tidal_backend_rows_total", model="mlp")
    busy = rt.metric("tidal_backend_seconds_total", model="mlp")
    assert rows == 8 and batches < 8  # batched: far less than 8 x 80 ms of device time
    assert busy >= batches * 0.080 + rows * 0.005 - 1e-6
    assert elapsed < 8 * 0.080


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t


class _Cache:
    config = load_config(None, {})


def _batcher(clock: _Clock, timeout_ms: float | None, **faults: Any) -> ModelBatcher:
    spec = ModelSpec.model_validate(
        {
            "name": "m",
            "engines": [{"uri": "file:///m.onnx"}],
            "maxBatchSize": 2,
            "batching": {"timeoutMs": timeout_ms},
        }
    )
    return ModelBatcher(spec, _Cache(), RuntimeMetrics(), clock, FaultSpec(**faults))  # type: ignore[arg-type]


def test_reachable_counts_queued_requests_that_can_meet_their_deadline() -> None:
    async def run() -> tuple[float, float, float]:
        clock = _Clock()
        batcher = _batcher(clock, 1000.0, max_concurrent_batches=1)
        x = {"input": np.ones((1, 16), np.float32)}
        for _ in range(6):
            batcher.submit(x, 1, ())
        batcher.recent_batch_seconds = 0.3
        # Rows ahead / 2 per batch: positions 0-1 need 0.3 s, 2-3 0.6 s, 4-5 0.9 s.
        at_start = batcher.reachable()
        clock.t += 0.5  # 0.5 s left of each deadline: only the first batch makes it
        later = batcher.reachable()
        clock.t += 0.4  # 0.1 s left: none
        last = batcher.reachable()
        await batcher.stop()
        return at_start, later, last

    assert asyncio.run(run()) == (6.0, 2.0, 0.0)


def test_a_requests_own_timeout_shortens_the_configured_one() -> None:
    async def run() -> list[float | None]:
        clock = _Clock()
        out = []
        for configured, own in [(1000.0, 50.0), (1000.0, 5000.0), (None, 50.0), (None, None)]:
            batcher = _batcher(clock, configured)
            batcher.submit({"input": np.ones((1, 16), np.float32)}, 1, (), timeout_ms=own)
            deadline = batcher.queue[0].item.deadline
            out.append(None if deadline is None else round(deadline - clock.t, 6))
            await batcher.stop()
        return out

    assert asyncio.run(run()) == [0.05, 1.0, 0.05, None]


def test_no_deadline_means_every_queued_request_counts() -> None:
    async def run() -> float:
        batcher = _batcher(_Clock(), None)
        for _ in range(3):
            batcher.submit({"input": np.ones((1, 16), np.float32)}, 1, ())
        batcher.recent_batch_seconds = 100.0
        value = batcher.reachable()
        await batcher.stop()
        return value

    assert asyncio.run(run()) == 3.0


def test_capacity_faults_from_the_environment() -> None:
    env = {
        "TIDAL_FAULT_SERVICE_TIME_MS": "25",
        "TIDAL_FAULT_SERVICE_TIME_PER_ROW_MS": "2",
        "TIDAL_FAULT_MAX_CONCURRENT_BATCHES": "3",
    }
    faults = load_config(None, env).faults
    assert faults.paced and faults.max_concurrent_batches == 3
    assert faults.batch_floor_seconds(4) == pytest.approx(0.033)
    assert not FaultSpec().paced


class _Engine:
    """Doubles its input; records the thread and the rows of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (thread id, rows)

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        x = inputs["x"]
        self.calls.append((threading.get_ident(), len(x)))
        return {"y": x * 2}


class _Slot:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine


class _EngineCache(_Cache):
    def __init__(self, engine: _Engine) -> None:
        self.slots = {"m": _Slot(engine)}


def _running_batcher(engine: _Engine, max_batch: int = 8) -> ModelBatcher:
    from tidal.common.clock import CLOCK

    spec = ModelSpec.model_validate(
        {
            "name": "m",
            "engines": [{"uri": "file:///m.onnx"}],
            "maxBatchSize": max_batch,
            "batching": {"maxQueueDelayMs": 0},
        }
    )
    batcher = ModelBatcher(spec, _EngineCache(engine), RuntimeMetrics(), CLOCK)  # type: ignore[arg-type]
    batcher.start()
    return batcher


def _row(value: float) -> dict[str, np.ndarray[Any, Any]]:
    return {"x": np.full((1, 4), value, dtype=np.float32)}


async def test_fast_batches_run_on_the_event_loop() -> None:
    # The engine call is timed on the worker thread: the loop's delay in picking the result up
    # (here a blocking sleep while the batch runs) must not keep fast batches on the thread.
    engine = _Engine()
    batcher = _running_batcher(engine)
    try:
        future = batcher.submit(_row(1.0), 1, ((4,),))
        await asyncio.sleep(0)
        time.sleep(0.01)  # noqa: ASYNC251 (the loop is busy while the batch runs on the thread)
        await future
        for value in range(5):
            out = await batcher.submit(_row(value), 1, ((4,),))
            assert out["y"][0, 0] == 2 * value
        loop_thread = threading.get_ident()
        assert engine.calls[0][0] != loop_thread  # no timing yet: the thread
        assert all(thread == loop_thread for thread, _ in engine.calls[1:])
        assert batcher.recent_engine_seconds is not None
        assert batcher.recent_engine_seconds < batcher.recent_batch_seconds  # type: ignore[operator]
    finally:
        await batcher.stop()


async def test_a_lone_request_to_an_idle_model_is_answered_by_submit() -> None:
    engine = _Engine()
    batcher = _running_batcher(engine)
    try:
        for value in range(4):  # batches of one request: the loop measures that
            await batcher.submit(_row(value), 1, ((4,),))
        at_once = [batcher.submit(_row(7.0), 1, ((4,),)) for _ in range(3)]
        assert all(f.done() for f in at_once)  # no loop turn needed
        assert at_once[0].result()["y"][0, 0] == 14.0
        assert batcher.metrics.backend_requests.labels("m")._value.get() == 7
        assert batcher._gauge._value.get() == 0
    finally:
        await batcher.stop()


async def test_requests_that_arrive_together_are_batched() -> None:
    engine = _Engine()
    batcher = _running_batcher(engine)
    try:
        for value in range(3):
            await batcher.submit(_row(value), 1, ((4,),))
        # Then the loop turn brings many at once: the first few may run at once, but a probe
        # goes through the queue, those behind it are batched with it, and from then on the
        # loop's batches hold several requests, so no request skips the queue.
        for _ in range(3):
            futures = [batcher.submit(_row(1.0), 1, ((4,),)) for _ in range(40)]
            await asyncio.gather(*futures)
        assert batcher.recent_batch_requests is not None
        assert batcher.recent_batch_requests > 1.5
        futures = [batcher.submit(_row(1.0), 1, ((4,),)) for _ in range(16)]
        assert not any(f.done() for f in futures)
        await asyncio.gather(*futures)
        assert engine.calls[-1][1] > 1  # the last 16 went in batches
    finally:
        await batcher.stop()
