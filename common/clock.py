"""The one clock of every tidal process: monotonic seconds for intervals and deadlines, wall
seconds for records (timestamps in status, Events, manifests, logs).

Nothing else reads the time: code receives a :class:`Clock` (or a time value read from one) as
an argument, so tests inject a fake clock and the pure cores never read it. A ruff ban
(``TID251`` in pyproject.toml) keeps ``time.time``, ``time.perf_counter`` and
``datetime.now`` out of the programs; ``time.monotonic`` is read here and only here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never jumps: for durations and deadlines."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch: for records only, never for durations."""
        ...


class SystemClock:
    """The process's clocks (``CLOCK_MONOTONIC`` and the real-time clock)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()  # noqa: TID251 -- the one place that reads it


CLOCK: Clock = SystemClock()


def utc_now(clock: Clock = CLOCK) -> datetime:
    """The clock's wall time as an aware UTC datetime."""
    return datetime.fromtimestamp(clock.wall(), UTC)


def utc_timestamp(clock: Clock = CLOCK, timespec: str = "seconds") -> str:
    """Wall time for records (manifests, log lines), ISO 8601 in UTC; never for durations."""
    return utc_now(clock).isoformat(timespec=timespec)
