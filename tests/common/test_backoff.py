"""The back-off every retry and long-poll loop shares (``tidal.common.backoff``), stepped
without sleeping."""

from __future__ import annotations

import asyncio

import pytest

from tidal.common.backoff import Backoff, Retry


def test_delays_double_from_the_first_up_to_the_cap() -> None:
    policy = Backoff(0.05, 2.0)
    delays = [policy.after(None)]
    for _ in range(8):
        delays.append(policy.after(delays[-1]))
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 6, 7, 50, 5000])
def test_the_nth_delay_is_the_sequences_nth_and_never_overflows(attempt: int) -> None:
    policy = Backoff(2.0, 60.0)
    assert policy.nth(attempt) == min(60.0, 2.0 * 2 ** min(attempt - 1, 64))


def test_jitter_takes_at_most_its_fraction_off() -> None:
    policy = Backoff(1.0, 30.0, jitter=0.25)
    assert policy.jittered(8.0, 0.0) == 8.0
    assert policy.jittered(8.0, 0.5) == 7.0
    assert 6.0 < policy.jittered(8.0, 0.999) <= 8.0


@pytest.mark.parametrize(
    "args", [(0.0, 1.0), (2.0, 1.0), (1.0, 2.0, 0.5), (1.0, 2.0, 2.0, 1.5), (1.0, 2.0, 2.0, -0.1)]
)
def test_a_policy_that_makes_no_sense_is_refused(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Backoff(*args)


def test_a_retry_sleeps_longer_after_each_failure_and_starts_over_after_a_success() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def loop() -> None:
        retry = Retry(Backoff(0.1, 0.5), sleep=sleep)
        for _ in range(4):
            await retry.wait()
        assert retry.delay == 0.5
        retry.reset()
        await retry.wait()
        assert retry.delay == 0.2

    asyncio.run(loop())
    assert slept == [0.1, 0.2, 0.4, 0.5, 0.1]


def test_a_retry_with_jitter_draws_each_wait_but_grows_from_the_plain_delay() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def loop() -> None:
        retry = Retry(Backoff(1.0, 8.0, jitter=0.5), sleep=sleep, draw=lambda: 1.0)
        for _ in range(3):
            await retry.wait()

    asyncio.run(loop())
    assert slept == [0.5, 1.0, 2.0]


def test_the_delay_is_the_current_one_while_a_wait_is_under_way() -> None:
    """What a server reports as Retry-After during the wait: the delay it is waiting."""
    seen: list[float] = []
    retry: Retry

    async def sleep(seconds: float) -> None:
        seen.append(retry.delay)

    retry = Retry(Backoff(1.0, 30.0), sleep=sleep)
    asyncio.run(retry.wait())
    assert seen == [1.0] and retry.delay == 2.0
