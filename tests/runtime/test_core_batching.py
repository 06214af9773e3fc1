"""Batch formation policy: tables for each rule, properties for all queues."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.runtime.core.batching import (
    BatchPolicy,
    QueuedItem,
    decide_batch,
    retry_after_seconds,
    split_expired,
)

POLICY = BatchPolicy(max_batch_size=8, max_queue_delay=0.010, preferred_batch_sizes=(4,))


def q(*rows: int, start: float = 0.0, key: object = ()) -> list[QueuedItem]:
    return [
        QueuedItem(arrival=start + i * 0.001, rows=r, shape_key=key) for i, r in enumerate(rows)
    ]


@pytest.mark.parametrize(
    ("items", "now", "count", "reason"),
    [
        ([], 0.0, 0, "empty"),
        (q(1, 1, 1, 1, 1, 1, 1, 1), 0.0, 8, "full"),
        (q(1, 1, 1, 1, 1, 1, 1, 1, 1), 0.0, 8, "full"),
        (q(5, 4), 0.0, 1, "full"),  # the next request does not fit
        (q(1, 1, 1, 1), 0.0, 4, "preferred"),
        (q(1, 1), 0.005, 0, "waiting"),
        (q(1, 1), 0.010, 2, "delay"),
        (q(1, 1, 1), 0.011, 3, "delay"),
        ([QueuedItem(0, 1, "a"), QueuedItem(0, 1, "b")], 0.0, 1, "shape"),
        ([QueuedItem(0, 9)], 0.0, 1, "oversized"),
    ],
)
def test_decide_batch_rules(items: list[QueuedItem], now: float, count: int, reason: str) -> None:
    decision = decide_batch(items, POLICY, now)
    assert (decision.count, decision.reason) == (count, reason)


def test_waiting_wakes_when_the_oldest_delay_runs_out() -> None:
    decision = decide_batch(q(1, 1, start=1.0), POLICY, now=1.004)
    assert decision.wake_at == pytest.approx(1.010)


def test_zero_delay_sends_whatever_is_queued_at_once() -> None:
    policy = BatchPolicy(max_batch_size=8, max_queue_delay=0.0)
    assert decide_batch(q(1, 2), policy, now=0.0).count == 2


def test_disabled_batching_sends_one_request_at_a_time() -> None:
    policy = BatchPolicy(max_batch_size=8, enabled=False)
    decision = decide_batch(q(1, 1, 1), policy, now=0.0)
    assert (decision.count, decision.reason) == (1, "unbatched")


def test_split_expired_separates_requests_past_their_deadline() -> None:
    items = [QueuedItem(0, 1, deadline=1.0), QueuedItem(0, 1), QueuedItem(0, 1, deadline=3.0)]
    assert split_expired(items, now=2.0) == ([1, 2], [0])


@pytest.mark.parametrize(
    ("rows", "max_batch", "seconds", "expected"),
    [(0, 8, None, 1), (64, 8, 0.5, 4), (1, 8, 0.01, 1), (100, 10, 0.25, 3)],
)
def test_retry_after_estimates_the_drain_time(
    rows: int, max_batch: int, seconds: float | None, expected: int
) -> None:
    assert retry_after_seconds(rows, max_batch, seconds) == expected


queues = st.lists(
    st.builds(
        QueuedItem,
        arrival=st.floats(0, 1),
        rows=st.integers(1, 8),
        shape_key=st.sampled_from(["a", "b"]),
    ),
    max_size=20,
).map(lambda items: sorted(items, key=lambda i: i.arrival))
policies = st.builds(
    BatchPolicy,
    max_batch_size=st.integers(1, 16),
    max_queue_delay=st.floats(0, 0.1),
    preferred_batch_sizes=st.lists(st.integers(1, 16), max_size=3).map(tuple),
)


@given(queues, policies, st.floats(0, 2))
def test_a_batch_is_a_mergeable_prefix_within_the_limit(
    items: list[QueuedItem], policy: BatchPolicy, now: float
) -> None:
    decision = decide_batch(items, policy, now)
    assert 0 <= decision.count <= len(items)
    sent = items[: decision.count]
    assert decision.rows == sum(i.rows for i in sent)
    assert len({i.shape_key for i in sent}) <= 1
    if decision.count > 1:
        assert decision.rows <= policy.max_batch_size


@given(queues, policies, st.floats(0, 2))
def test_it_only_waits_when_the_oldest_request_still_has_time(
    items: list[QueuedItem], policy: BatchPolicy, now: float
) -> None:
    decision = decide_batch(items, policy, now)
    if items and decision.count == 0:
        assert decision.wake_at is not None and decision.wake_at > now
        assert sum(i.rows for i in items) < policy.max_batch_size
