"""An open-loop load generator that finds its targets the way kube-proxy would: through the
Service's EndpointSlices, using only endpoints marked ready.

Requests arrive at a rate given as a function of time (a surge is a step in that function), each
one a real Open Inference Protocol request over HTTP. Every request is recorded — when it was
sent, which endpoint took it, how long it took, how it ended — so scenarios can assert on
latency, failures and on which replicas received traffic when. Loops are bounded in time and in
concurrency, and targets are only the sandbox's own pod addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .endpoints import ready_endpoints

RateFn = Callable[[float], float]


@dataclass(frozen=True)
class Sample:
    sent: float  # seconds since the run started (monotonic)
    wall: float  # wall-clock send time (epoch seconds), to compare with Kubernetes timestamps
    latency: float  # seconds
    status: int  # HTTP status, 0 for a connection error or timeout
    endpoint: str
    error: str = ""
    model: str = ""
    # The first endpoint refused the connection (the request never reached it) and the request
    # was sent once more to another (``retry_connect_errors``).
    retried_from: str = ""
    # The model_version of the answer (OIP v2): which version served it ("" when not an answer).
    version: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def answer_version(body: bytes) -> str:
    """An OIP v2 answer's ``model_version`` ("" when the body is not a JSON answer: the binary
    extension puts a JSON header first, which this does not split off)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return ""
    return str(answer.get("model_version", "")) if isinstance(answer, dict) else ""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class LoadReport:
    samples: list[Sample] = field(default_factory=list)
    endpoint_changes: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    # Arrivals not sent because the concurrency cap was reached (each is also a failed sample).
    dropped: int = 0
    scheduled: float = 0.0  # arrivals the schedule owed over the run (its rate's integral)

    def window(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.sent < end]

    def quantile(self, q: float, start: float = 0.0, end: float = math.inf) -> float:
        """The ``q`` quantile of successful requests' latency sent in [start, end)."""
        return percentile([s.latency for s in self.window(start, end) if s.ok], q)

    def p99(self, start: float = 0.0, end: float = math.inf) -> float:
        return self.quantile(0.99, start, end)

    def failures(self, start: float = 0.0, end: float = math.inf) -> list[Sample]:
        return [s for s in self.window(start, end) if not s.ok]

    def first_request_wall(self) -> dict[str, float]:
        """Wall-clock time of the first request each endpoint received."""
        first: dict[str, float] = {}
        for s in sorted(self.samples, key=lambda s: s.wall):
            first.setdefault(s.endpoint.split(":")[0], s.wall)
        return first


