"""Parsing that must not stall a server: run in a worker process, a bounded number at once.

``json.loads`` of a large body holds the interpreter's lock from start to end (seconds for
64 MiB of numbers), so a thread would not keep the event loop answering: health and readiness
probes would wait behind it and a pod be taken out for one client's request. :class:`Offload`
runs such a call in a worker process (``spawn``ed on first use, then kept), at most
``workers`` at once, so what a parse builds lives in the worker and its memory is bounded by
the number of workers; the event loop only waits. Small bodies are cheaper to parse in place
than to ship (:data:`tidal.common.body.OFFLOAD_BYTES`): callers decide.

A worker killed mid-parse (the kernel's OOM killer picks the largest process of the pod: the
worker) is answered 503 for that request and a fresh worker serves the next.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from .body import BodyError

T = TypeVar("T")


class Offload:
    """A lazily started pool of ``workers`` processes for parses too heavy for the loop."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker (``fn`` importable by name, its arguments picklable);
        what it raises is raised here."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        executor = self._executor
        try:
            # Submitted from a thread: the first submit starts the worker (a fork and an exec,
            # a second under load), which must not stall the loop either.
            future = await asyncio.to_thread(executor.submit, fn, *args)
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            if self._executor is executor:
                self._executor = None
                executor.shutdown(wait=False, cancel_futures=True)
            raise BodyError(
                503, "the request could not be parsed: its parser process died (out of memory?)"
            ) from None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
