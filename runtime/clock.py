"""The runtime's one clock: monotonic seconds for durations and deadlines.

Everything else receives time from here (or as an argument), so tests can inject a fake clock
and the pure core never reads it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class MonotonicClock:
    def now(self) -> float:
        return time.perf_counter()


CLOCK: Clock = MonotonicClock()


def utc_timestamp() -> str:
    """Wall time for records (manifests), ISO 8601 in UTC to the second; never for durations."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")