class EndpointWatcher:
    """Polls the Service's EndpointSlices in a thread; ``current`` is the ready set."""

    def __init__(self, api_client: Any, namespace: str, service: str, interval: float) -> None:
        self.api_client, self.namespace, self.service = api_client, namespace, service
        self.interval = interval
        self.current: tuple[str, ...] = ()
        self.changes: list[tuple[float, tuple[str, ...]]] = []
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="endpoints")
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                eps = tuple(
                    f"{ip}:{port}"
                    for ip, port in ready_endpoints(self.api_client, self.namespace, self.service)
                )
                if eps != self.current:
                    self.current = eps
                    self.changes.append((time.monotonic() - self._t0, eps))
                self._first.set()
            self._stop.wait(self.interval)

    def start(self, t0: float, first_timeout: float = 5.0) -> None:
        """Start polling; returns once the first answer is in, so the first arrivals do not
        meet an endpoint set that is merely not read yet."""
        self._t0 = t0
        self._thread.start()
        self._first.wait(first_timeout)

    def rebase(self, t0: float) -> None:
        """Re-express recorded change times relative to ``t0``."""
        shift = self._t0 - t0
        self.changes = [(t + shift, eps) for t, eps in self.changes]
        self._t0 = t0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class StaticEndpoints:
    """A fixed target list with the watcher's interface: the generator measured on its own,
    against a local server, with no Service to watch."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.current = endpoints
        self.changes: list[tuple[float, tuple[str, ...]]] = [(0.0, endpoints)]

    def start(self, t0: float, first_timeout: float = 5.0) -> None:
        pass

    def rebase(self, t0: float) -> None:
        pass

    def stop(self) -> None:
        pass


class LoadGenerator:
    """Sends ``rate(t)`` requests per second for ``duration`` seconds to a model.

    ``model`` is a name, or a function of the run's time that names the model of each request
    (a fleet's mix: draw from a popularity distribution that may change over time).
    ``endpoints``: fixed ``host:port`` targets instead of the Service's ready endpoints.
    """

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        service: str,
        model: str | Callable[[float], str],
        body: dict[str, Any],
        rate: RateFn,
        *,
        timeout: float = 10.0,
        max_in_flight: int = 256,
        refresh: float = 0.2,
        on_tick: Callable[[float, LoadReport], None] | None = None,
        retry_connect_errors: bool = False,
        endpoints: tuple[str, ...] | None = None,
    ) -> None:
        self.namespace, self.service, self.model = namespace, service, model
        self.body, self.rate = body, rate
        self.timeout, self.max_in_flight = timeout, max_in_flight
        self.watcher: EndpointWatcher | StaticEndpoints = (
            EndpointWatcher(api_client, namespace, service, refresh)
            if endpoints is None
            else StaticEndpoints(endpoints)
        )
        self.report = LoadReport()
        self.on_tick = on_tick
        # Like a client-side balancer's "retry on connect failure" (Envoy's connect-failure,
        # gRPC's transparent retry): a request whose connection was refused never reached the
        # server, so sending it once more, elsewhere, cannot run it twice.
        self.retry_connect_errors = retry_connect_errors
        self._in_flight: dict[str, int] = {}
        self._random = random.Random()

    @property
    def in_flight(self) -> dict[str, int]:
        """Requests sent and not yet answered, per endpoint."""
        return dict(self._in_flight)

    def _pick(self, exclude: str = "") -> str | None:
        eps = tuple(e for e in self.watcher.current if e != exclude)
        if not eps:
            return None
        # Least outstanding requests, like a good client-side balancer, ties broken at random.
        # (Taking the first of the ties sent a light load, nearly always 0 in flight everywhere,
        # to whichever endpoint the EndpointSlice listed first: a staged rollout's new pods got
        # no traffic and the step waited for samples forever, one CI run in a few.)
        least = min(self._in_flight.get(e, 0) for e in eps)
        return self._random.choice([e for e in eps if self._in_flight.get(e, 0) == least])

    async def _one(self, session: aiohttp.ClientSession, t0: float) -> None:
        endpoint = self._pick()
        sent = time.monotonic() - t0
        wall = time.time()
        model = self.model(sent) if callable(self.model) else self.model
        if endpoint is None:
            self.report.samples.append(
                Sample(sent, wall, 0.0, 0, "", "no ready endpoint", model=model)
            )
            return
        start = time.perf_counter()
        status, error, refused, version = await self._send(session, endpoint, model)
        retried_from = ""
        if refused and self.retry_connect_errors:
            other = self._pick(exclude=endpoint)
            if other is not None:
                retried_from, endpoint = endpoint, other
                status, error, _, version = await self._send(session, endpoint, model)
        latency = time.perf_counter() - start
        self.report.samples.append(
            Sample(sent, wall, latency, status, endpoint, error, model, retried_from, version)
        )

    async def _send(
        self, session: aiohttp.ClientSession, endpoint: str, model: str
    ) -> tuple[int, str, bool, str]:
        """(status, error, connection refused, the answer's model_version) of one attempt."""
        self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
        try:
            url = f"http://{endpoint}/v2/models/{model}/infer"
            async with session.post(url, json=self.body) as resp:
                body = await resp.read()
                if resp.status >= 300:
                    return resp.status, (await resp.text())[:200], False, ""
                return resp.status, "", False, answer_version(body)
        except aiohttp.ClientConnectorError as exc:
            return 0, f"{type(exc).__name__}: {exc}"[:200], True, ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"[:200], False, ""
        finally:
            self._in_flight[endpoint] -= 1

    async def run(self, duration: float) -> LoadReport:
        """Send load for ``duration`` seconds, then wait for the answers."""
        return await self.run_until(lambda t: t >= duration, horizon=duration)

    async def run_until(
        self, done: Callable[[float], bool], horizon: float = math.inf
    ) -> LoadReport:
        """Send load until ``done(seconds since start)`` is true, then wait for the answers.

        Arrivals follow the schedule however late each pass of the loop is: every pass adds
        the integral of ``rate`` over the time that really elapsed (:class:`Schedule`), so a
        pass that overshoots its sleep sends the arrivals it owes at once (a loop that added
        ``rate x its nominal step`` sent 75-93 % of the schedule, least on a loaded machine).
        ``horizon``: the schedule ends there (``run``'s duration), so the last arrivals before
        it are sent even when the loop's last pass comes after it.
        """
        self.watcher.start(time.monotonic())
        t0 = time.monotonic()  # the run's clock starts once the endpoints are known
        self.watcher.rebase(t0)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.max_in_flight, force_close=False)
        tasks: set[asyncio.Task[None]] = set()
        schedule = Schedule(self.rate)
        next_tick = 1.0
        try:
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                while True:
                    now = time.monotonic() - t0
                    for _ in range(schedule.advance(min(now, horizon))):
                        if len(tasks) >= self.max_in_flight:
                            self._drop(now, t0)
                            continue
                        task = asyncio.create_task(self._one(session, t0))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    if done(now):
                        break
                    if self.on_tick is not None and now >= next_tick:
                        next_tick += 1.0
                        self.on_tick(now, self.report)
                    await asyncio.sleep(PACE_S)
                if tasks:
                    await asyncio.wait(tasks, timeout=self.timeout + 1)
        finally:
            self.watcher.stop()
        self.report.scheduled = schedule.total
        self.report.endpoint_changes = list(self.watcher.changes)
        return self.report

    def _drop(self, sent: float, t0: float) -> None:
        """An arrival the in-flight cap kept from being sent: a failed request, not a silence."""
        self.report.dropped += 1
        model = self.model(sent) if callable(self.model) else self.model
        error = f"not sent: {self.max_in_flight} requests in flight already (max_in_flight)"
        self.report.samples.append(Sample(sent, t0 + sent, 0.0, 0, "", error, model=model))


# How often the loop wakes to send what is due. Any value works (the schedule is integrated
# over the time that really elapsed); smaller sends arrivals closer to their due time.
PACE_S = 0.005


class Schedule:
    """The arrivals of an open-loop schedule: how many are due as time passes.

    ``advance(now)`` integrates ``rate`` from the previous call's time to ``now`` in sub-steps
    of at most ``max_step`` seconds (the rate at each sub-step's midpoint, so a step function's
    edge costs at most one sub-step's worth), carries the fraction, and returns the whole
    arrivals now due. The caller passes the time that really elapsed; nothing here reads the
    clock, so it is checked against the exact integral with any sequence of times.
    """

    def __init__(self, rate: RateFn, max_step: float = 0.001) -> None:
        self.rate, self.max_step = rate, max_step
        self.at = 0.0
        self.total = 0.0  # the integral of rate from 0 to ``at``: arrivals owed so far
        self._sent = 0

    def advance(self, now: float) -> int:
        if now > self.at:
            steps = max(1, math.ceil((now - self.at) / self.max_step))
            width = (now - self.at) / steps
            self.total += sum(self.rate(self.at + (i + 0.5) * width) for i in range(steps)) * width
            self.at = now
        due = math.floor(self.total + 1e-9) - self._sent
        self._sent += due
        return due


def step_rate(base: float, surge: float, at: float) -> RateFn:
    """``base`` requests/s until ``at`` seconds, ``surge`` requests/s after."""
    return lambda t: surge if t >= at else base
