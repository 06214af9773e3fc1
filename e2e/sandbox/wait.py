"""Waiting for a condition with a deadline instead of fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The condition did not hold before the deadline; ``last`` is the last value seen."""

    def __init__(self, what: str, timeout: float, last: object) -> None:
        super().__init__(f"timed out after {timeout:.1f}s waiting for {what}; last value: {last!r}")
        self.last = last


def wait_for(
    fn: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
    describe: Callable[[], object] | None = None,
) -> T:
    """Call ``fn`` until it returns a truthy value and return that value.

    Exceptions raised by ``fn`` count as "not yet" (the last one is reported on timeout), so a
    caller can poll an API that 404s until an object appears. ``describe``, when given, is
    called at the deadline and its value reported as the last one: the state that explains a
    falsy ``fn`` (say, an object's status when ``fn`` only says "not Ready yet").
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except Exception as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            if describe is not None and not isinstance(last, Exception):
                try:
                    last = describe()
                except Exception as exc:
                    last = exc
            raise WaitTimeout(what, timeout, last)
        time.sleep(interval)
