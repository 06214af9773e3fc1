"""RequestAccounting: one infer request's bookkeeping, shared by the HTTP and gRPC transports."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from tidal.runtime.enginecache import ChangeFeed
from tidal.runtime.errors import InvalidInput, Overloaded
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.server import RequestAccounting


@dataclass
class _Slot:
    outstanding: int = 0
    requests: int = 0


@dataclass
class _Cache:
    slots: dict[str, _Slot] = field(default_factory=lambda: {"m": _Slot()})
    first: bool = False

    def take_first_request(self, name: str) -> bool:
        first, self.first = self.first, False
        return first


class _Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t


class _Runtime:
    def __init__(self) -> None:
        self.clock = _Clock()
        self.metrics = RuntimeMetrics()
        self.cache = _Cache()
        self.arrivals = ChangeFeed()

    def wall(self) -> float:
        return 1_700_000_000.0

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def _account(runtime: _Runtime, outcome: BaseException | int, cold: bool = False) -> None:
    """One request ending in ``outcome`` (a code set by the transport, or an exception)."""
    during: dict[str, float] = {}
    try:
        with RequestAccounting(runtime, "m") as accounting:  # type: ignore[arg-type]
            during["inflight"] = runtime.sample("tidal_inflight_requests")
            during["outstanding"] = runtime.cache.slots["m"].outstanding
            accounting.cold = cold
            runtime.clock.t += 0.25
            if isinstance(outcome, BaseException):
                raise outcome
            accounting.code = outcome
    except BaseException as error:
        if error is not outcome:
            raise
    assert during == {"inflight": 1, "outstanding": 1}


@pytest.mark.parametrize(
    ("outcome", "code", "success", "fail"),
    [
        (200, "200", 1, 0),
        (InvalidInput("bad"), "400", 0, 1),
        (Overloaded("full", retry_after=1), "503", 0, 1),
        (asyncio.CancelledError(), "499", 0, 0),  # the client went away: not a failure
        (ConnectionResetError(), "499", 0, 0),
        (RuntimeError("bug"), "500", 0, 1),
    ],
)
def test_every_outcome_is_counted_once_under_its_code(
    outcome: BaseException | int, code: str, success: int, fail: int
) -> None:
    runtime = _Runtime()
    _account(runtime, outcome)
    assert runtime.sample("tidal_inflight_requests") == 0
    assert runtime.cache.slots["m"].outstanding == 0
    assert runtime.cache.slots["m"].requests == 1
    assert runtime.arrivals.generation == 1  # GET /v2/tidal/activity: one arrival, any outcome
    assert runtime.sample("tidal_requests_total", model="m", code=code) == 1
    assert runtime.sample(
        "tidal_request_duration_seconds_sum", model="m", cache="hot", code=code
    ) == pytest.approx(0.25)
    stats = runtime.metrics.stats_for("m")
    assert (stats.success.count, stats.fail.count) == (success, fail)
    assert stats.last_inference_ms == (1_700_000_000_000 if success else 0)


def test_the_first_cold_success_is_the_cold_start() -> None:
    runtime = _Runtime()
    runtime.cache.first = True
    _account(runtime, 200, cold=True)
    _account(runtime, 200, cold=True)
    assert runtime.sample("tidal_cold_start_seconds_count", model="m") == 1
    assert runtime.sample("tidal_requests_total", model="m", code="200") == 2
    assert (
        runtime.sample("tidal_request_duration_seconds_count", model="m", cache="cold", code="200")
        == 2
    )


def test_an_unknown_model_counts_only_as_inflight() -> None:
    runtime = _Runtime()
    with pytest.raises(InvalidInput), RequestAccounting(runtime, "nope"):  # type: ignore[arg-type]
        assert runtime.sample("tidal_inflight_requests") == 1
        raise InvalidInput("unknown model")
    assert runtime.sample("tidal_inflight_requests") == 0
    assert runtime.sample("tidal_requests_total", model="nope", code="400") == 0
