"""The load generator: its balancing and what it records of an answer (pure: no endpoints
are polled), its schedule (pure, time passed in) and what it really sends against a local
server beside a CPU hog."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.sandbox.loadgen import LoadGenerator, LoadReport, Schedule, answer_version, step_rate


def _generator(endpoints: tuple[str, ...]) -> LoadGenerator:
    generator = LoadGenerator(None, "ns", "svc", "m", {}, lambda t: 1.0)
    generator.watcher.current = endpoints
    return generator


def test_ties_are_spread_over_every_endpoint() -> None:
    # A light load has nothing in flight anywhere: every endpoint must still get its share
    # (taking the first of the ties sent all of it to the EndpointSlice's first address).
    generator = _generator(("a:1", "b:1", "c:1"))
    picks = Counter(generator._pick() for _ in range(3000))
    assert set(picks) == {"a:1", "b:1", "c:1"}
    assert min(picks.values()) > 800, picks


def test_least_outstanding_wins_and_exclude_is_honoured() -> None:
    generator = _generator(("a:1", "b:1", "c:1"))
    generator._in_flight.update({"a:1": 2, "b:1": 0, "c:1": 1})
    assert {generator._pick() for _ in range(50)} == {"b:1"}
    assert {generator._pick(exclude="b:1") for _ in range(50)} == {"c:1"}
    assert _generator(())._pick() is None


# -- the schedule: arrivals owed are the rate's integral over the time that really elapsed ----


def _integral(rate: Callable[[float], float], end: float, dt: float = 1e-4) -> float:
    return sum(rate((i + 0.5) * dt) for i in range(round(end / dt))) * dt


@settings(max_examples=60, deadline=None)
@given(
    base=st.floats(1.0, 50.0),
    surge=st.floats(1.0, 400.0),
    at=st.floats(0.5, 3.0),
    passes=st.lists(st.floats(0.0005, 0.25), min_size=20, max_size=200),
)
def test_schedule_owes_the_integral_whatever_each_pass_overshoots(
    base: float, surge: float, at: float, passes: list[float]
) -> None:
    # A loop whose every pass overshoots its sleep (a loaded machine) still owes exactly the
    # schedule: the old loop added rate x 5 ms per pass and sent 75-93 % of it.
    rate = step_rate(base, surge, at)
    schedule = Schedule(rate)
    now, sent = 0.0, 0
    for elapsed in passes:
        now += elapsed
        sent += schedule.advance(now)
    expected = _integral(rate, now)
    assert abs(sent - expected) <= 1.0 + 1e-3 * expected, (sent, expected, now)
    assert sent == math.floor(schedule.total + 1e-9), (sent, schedule.total)


def test_schedule_never_owes_twice_for_the_same_time() -> None:
    schedule = Schedule(lambda t: 100.0)
    assert schedule.advance(1.0) == 100
    assert schedule.advance(1.0) == 0  # no time passed
    assert schedule.advance(0.5) == 0  # time never runs back
    assert schedule.advance(1.5) == 50


# -- the generator as a whole, against a local server, beside a CPU hog ----------------------


HOG = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"
# A server in its own process (sharing the generator's event loop would measure the server).
SERVER = """
import asyncio, sys
from aiohttp import web

async def infer(request):
    await request.read()
    return web.json_response({"outputs": []})

async def main():
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.timeout(120)
def test_sends_the_schedule_beside_a_cpu_hog() -> None:
    # A busy process beside the generator and its server: each asyncio sleep of the generator
    # overshoots. What it sends must still be its schedule, within 1 %.
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        generator = LoadGenerator(
            None, "ns", "svc", "m", {"inputs": []}, RATE, endpoints=(f"127.0.0.1:{port}",)
        )
        report = asyncio.run(generator.run(DURATION))
    finally:
        for process in (hog, server):
            process.kill()
            process.wait()
    expected = _integral(RATE, DURATION)
    sent = [s for s in report.samples if s.endpoint]
    diagnostics = (
        f"scheduled {report.scheduled:.1f} (exact {expected:.1f}), samples "
        f"{len(report.samples)}, sent {len(sent)}, dropped {report.dropped}, failures "
        f"{Counter(s.error[:60] for s in report.samples if not s.ok).most_common(3)}"
    )
    assert abs(report.scheduled - expected) <= 0.01 * expected, diagnostics
    assert abs(len(sent) - expected) <= 0.01 * expected, diagnostics
    assert all(s.endpoint == f"127.0.0.1:{port}" for s in sent), diagnostics


def test_an_arrival_over_the_in_flight_cap_is_a_failed_request() -> None:
    async def run() -> LoadReport:
        gate = asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            await gate.wait()
            return web.json_response({})

        runner, port = await _serve(handler)
        try:
            generator = LoadGenerator(
                None,
                "ns",
                "svc",
                "m",
                {},
                lambda t: 200.0,
                max_in_flight=5,
                endpoints=(f"127.0.0.1:{port}",),
                timeout=30.0,
            )
            sending = asyncio.create_task(generator.run(0.5))
            await asyncio.sleep(0.7)  # (only to let the run end: the assertions are on counts)
            gate.set()
            return await sending
        finally:
            await runner.cleanup()

    report = asyncio.run(run())
    dropped = [s for s in report.samples if not s.endpoint]
    assert report.dropped == len(dropped) > 0, (report.dropped, len(report.samples))
    assert all(not s.ok and "max_in_flight" in s.error for s in dropped), dropped[:3]
    assert len(report.samples) == math.floor(report.scheduled + 1e-9), (
        len(report.samples),
        report.scheduled,
    )


RATE, DURATION = step_rate(20.0, 80.0, 2.0), 6.0  # 400 arrivals: 1 % is 4


async def _serve(handler: Any) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


def test_each_answer_records_the_model_version_that_served_it() -> None:
    answer = b'{"model_name":"digits","model_version":"3","outputs":[]}'
    assert answer_version(answer) == "3"
    for body in (b"", b"not json", b"[1, 2]", b'{"outputs": []}', b'{"error": "x"}'):
        assert answer_version(body) == "", body
