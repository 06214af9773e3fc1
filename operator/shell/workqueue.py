"""A coalescing work queue of InferenceService keys, in the manner of client-go's workqueue.

This module owns the guarantees reconciliation relies on: a key is never reconciled by two
workers at once; a key added while it is being reconciled runs once more afterwards (the
change is not lost); many adds of a waiting key collapse into one reconcile; failed keys come
back after an exponential back-off. Keys are processed in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger("tidal.operator.workqueue")


class WorkQueue(Generic[K]):
    """Coalescing queue + worker pool; ``handle(key, force)`` returns a retry delay or None."""

    def __init__(
        self,
        handle: Callable[[K, bool], Awaitable[float | None]],
        *,
        workers: int = 4,
        on_depth: Callable[[int], None] | None = None,
    ) -> None:
        self._handle = handle
        self._workers = workers
        self._waiting: OrderedDict[K, bool] = OrderedDict()  # key -> force
        self._active: set[K] = set()
        self._again: dict[K, bool] = {}
        self._wakeup = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._spawned: set[asyncio.Task[None]] = set()
        self._on_depth = on_depth or (lambda _depth: None)

    def __len__(self) -> int:
        return len(self._waiting)

    async def add(self, key: K, *, force: bool = False) -> None:
        """Ask for ``key`` to be reconciled; ``force``: a forced pass (every child checked)."""
        async with self._wakeup:
            self._add_locked(key, force)

    def _add_locked(self, key: K, force: bool) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._active:
            self._again[key] = self._again.get(key, False) or force
            return
        self._waiting[key] = self._waiting.get(key, False) or force
        self._on_depth(len(self._waiting))
        self._wakeup.notify()

    def add_after(self, key: K, delay: float, *, force: bool = False) -> None:
        """Add ``key`` after ``delay`` seconds (unless something adds it sooner)."""
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(key, None)
            task = loop.create_task(self.add(key, force=force))
            self._spawned.add(task)
            task.add_done_callback(self._spawned.discard)

        self._timers[key] = loop.call_later(delay, fire)

    def forget(self, key: K) -> None:
        """Drop a pending retry of ``key`` (its object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def _next(self) -> tuple[K, bool]:
        async with self._wakeup:
            await self._wakeup.wait_for(lambda: bool(self._waiting))
            key, force = self._waiting.popitem(last=False)
            self._active.add(key)
            self._on_depth(len(self._waiting))
            return key, force

    async def _done(self, key: K) -> None:
        async with self._wakeup:
            self._active.discard(key)
            if key in self._again:
                self._add_locked(key, self._again.pop(key))

    async def _work(self) -> None:
        while True:
            key, force = await self._next()
            try:
                delay = await self._handle(key, force)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one reconcile must not kill the worker
                log.exception("reconcile of %s crashed; retrying", key)
                delay = 5.0
            finally:
                await self._done(key)
            if delay is not None:
                self.add_after(key, delay, force=force)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
