"""Batch formation policy of the dynamic batcher (pure: the shell passes ``now``).

A batch is sent when one of these holds, checked in this order:

1. ``full``        the queued rows reach ``max_batch_size``, or the next request would not fit;
2. ``shape``       the next request has different non-batch dimensions (cannot be merged);
3. ``preferred``   the queued rows form exactly one of ``preferred_batch_sizes``;
4. ``delay``       the oldest request has waited ``max_queue_delay`` seconds;
5. otherwise wait until the oldest request's delay runs out (``waiting``).

With batching disabled every request goes alone (``unbatched``).  Requests whose deadline has
passed are split off first (:func:`split_expired`) so they never reach a device.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuedItem:
    """What the policy needs to know of one queued request."""

    arrival: float
    rows: int
    shape_key: Hashable = ()
    deadline: float | None = None


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    enabled: bool = True


@dataclass(frozen=True)
class BatchDecision:
    """Send the first ``count`` queued requests now, or wait until ``wake_at`` (None: forever)."""

    count: int
    rows: int
    wake_at: float | None
    reason: str


def split_expired(items: Sequence[QueuedItem], now: float) -> tuple[list[int], list[int]]:
    """Indices of live and of expired items (deadline at or before ``now``)."""
    live: list[int] = []
    expired: list[int] = []
    for index, item in enumerate(items):
        if item.deadline is not None and item.deadline <= now:
            expired.append(index)
        else:
            live.append(index)
    return live, expired


def decide_batch(items: Sequence[QueuedItem], policy: BatchPolicy, now: float) -> BatchDecision:
    """Decide what to send from the front of the queue; ``items`` are in arrival order."""
    if not items:
        return BatchDecision(0, 0, None, "empty")
    head = items[0]
    if not policy.enabled or policy.max_batch_size <= 1:
        return BatchDecision(1, head.rows, None, "unbatched")
    count = 0
    rows = 0
    stop_reason = ""
    for item in items:
        if item.shape_key != head.shape_key:
            stop_reason = "shape"
            break
        if rows + item.rows > policy.max_batch_size:
            stop_reason = "full"
            break
        count += 1
        rows += item.rows
    if count == 0:
        # A single request larger than the batch limit is refused before it is queued; if one
        # slips through, send it alone rather than block the queue forever.
        return BatchDecision(1, head.rows, None, "oversized")
    if rows >= policy.max_batch_size:
        return BatchDecision(count, rows, None, "full")
    if stop_reason:
        return BatchDecision(count, rows, None, stop_reason)
    if rows in policy.preferred_batch_sizes:
        return BatchDecision(count, rows, None, "preferred")
    due = head.arrival + policy.max_queue_delay
    if now >= due:
        return BatchDecision(count, rows, None, "delay")
    return BatchDecision(0, 0, due, "waiting")


def retry_after_seconds(
    queued_rows: int, max_batch_size: int, recent_batch_seconds: float | None
) -> int:
    """Seconds a client refused for a full queue should wait (HTTP Retry-After, at least 1).

    The time to drain the rows ahead of it at the recently observed batch duration.
    """
    if recent_batch_seconds is None or recent_batch_seconds <= 0:
        return 1
    batches = math.ceil(queued_rows / max(1, max_batch_size))
    return max(1, math.ceil(batches * recent_batch_seconds))
