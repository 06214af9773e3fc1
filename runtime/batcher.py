"""The dynamic batcher of one model: a bounded queue, a loop that forms batches, execution.

Requests are queued with their arrival time and deadline; the loop asks the pure
:func:`~tidal.runtime.core.batching.decide_batch` what to send, merges the inputs along the
batch dimension, runs the batch on a worker thread and hands each request its slice of the
outputs.  One batch per model runs at a time, so while the device is busy the next batch forms.

``tidal_queue_depth{model}`` is set from ``len(queue)`` in the same step that changes the queue,
so it is exact at every scrape: the autoscaler scales on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidal.runtime.clock import Clock
from tidal.runtime.config import ModelSpec
from tidal.runtime.core.batching import (
    BatchPolicy,
    QueuedItem,
    decide_batch,
    retry_after_seconds,
    split_expired,
)
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.errors import BackendError, Overloaded, ServingError
from tidal.runtime.metrics import RuntimeMetrics

log = logging.getLogger("tidal.runtime.batcher")

# Batches that recently took less than this run on the event loop itself: handing them to a
# worker thread and back (queue put, thread wake-up, GIL hand-over, call_soon_threadsafe) costs
# more than running them.  Anything slower runs on the model's worker thread so that the loop
# keeps accepting requests (and forming the next batch) while the device computes.
INLINE_BELOW_SECONDS = 0.0002
Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(eq=False)  # identity: a pending request is removed from the queue by identity
class Pending:
    item: QueuedItem
    inputs: Arrays
    future: asyncio.Future[Arrays]
    timer: asyncio.TimerHandle | None = None


class ModelBatcher:
    def __init__(
        self, spec: ModelSpec, cache: EngineCache, metrics: RuntimeMetrics, clock: Clock
    ) -> None:
        self.spec = spec
        self.cache = cache
        self.metrics = metrics
        self.clock = clock
        self.policy = BatchPolicy(
            max_batch_size=spec.max_batch_size,
            max_queue_delay=spec.batching.max_queue_delay_ms / 1000.0,
            preferred_batch_sizes=tuple(spec.batching.preferred_batch_sizes),
            enabled=spec.batching.enabled,
        )
        self.queue: deque[Pending] = deque()
        self.queued_rows = 0
        self.recent_batch_seconds: float | None = None
        self._wakeup = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tidal-{spec.name}")
        self._task: asyncio.Task[None] | None = None
        self._gauge = metrics.queue_depth.labels(spec.name)
        self._gauge.set(0)
        self._batch_hist = metrics.batch_size.labels(spec.name)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"batcher-{self.spec.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for pending in self.queue:
            if not pending.future.done():
                pending.future.set_exception(Overloaded("server shutting down", retry_after=1))
        self.queue.clear()
        self._gauge.set(0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, inputs: Arrays, rows: int, shape_key: Hashable) -> asyncio.Future[Arrays]:
        if len(self.queue) >= self.spec.batching.max_queue_size:
            raise Overloaded(
                f"model {self.spec.name!r}: queue is full ({len(self.queue)} requests)",
                retry_after=retry_after_seconds(
                    self.queued_rows, self.spec.max_batch_size, self.recent_batch_seconds
                ),
            )
        now = self.clock.now()
        timeout = self.spec.batching.timeout_ms
        deadline = now + timeout / 1000.0 if timeout is not None else None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Arrays] = loop.create_future()
        pending = Pending(QueuedItem(now, rows, shape_key, deadline), inputs, future)
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

    def _timed_out(self) -> Overloaded:
        return Overloaded(
            f"model {self.spec.name!r}: request timed out after "
            f"{self.spec.batching.timeout_ms:g} ms in the queue",
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
            pending.future.set_exception(self._timed_out())

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
                pending.future.set_exception(self._timed_out())
        self._gauge.set(len(self.queue))

    async def _run(self) -> None:
        while True:
            if not self.queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            now = self.clock.now()
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
            if batch:
                await self._execute(batch)

    async def _execute(self, batch: list[Pending]) -> None:
        slot = self.cache.slots[self.spec.name]
        engine = slot.engine
        if engine is None:  # cannot happen while requests hold refs; fail loudly if it does
            for pending in batch:
                pending.future.set_exception(BackendError("engine vanished while queued"))
            return
        if len(batch) == 1:
            merged = batch[0].inputs
        else:
            merged = {
                name: np.concatenate([p.inputs[name] for p in batch], axis=0)
                for name in batch[0].inputs
            }
        rows = sum(p.item.rows for p in batch)
        self._batch_hist.observe(rows)
        started = self.clock.now()
        recent = self.recent_batch_seconds
        try:
            if recent is not None and recent < INLINE_BELOW_SECONDS:
                outputs = engine.infer(merged)
            else:
                outputs = await asyncio.get_running_loop().run_in_executor(
                    self._pool, engine.infer, merged
                )
        except Exception as exc:
            log.exception("batch of %d rows failed on %s", rows, self.spec.name)
            error = (
                exc
                if isinstance(exc, ServingError)
                else BackendError(f"backend failed on model {self.spec.name!r}: {exc}")
            )
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        elapsed = self.clock.now() - started
        previous = self.recent_batch_seconds
        self.recent_batch_seconds = elapsed if previous is None else 0.8 * previous + 0.2 * elapsed
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
