"""The requests the gateway holds now, HTTP and gRPC alike, and the waits they hold on.

* :class:`Changes`: wakes every waiter at the next change of the fleet (no polling loop), and
  keeps the burst buffer's line (requests waiting for a request slot, oldest first).
* :class:`Holds`: the held requests' count and bytes (the operator's demand at a service
  scaled to zero, long-polled by ``GET /v2/tidal/held``, :meth:`Holds.watch`), the infer
  arrivals the operator's forecast learns from, each hold's deadline (its own, or the drain's
  end on SIGTERM), and the reasoned ``Retry-After`` of a 503 on the way
  (:func:`~tidal.gateway.core.hold.retry_after`).

What may be held, for how long and within which bounds are :mod:`tidal.gateway.core.hold`'s
decisions; the loop that holds is :class:`tidal.gateway.dispatch.Dispatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .core.hold import HoldLimits, retry_after

if TYPE_CHECKING:
    from .replicas import Fleet


class Changes:
    """Wakes every waiter at the next change of the fleet's state (no polling loop), and the
    burst buffer's line: requests waiting for a free slot on a hot replica, oldest first.

    A freed slot (an answer) wakes only the oldest in line (``notify_one``): waking every held
    request at each answer would cost O(held) per answer in a herd. A change of the fleet (a
    replica added, a snapshot) wakes everyone, the line included: the new room is unknown here.
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._line: deque[asyncio.Future[None]] = deque()

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None
        line, self._line = self._line, deque()
        for waiter in line:
            if not waiter.done():
                waiter.set_result(None)

    def notify_one(self) -> None:
        """A slot freed: the oldest request in line tries again (the others keep waiting)."""
        while self._line:
            waiter = self._line.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def wait_in_line(self, seconds: float, front: bool) -> None:
        """Wait for a slot (or a change, or ``seconds``); ``front``: a request that was woken
        and found the slot taken keeps its place ahead of later ones."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if front:
            self._line.appendleft(waiter)
        else:
            self._line.append(waiter)
        try:
            async with asyncio.timeout(seconds):
                await waiter
        except TimeoutError:
            pass
        finally:
            if not waiter.done():
                waiter.cancel()  # leaves the line (skipped when reached)

    async def wait(self, seconds: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()


@dataclass(eq=False)
class Held:
    """One request held now (HTTP or gRPC): what it weighs and when it must be answered."""

    model: str
    size: int
    held_at: float
    deadline: float


class Holds:
    """The requests held now, their deadlines, the arrival count and the drain."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float]) -> None:
        self.fleet = fleet
        self.config = config = fleet.config
        self.metrics = fleet.metrics
        self.clock = clock
        self.limits = HoldLimits(config.max_held_requests, config.max_held_bytes)
        # Requests held now, and a wake-up for the operator's long-poll of that count.
        self.count = 0
        self.bytes = 0
        self.changes = Changes()
        # Infer requests received since the gateway started (HTTP and gRPC, held or not): the
        # count the operator's scale-to-zero forecast learns from, every arrival once.
        self.arrivals = 0
        # Long-polls waiting for the arrival count to move (``GET /v2/tidal/held?arrivals=``):
        # an arrival wakes them (once each: then they wait for their ``every``).
        self.arrival_watchers = 0
        self._held: dict[str, dict[Held, None]] = {}  # per model, oldest first
        self._held_all: dict[Held, None] = {}  # oldest first
        self._wake_seconds: dict[str, float] = {}  # the last wait of a hold until routable
        self.draining = False
        self.ends_at: float | None = None  # set on SIGTERM: no hold lasts past it

    def arrived(self) -> None:
        """One more infer request the operator's forecast learns from (``arrivals``)."""
        self.arrivals += 1
        if self.arrival_watchers:
            self.changes.notify()

    def begin(self, model: str, size: int, now: float, deadline: float) -> Held:
        """Count one more held request (admitted by :func:`admit`): demand the operator sees."""
        held = Held(model, size, now, deadline)
        self._held.setdefault(model, {})[held] = None
        self._held_all[held] = None
        self._counts(1, size)
        return held

    def end(self, held: Held, forwarded: bool = False) -> None:
        """The request is no longer held: forwarded (``forwarded``), answered or gone."""
        now = self.clock()
        waiting = self._held.get(held.model)
        if waiting is not None:
            if forwarded and next(iter(waiting)) is held:  # the oldest: how long a wake took
                self._wake_seconds[held.model] = now - held.held_at
            waiting.pop(held, None)
            if not waiting:
                del self._held[held.model]
        self._held_all.pop(held, None)
        self._counts(-1, -held.size)
        self.metrics.load_wait.observe(now - held.held_at)

    def _counts(self, requests: int, size: int) -> None:
        self.count += requests
        self.bytes += size
        self.metrics.held.set(self.count)
        self.metrics.held_bytes.set(self.bytes)
        self.changes.notify()

    def deadline(self, held: Held) -> float:
        """Its own deadline, or the end of the drain when that comes first."""
        if self.ends_at is not None and self.ends_at < held.deadline:
            return self.ends_at
        return held.deadline

    async def wait(self, slot: bool, seconds: float, in_line: bool) -> None:
        """Wait for the next change: in the burst buffer's line for a slot (``slot``), else
        for any change of the fleet."""
        if slot:
            await self.fleet.changes.wait_in_line(seconds, front=in_line)
        else:
            await self.fleet.changes.wait(seconds)

    def expected_wake(self, model: str) -> float | None:
        """How long until ``model`` is routable once a hold begins: its last measured load
        time on a replica, else how long the last hold for it waited for a replica (a wake
        from zero), else unknown."""
        replicas = self.fleet.replicas.values()
        loads = max((r.snapshot.load_seconds.get(model, 0.0) for r in replicas), default=0.0)
        return loads if loads > 0 else self._wake_seconds.get(model)

    def retry_after(self, model: str, full: bool = False) -> int:
        """``Retry-After`` of a 503 for ``model`` (:func:`~tidal.gateway.core.hold.retry_after`):
        the time a replica is still expected to take, judged by the age of the oldest hold for
        the model; ``full``: no later than the oldest held request leaves (room)."""
        waiting = self._held.get(model)
        oldest = next(iter(waiting)) if waiting else None
        first = next(iter(self._held_all)) if full and self._held_all else None
        return retry_after(
            self.clock(),
            expected_wake_s=self.expected_wake(model),
            waiting_since=oldest.held_at if oldest is not None else None,
            room_at=self.deadline(first) if first is not None else None,
        )

    def start_draining(self) -> None:
        """Every hold ends within ``shutdownDrainSeconds`` from now (held requests are
        forwarded if a replica becomes routable by then, else answered 503)."""
        self.draining = True
        self.ends_at = self.clock() + self.config.shutdown_drain_seconds
        self.fleet.changes.notify()  # every held request takes the new deadline

    async def answered(self, within_s: float) -> bool:
        """Wait until no request is held (True), at most ``within_s`` seconds."""
        deadline = self.clock() + within_s
        while self.count > 0:
            left = deadline - self.clock()
            if left <= 0:
                return False
            await self.changes.wait(left)
        return True

    async def watch(self, seen: int, wait_s: float, arrivals: int | None, every_s: float) -> None:
        """Return once the held count differs from ``seen`` (at once if it does), or, with
        ``arrivals``, once the arrival count differs from it and ``every_s`` have passed,
        at the latest after ``wait_s`` (``GET /v2/tidal/held``'s long-poll)."""
        start = self.clock()
        deadline = start + wait_s
        watching = False  # counted in arrival_watchers: an arrival wakes this poll
        try:
            while self.count == seen and not self.draining:
                until = deadline
                if arrivals is not None and self.arrivals != arrivals:
                    until = min(deadline, start + every_s)
                    if watching:
                        self.arrival_watchers -= 1
                        watching = False
                elif arrivals is not None and not watching:
                    self.arrival_watchers += 1
                    watching = True
                left = until - self.clock()
                if left <= 0:
                    break
                await self.changes.wait(left)
        finally:
            if watching:
                self.arrival_watchers -= 1
