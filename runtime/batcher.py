"""The dynamic batcher of one model: a bounded queue, a loop that forms batches, execution.

Requests are queued with their arrival time and deadline; the loop asks the pure
:func:`~tidal.runtime.core.batching.decide_batch` what to send, merges the inputs along the
batch dimension, runs the batch on a worker thread and hands each request its slice of the
outputs.  One batch per model runs at a time (``faults.maxConcurrentBatches`` execution slots
when set), so while the device is busy the next batch forms.

``tidal_queue_depth{model}`` is set from ``len(queue)`` in the same step that changes the queue,
so it is exact at every scrape: the autoscaler scales on it.

What the operator learns a replica's capacity from (operator/SIGNALS.md, "Capacity"): per
completed batch, ``tidal_backend_{batches,rows,requests,seconds,row_seconds,rows_squared}_total``
— a few counter increments per batch, nothing per request — and the gauges
``tidal_backend_slots``, ``tidal_max_batch_rows``, ``tidal_request_timeout_seconds`` and
``tidal_queue_reachable`` (queued requests that can still be served before their deadline,
computed when scraped).

``faults.serviceTimeMs`` / ``serviceTimePerRowMs`` emulate a device: each batch holds its slot
at least that long (the engine runs, then the worker thread waits out the rest), so a replica
serves at most ``slots x maxBatchSize / service time`` rows per second, like a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.clock import Clock
from .config import FaultSpec, ModelSpec
from .core.batching import (
    BatchPolicy,
    QueuedItem,
    decide_batch,
    retry_after_seconds,
    split_expired,
)
from .enginecache import EngineCache
from .errors import BackendError, Overloaded, ServingError
from .metrics import RuntimeMetrics

log = logging.getLogger("tidal.runtime.batcher")

# Batches whose engine call recently took less than this run on the event loop itself: handing
# them to a worker thread and back (queue put, thread wake-up, GIL hand-over,
# call_soon_threadsafe) costs more than running them.  Anything slower runs on the model's worker
# thread so that the loop keeps accepting requests (and forming the next batch) while the device
# computes.  The engine call is timed where it runs (on the worker thread, not around the
# hand-off): a busy loop takes a while to pick a finished batch up, and counting that wait kept
# every batch on the thread.
INLINE_BELOW_SECONDS = 0.0002
# A request that finds the model idle runs at once (in ``submit``) only while the batches the
# loop formed recently held about one request each; one such request in this many goes through
# the queue all the same, so that the batch loop keeps measuring whether requests come together.
AT_ONCE_WHILE_BATCHES_BELOW = 1.5
AT_ONCE_PROBE_EVERY = 16
Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(eq=False)  # identity: a pending request is removed from the queue by identity
class Pending:
    item: QueuedItem
    inputs: Arrays
    future: asyncio.Future[Arrays]
    timer: asyncio.TimerHandle | None = None


class ModelBatcher:
    def __init__(
        self,
        spec: ModelSpec,
        cache: EngineCache,
        metrics: RuntimeMetrics,
        clock: Clock,
        faults: FaultSpec | None = None,
    ) -> None:
        self.spec = spec
        self.cache = cache
        self.metrics = metrics
        self.clock = clock
        if faults is None:
            config = getattr(cache, "config", None)
            faults = getattr(config, "faults", None) or FaultSpec()
        self.faults = faults
        self.slots = faults.max_concurrent_batches
        self.policy = BatchPolicy(
            max_batch_size=spec.max_batch_size,
            max_queue_delay=spec.batching.max_queue_delay_ms / 1000.0,
            preferred_batch_sizes=tuple(spec.batching.preferred_batch_sizes),
            enabled=spec.batching.enabled,
        )
        self.queue: deque[Pending] = deque()
        self.queued_rows = 0
        self.recent_batch_seconds: float | None = None
        self.recent_engine_seconds: float | None = None  # the engine call alone (inline choice)
        self.recent_batch_requests: float | None = None  # requests per batch the loop formed
        self._at_once_left = AT_ONCE_PROBE_EVERY
        self._wakeup = asyncio.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=self.slots, thread_name_prefix=f"tidal-{spec.name}"
        )
        self._task: asyncio.Task[None] | None = None
        self._running = 0  # batches executing in extra slots (slots > 1)
        self._executing = 0  # batches on a worker thread now (any slot)
        self._executions: set[asyncio.Task[None]] = set()
        name = spec.name
        self._gauge = metrics.queue_depth.labels(name)
        self._gauge.set(0)
        self._batch_hist = metrics.batch_size.labels(name)
        self._done_batches = metrics.backend_batches.labels(name)
        self._done_rows = metrics.backend_rows.labels(name)
        self._done_requests = metrics.backend_requests.labels(name)
        self._busy = metrics.backend_seconds.labels(name)
        self._row_seconds = metrics.backend_row_seconds.labels(name)
        self._rows_squared = metrics.backend_rows_squared.labels(name)
        self.stats = metrics.stats_for(name)
        metrics.backend_slots.labels(name).set(self.slots)
        metrics.max_batch_rows.labels(name).set(spec.max_batch_size)
        timeout = spec.batching.timeout_ms
        metrics.request_timeout.labels(name).set(timeout / 1000.0 if timeout else 0.0)
        metrics.queue_reachable.labels(name).set_function(self.reachable)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"batcher-{self.spec.name}")

    async def stop(self) -> None:
        for task in [self._task, *self._executions]:
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for pending in self.queue:
            if not pending.future.done():
                pending.future.set_exception(Overloaded("server shutting down", retry_after=1))
                # Marked retrieved: a handler still awaiting it raises it all the same, and one
                # whose client left (cancelled) would otherwise have asyncio log an ERROR
                # "Future exception was never retrieved" at shutdown (seen once in CI's fuzz).
                pending.future.exception()
        self.queue.clear()
        self._gauge.set(0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def reachable(self) -> float:
        """Queued requests that can still be served before their deadline.

        A request at position i waits for the batches of the rows ahead of it, `slots` at a
        time, each taking the recent batch time; it is reachable when its deadline is at least
        that far away. Requests without a deadline are always reachable. O(queue), run when
        `/metrics` is read (on the event loop, like every change of the queue).
        """
        now = self.clock.monotonic()
        per_batch = self.recent_batch_seconds or 0.0
        batch_rows = max(1, self.spec.max_batch_size)
        count = 0
        rows_ahead = 0
        for pending in self.queue:
            deadline = pending.item.deadline
            if deadline is None:
                count += 1
            else:
                rounds = rows_ahead // batch_rows // self.slots + 1
                if deadline - now >= rounds * per_batch:
                    count += 1
            rows_ahead += pending.item.rows
        return float(count)

    def submit(
        self,
        inputs: Arrays,
        rows: int,
        shape_key: Hashable,
        timeout_ms: float | None = None,
    ) -> asyncio.Future[Arrays]:
        """Queue one request. `timeout_ms` (the request's own ``timeout`` parameter, if it has
        one) shortens ``batching.timeoutMs``; it never extends it."""
        if len(self.queue) >= self.spec.batching.max_queue_size:
            raise Overloaded(
                f"model {self.spec.name!r}: queue is full ({len(self.queue)} requests)",
                retry_after=retry_after_seconds(
                    self.queued_rows, self.spec.max_batch_size, self.recent_batch_seconds
                ),
            )
        now = self.clock.monotonic()
        timeout = self.spec.batching.timeout_ms
        if timeout_ms is not None and timeout_ms > 0 and math.isfinite(timeout_ms):
            timeout = timeout_ms if timeout is None else min(timeout, timeout_ms)
        deadline = now + timeout / 1000.0 if timeout is not None else None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Arrays] = loop.create_future()
        pending = Pending(QueuedItem(now, rows, shape_key, deadline), inputs, future)
        if self._runs_at_once(pending.item, now):
            self._run_inline([pending])
            return future
        if timeout is not None:
            # A timer, not the batch loop, enforces the deadline: the loop may be busy running
            # a batch for longer than the timeout.
            pending.timer = loop.call_later(timeout / 1000.0, self._on_deadline, pending)
        self.queue.append(pending)
        self.queued_rows += rows
        self._gauge.set(len(self.queue))
        self._wakeup.set()
        return future

    def _take(self, count: int) -> list[Pending]:
        taken = [self.queue.popleft() for _ in range(count)]
        self.queued_rows -= sum(p.item.rows for p in taken)
        self._gauge.set(len(self.queue))
        for pending in taken:
            if pending.timer is not None:
                pending.timer.cancel()
        return taken

    def _timed_out(self, pending: Pending) -> Overloaded:
        waited = 0.0
        if pending.item.deadline is not None:
            waited = (pending.item.deadline - pending.item.arrival) * 1000.0
        return Overloaded(
            f"model {self.spec.name!r}: request timed out after {waited:g} ms in the queue",
            retry_after=1,
        )

    def _on_deadline(self, pending: Pending) -> None:
        try:
            self.queue.remove(pending)
        except ValueError:
            return  # already sent to the backend
        self.queued_rows -= pending.item.rows
        self._gauge.set(len(self.queue))
        if not pending.future.done():
            pending.future.set_exception(self._timed_out(pending))

    def _expire(self, now: float) -> None:
        if all(p.item.deadline is None for p in self.queue):
            return
        live, expired = split_expired([p.item for p in self.queue], now)
        if not expired:
            return
        items = list(self.queue)
        self.queue = deque(items[i] for i in live)
        for index in expired:
            pending = items[index]
            self.queued_rows -= pending.item.rows
            if pending.timer is not None:
                pending.timer.cancel()
            if not pending.future.done():
                pending.future.set_exception(self._timed_out(pending))
        self._gauge.set(len(self.queue))

    async def _run(self) -> None:
        while True:
            if not self.queue or self._running >= self.slots:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            now = self.clock.monotonic()
            self._expire(now)
            decision = decide_batch([p.item for p in self.queue], self.policy, now)
            if decision.count == 0:
                if decision.wake_at is None:
                    continue
                wait = decision.wake_at - now
                deadlines = [p.item.deadline for p in self.queue if p.item.deadline is not None]
                if deadlines:
                    wait = min(wait, min(deadlines) - now)
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=max(0.0, wait))
                except TimeoutError:
                    pass
                continue
            batch = [p for p in self._take(decision.count) if not p.future.done()]
            if not batch:
                continue
            self.recent_batch_requests = _smoothed(self.recent_batch_requests, len(batch))
            if self.slots == 1:
                await self._execute(batch)
            else:
                self._running += 1
                task = asyncio.create_task(self._execute_in_slot(batch))
                self._executions.add(task)
                task.add_done_callback(self._executions.discard)

    async def _execute_in_slot(self, batch: list[Pending]) -> None:
        try:
            await self._execute(batch)
        finally:
            self._running -= 1
            self._wakeup.set()

    def _infer_timed(self, engine: Any, merged: Arrays) -> tuple[Arrays, float]:
        """Run the batch (on the worker thread); returns the outputs and the engine's seconds."""
        started = self.clock.monotonic()
        outputs: Arrays = engine.infer(merged)
        return outputs, self.clock.monotonic() - started

    def _infer_paced(self, engine: Any, merged: Arrays, rows: int) -> tuple[Arrays, float]:
        """Run the batch, then hold the slot until the emulated service time has passed."""
        outputs, engine_s = self._infer_timed(engine, merged)
        left = self.faults.batch_floor_seconds(rows) - engine_s
        if left > 0:
            time.sleep(left)
        return outputs, engine_s

    def _inline(self) -> bool:
        """Whether batches run on the event loop (see INLINE_BELOW_SECONDS)."""
        recent = self.recent_engine_seconds
        return not self.faults.paced and recent is not None and recent < INLINE_BELOW_SECONDS

    def _runs_at_once(self, item: QueuedItem, now: float) -> bool:
        """Whether ``submit`` runs this request itself, skipping the queue.

        Yes when it finds the queue empty and no batch executing, the model's batches run on
        the event loop, the policy would send it alone, and the loop's recent batches held
        about one request each: queueing it would only wake the batch loop to do the same a
        loop turn later (a future, an event, two task switches: most of a light model's cost).
        grpc.aio hands the loop one call at a time, so its requests seldom meet in the queue;
        aiohttp parses many requests in one loop turn, and those are batched (queued)."""
        if (
            self.queue
            or self._executing
            or self._task is None
            or self._task.done()
            or not self._inline()
        ):
            return False
        recent = self.recent_batch_requests
        if recent is None or recent >= AT_ONCE_WHILE_BATCHES_BELOW:
            return False
        self._at_once_left -= 1
        if self._at_once_left <= 0:
            self._at_once_left = AT_ONCE_PROBE_EVERY
            return False
        return decide_batch((item,), self.policy, now).count == 1

    def _prepare(self, batch: list[Pending]) -> tuple[Any, Arrays, int, float] | None:
        """The engine, the merged inputs, the rows and the time merging began; None (the batch
        failed) when the engine is gone."""
        slot = self.cache.slots[self.spec.name]
        engine = slot.engine
        if engine is None:  # cannot happen while requests hold refs; fail loudly if it does
            for pending in batch:
                pending.future.set_exception(BackendError("engine vanished while queued"))
            return None
        merging = self.clock.monotonic()
        queue = self.stats.queue
        for pending in batch:
            queue.add(merging - pending.item.arrival)
        if len(batch) == 1:
            merged = batch[0].inputs
        else:
            merged = {
                name: np.concatenate([p.inputs[name] for p in batch], axis=0)
                for name in batch[0].inputs
            }
        rows = sum(p.item.rows for p in batch)
        self._batch_hist.observe(rows)
        return engine, merged, rows, merging

    def _run_inline(self, batch: list[Pending]) -> None:
        prepared = self._prepare(batch)
        if prepared is None:
            return
        engine, merged, rows, merging = prepared
        started = self.clock.monotonic()
        try:
            outputs = engine.infer(merged)
        except Exception as exc:
            self._fail(batch, rows, exc)
            return
        self._finish(batch, outputs, rows, merging, started, self.clock.monotonic() - started)

    async def _execute(self, batch: list[Pending]) -> None:
        if self._inline():
            self._run_inline(batch)
            return
        prepared = self._prepare(batch)
        if prepared is None:
            return
        engine, merged, rows, merging = prepared
        started = self.clock.monotonic()
        loop = asyncio.get_running_loop()
        self._executing += 1
        try:
            if self.faults.paced:
                outputs, engine_s = await loop.run_in_executor(
                    self._pool, self._infer_paced, engine, merged, rows
                )
            else:
                outputs, engine_s = await loop.run_in_executor(
                    self._pool, self._infer_timed, engine, merged
                )
        except Exception as exc:
            self._fail(batch, rows, exc)
            return
        finally:
            self._executing -= 1
        self._finish(batch, outputs, rows, merging, started, engine_s)

    def _fail(self, batch: list[Pending], rows: int, exc: Exception) -> None:
        log.exception("batch of %d rows failed on %s", rows, self.spec.name)
        error = (
            exc
            if isinstance(exc, ServingError)
            else BackendError(f"backend failed on model {self.spec.name!r}: {exc}")
        )
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    def _finish(
        self,
        batch: list[Pending],
        outputs: Arrays,
        rows: int,
        merging: float,
        started: float,
        engine_s: float,
    ) -> None:
        """Count the completed batch and hand each request its slice of the outputs."""
        elapsed = self.clock.monotonic() - started
        self.recent_batch_seconds = _smoothed(self.recent_batch_seconds, elapsed)
        self.recent_engine_seconds = _smoothed(self.recent_engine_seconds, engine_s)
        self._done_batches.inc()
        self._done_rows.inc(rows)
        self._done_requests.inc(len(batch))
        self._busy.inc(elapsed)
        self._row_seconds.inc(rows * elapsed)
        self._rows_squared.inc(rows * rows)
        offset = 0
        for pending in batch:
            n = pending.item.rows
            if not pending.future.done():
                if len(batch) == 1:
                    pending.future.set_result(outputs)
                else:
                    pending.future.set_result(
                        {name: out[offset : offset + n] for name, out in outputs.items()}
                    )
            offset += n
        self.stats.record_batch(
            rows, len(batch), started - merging, elapsed, self.clock.monotonic() - started - elapsed
        )


def _smoothed(previous: float | None, sample: float) -> float:
    """An exponentially weighted mean of recent samples (the first sample stands alone)."""
    return sample if previous is None else 0.8 * previous + 0.2 * sample
