"""Exponential back-off: the one delay sequence of tidal's retry and long-poll loops.

A loop that fails waits ``first_seconds``, then each wait ``factor`` times the one before, up to
``max_seconds``; a success starts it over. :class:`Backoff` is that policy, pure: each delay
from the one before (`Backoff.after`), the n-th at once (`Backoff.nth`), and `Backoff.jittered`
with the random draw passed in. :class:`Retry` is one loop's place in the sequence; its
`Retry.wait` sleeps through an injected ``sleep``, so a test steps it without sleeping.

Its users: the gateway's hot-set long-poll of each replica (``gateway.server``), the operator's
long-poll of each gateway pod's held count (``operator.shell.fleet``), its reconciler's per-key
retry delay (``operator.shell.reconciler``) and its scrape back-off of a pod that does not answer
(``operator.core.signals``), the runtime's preload retries (``runtime.server``) and
pinned-model retries (``runtime.enginecache``). Pure (no I/O, no clock), so cores may use it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays that start at ``first_seconds`` and grow ``factor``-fold up to ``max_seconds``;
    ``jitter``: the fraction of each delay a random draw may take off (0: none)."""

    first_seconds: float
    max_seconds: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.first_seconds <= self.max_seconds:
            raise ValueError("need 0 < first_seconds <= max_seconds")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("need factor >= 1 and 0 <= jitter <= 1")

    def after(self, delay: float | None) -> float:
        """The delay that follows ``delay`` (None: the first)."""
        if delay is None:
            return self.first_seconds
        return min(delay * self.factor, self.max_seconds)

    def nth(self, attempt: int) -> float:
        """The delay before retry ``attempt`` (1: the first), however many failed before."""
        delay = self.first_seconds
        for _ in range(attempt - 1):
            if delay >= self.max_seconds:
                break
            delay = self.after(delay)
        return delay

    def jittered(self, delay: float, draw: float) -> float:
        """``delay`` less up to ``jitter`` of it; ``draw`` in [0, 1) (``random.random()``)."""
        return delay * (1.0 - self.jitter * draw)


class Retry:
    """One loop's back-off: `wait` after a failure (each wait longer), `reset` after a success.

    ``delay`` is the wait the next failure gets (the runtime reports it as ``Retry-After``)."""

    def __init__(
        self,
        policy: Backoff,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self.delay = policy.first_seconds
        self._sleep, self._draw = sleep, draw

    def reset(self) -> None:
        self.delay = self.policy.first_seconds

    async def wait(self) -> None:
        """Sleep the current delay (jittered), then make the next one longer."""
        delay = self.delay
        if self.policy.jitter:
            await self._sleep(self.policy.jittered(delay, self._draw()))
        else:
            await self._sleep(delay)
        self.delay = self.policy.after(delay)
