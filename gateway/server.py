"""The gateway's imperative shell: OIP v2 over aiohttp, forwarding, holding, loads, watchers.

* **Forwarding** (the hot path): the body is read once and sent on byte for byte with the
  headers that carry its meaning (``Content-Type``, ``Inference-Header-Content-Length``,
  ``Content-Encoding``); the answer comes back the same way.  No tensor is decoded, no JSON
  parsed; forwards travel on keep-alive connections of :mod:`tidal.gateway.upstream` (a lean
  HTTP/1.1 client: aiohttp's client cost more CPU per request than the runtime's whole work).
* **Routing** is :func:`~tidal.gateway.core.routing.choose_route` over a cached
  :class:`~tidal.gateway.core.routing.ReplicaView` per replica.
* **Holding**: a request for a cold model waits on :class:`Changes` (woken by every hot-set
  change and every load that ends, never by a timer loop) and is routed again, until it can be
  forwarded or its deadline passes (``holdTimeoutSeconds``, or the request's own ``timeout``
  parameter if smaller): then 503 with ``Retry-After``.  What may be held, for how long, within
  which bounds (``maxHeldRequests``, ``maxHeldBytes``: one more is a 503 at once) and the
  ``Retry-After`` of every 503 on the way are :mod:`tidal.gateway.core.hold`'s decisions: a
  request no model could serve is a 400 at once (never held, never demand), a client that
  hangs up while held leaves at once (its slot freed, never forwarded), and on SIGTERM every
  held request is answered by the end of ``shutdownDrainSeconds`` (forwarded if a replica is
  routable, else 503).  ``GET /v2/tidal/held`` long-polls their count, which is how the
  operator learns of demand at a service scaled to zero (``activator``: ready with no replica,
  so the Service keeps an endpoint to hold requests at).
* **Failures**: a forward that fails before any answer (connection refused or reset, replica
  gone, or a 502/503 from it) is retried once on another replica; then a clear 502/503.  Where
  the request may be held, a replica's 503 also marks that replica as refusing the model for
  ``refusedCooldownSeconds`` (its loads go elsewhere) and earns the request one more replica.
* **Watchers**: one task per replica long-polls ``GET /v2/tidal/models`` on a (control)
  aiohttp session of that replica's own (closed when the replica is forgotten, so a new
  replica at a reused address never inherits a dead connection), so a hot-set change reaches
  the routing table within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from tidal.common.backoff import Backoff, Retry
from tidal.common.body import (
    CONTROL_JSON_VALUES,
    CONTROL_LIMIT,
    OFFLOAD_BYTES,
    check_json_values,
)
from tidal.common.http import (
    CLIENT_CLOSED,
    ON_CLIENT_GONE,
    BodyError,
    JsonErrorRunner,
    declared_too_large,
    json_error,
    parse_json,
    quiet_logger,
    read_body,
)
from tidal.common.offload import Offload

from . import EXTENSIONS, SERVER_NAME, __version__
from .config import GatewayConfig, ReplicaList, ReplicaRef, format_validation_error
from .core.hold import (
    HoldLimits,
    admit,
    hold_seconds,
    judge_held_request,
    retry_after,
)
from .core.routing import LoadBudget, ReplicaView, Route, choose_route
from .core.views import (
    NO_LOADS,
    OwnLoads,
    Snapshot,
    free_bytes,
    model_bytes,
    parse_snapshot,
    replica_view,
    waiting_on,
    with_hot,
    without_model,
)
from .metrics import GatewayMetrics
from .upstream import UpstreamError, UpstreamPool

log = logging.getLogger("tidal.gateway")
http_log = quiet_logger("tidal.gateway.http")  # aiohttp's protocol-level errors

HEADER_LENGTH = "Inference-Header-Content-Length"
# Headers that carry the meaning of a body: forwarded both ways, nothing else is.
REQUEST_HEADERS = ("Content-Type", HEADER_LENGTH, "Content-Encoding", "Accept-Encoding", "Accept")
# Raw (lower-case) name -> the name forwarded; values go on byte for byte (latin-1 both ways).
FORWARDED = {name.lower().encode(): name for name in REQUEST_HEADERS}
RETRIED_STATUSES = frozenset({502, 503})  # from a replica, before any byte of an answer
WATCH_BACKOFF = Backoff(first_seconds=0.05, max_seconds=2.0)
MAX_LONG_POLL_S = 30.0  # longest a GET /v2/tidal/held?seen=… waits for a change
HOLDS_ANSWERED_S = 5.0  # after the drain: how long the last held answers may take to leave
# A replica that cannot be reached or answers nonsense: unhealthy until it answers again.
WATCH_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError, TypeError)
UNKNOWN_LABEL = "(unknown)"  # metrics label of names no replica serves (bounded cardinality)


def error(status: int, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_error(status, message, headers)


def body_error(exc: BodyError) -> web.Response:
    response = error(exc.status, exc.message)
    if exc.status in (408, 413, CLIENT_CLOSED):
        response.force_close()  # what is left of the body is not worth reading
    return response


COUNTED = web.RequestKey("tidal_counted", bool)  # the handler counted its answer itself
MAX_REQUEST_BYTES = web.AppKey("tidal_max_request_bytes", int)
NO_MODEL_LABEL = "(none)"  # metrics label of answers on routes that name no model


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every answer is JSON (no route, wrong method, body too large, crashes) and every answer
    a handler did not count itself (errors of the other routes) is counted here."""
    started = asyncio.get_running_loop().time()
    response: web.StreamResponse
    refused = declared_too_large(request, request.app[MAX_REQUEST_BYTES])
    try:
        if refused is not None:  # before reading a byte of it
            raise refused
        response = await handler(request)
    except BodyError as exc:
        if exc.status == CLIENT_CLOSED:
            log.debug("%s %s: %s", request.method, request.path, exc.message)
        response = body_error(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            response = error(405, f"{request.method} is not allowed on {request.path}: {allowed}")
            response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        elif isinstance(exc, web.HTTPNotFound):
            response = error(404, f"no endpoint {request.method} {request.path}")
        elif exc.status == 413:
            response = error(413, "request body is larger than maxRequestBytes")
        else:
            response = error(exc.status, f"{exc.reason}: {request.method} {request.path}")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the process must survive anything a client sends
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = error(500, f"internal error: {exc}")
    if response.status >= 400 and not request.get(COUNTED):
        gateway: Gateway = request.app[GATEWAY]
        model = request.match_info.get("model")
        gateway.metrics.answered(
            gateway._model_label(model) if model else NO_MODEL_LABEL,
            response.status,
            "hot",
            asyncio.get_running_loop().time() - started,
        )
    return response


class Changes:
    """Wakes every waiter at the next change of the fleet's state (no polling loop), and the
    burst buffer's line: requests waiting for a free slot on a hot replica, oldest first.

    A freed slot (an answer) wakes only the oldest in line (``notify_one``): waking every held
    request at each answer would cost O(held) per answer in a herd. A change of the fleet (a
    replica added, a snapshot) wakes everyone, the line included: the new room is unknown here.
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._line: deque[asyncio.Future[None]] = deque()

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None
        line, self._line = self._line, deque()
        for waiter in line:
            if not waiter.done():
                waiter.set_result(None)

    def notify_one(self) -> None:
        """A slot freed: the oldest request in line tries again (the others keep waiting)."""
        while self._line:
            waiter = self._line.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    @property
    def in_line(self) -> int:
        return sum(1 for waiter in self._line if not waiter.done())

    async def wait_in_line(self, seconds: float, front: bool) -> None:
        """Wait for a slot (or a change, or ``seconds``); ``front``: a request that was woken
        and found the slot taken keeps its place ahead of later ones."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if front:
            self._line.appendleft(waiter)
        else:
            self._line.append(waiter)
        try:
            async with asyncio.timeout(seconds):
                await waiter
        except TimeoutError:
            pass
        finally:
            if not waiter.done():
                waiter.cancel()  # leaves the line (skipped when reached)

    async def wait(self, seconds: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()


@dataclass(eq=False)
class Replica:
    """One runtime replica as the gateway knows it; its view is rebuilt only when it changes."""

    name: str
    url: str
    pool: UpstreamPool
    healthy: bool = False
    snapshot: Snapshot = field(default_factory=Snapshot)  # its last GET /v2/tidal/models
    outstanding: int = 0
    own_loads: OwnLoads = NO_LOADS  # loads asked for here, not answered yet
    refused: set[str] = field(default_factory=set)
    # Refused models the replica said room for exists once some requests end ("waitingOn"):
    # asked again at its next snapshot (its long-poll moves when they end), not after the
    # refusal cooldown (issue 45).
    refused_until_change: set[str] = field(default_factory=set)
    last_error: str | None = None
    watcher: asyncio.Task[None] | None = None
    # Long-polls and loads go on a session of the replica's own, closed with it: a pooled
    # connection to a forgotten replica must never serve a new one that reuses its address
    # (a dead peer's connection can hang a request for seconds).
    control: aiohttp.ClientSession | None = None
    slots_per_concurrency: float = 0.0  # the burst buffer's bound (GatewayConfig)
    _view: ReplicaView | None = None

    @property
    def generation(self) -> int:
        return self.snapshot.generation

    @property
    def models(self) -> frozenset[str]:
        return self.snapshot.models

    @property
    def hot(self) -> frozenset[str]:
        return self.snapshot.hot

    @property
    def loading(self) -> frozenset[str]:
        return self.snapshot.loading

    @property
    def load_seconds(self) -> Mapping[str, float]:
        return self.snapshot.load_seconds

    def invalidate(self) -> None:
        self._view = None

    def view(self) -> ReplicaView:
        cached = self._view
        if cached is not None and cached.outstanding == self.outstanding:
            return cached
        cached = self._view = replica_view(
            self.name,
            self.snapshot,
            healthy=self.healthy,
            outstanding=self.outstanding,
            own=self.own_loads,
            refused=frozenset(self.refused),
            slots_per_concurrency=self.slots_per_concurrency,
        )
        return cached

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "healthy": self.healthy,
            "generation": self.generation,
            "hot": sorted(self.hot),
            "loading": sorted(self.loading | self.own_loads.models),
            "outstanding": self.outstanding,
            "requestSlots": self.view().request_slots,
            "freeBytes": free_bytes(self.snapshot, self.own_loads),
            "budgetBytes": self.snapshot.budget_bytes,
            "loadQueue": self.snapshot.load_queue,
            "loadSlots": self.snapshot.load_slots,
            "refused": sorted(self.refused),
            "lastError": self.last_error,
        }


@dataclass(eq=False)
class Held:
    """One request held now (HTTP or gRPC): what it weighs and when it must be answered."""

    model: str
    size: int
    held_at: float
    deadline: float


@dataclass(eq=False)
class ClientWatch:
    """A held HTTP request's client: :func:`client_gone` runs when it hangs up (the
    connection's ``ON_CLIENT_GONE``); a hold waiting then is cancelled and lets it go."""

    waiting: asyncio.Task[Any] | None = None  # the handler's task while it waits in the hold
    gone: bool = False
    refused: bool = False  # judged before the hold as a request no model serves (never held)
    arrived: bool = False  # counted in ``arrivals`` (judged servable before the hold)

    def client_gone(self) -> None:
        self.gone = True
        if self.waiting is not None:
            self.waiting.cancel()


@dataclass(frozen=True)
class LoadFailure:
    """A load that failed for a reason other than room (a broken engine): held requests get it."""

    at: float
    status: int
    body: bytes
    content_type: str


@dataclass(frozen=True)
class Failed:
    """A forward that failed before any answer; ``response`` is a replica's own 502/503."""

    kind: str
    detail: str
    response: web.Response | None = None


def _is_503(failure: Failed) -> bool:
    return failure.response is not None and failure.response.status == 503


class Gateway:
    """The gateway's state: replicas, placement hints, sessions, metrics, readiness."""

    def __init__(self, config: GatewayConfig, replicas: Sequence[ReplicaRef] = ()) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.replicas: dict[str, Replica] = {}
        self.placement: dict[str, tuple[str, ...]] = {}
        self.known = frozenset(config.models)
        self.loads = LoadBudget(config.max_loads_per_replica, config.max_loads_total)
        self.changes = Changes()
        # Requests held now, and a wake-up for the operator's long-poll of that count.
        self.held_now = 0
        self.held_bytes = 0
        self.held_changes = Changes()
        # Infer requests received since the gateway started (HTTP and gRPC, held or not): the
        # count the operator's scale-to-zero forecast learns from, every arrival once.
        self.arrivals = 0
        # Long-polls waiting for the arrival count to move (``GET /v2/tidal/held?arrivals=``):
        # an arrival wakes them (once each: then they wait for their ``every``).
        self.arrival_watchers = 0
        self._held: dict[str, dict[Held, None]] = {}  # per model, oldest first
        self._held_all: dict[Held, None] = {}  # oldest first
        self._wake_seconds: dict[str, float] = {}  # the last wait of a hold until routable
        self.hold_limits = HoldLimits(config.max_held_requests, config.max_held_bytes)
        self.draining = False
        self.holds_end_at: float | None = None  # set on SIGTERM: no hold lasts past it
        self.name = os.environ.get("POD_NAME") or "tidal-gateway"
        self._initial = list(replicas)
        self._load_failures: dict[str, LoadFailure] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Large or compressed bodies on the hold path are judged in a worker process, one at
        # a time: their parse never stalls the loop (health, forwards), its memory is bounded.
        self.offload = Offload(workers=1)

    # -- lifecycle ----------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[json_errors],
            handler_args={"logger": http_log},
        )
        app[GATEWAY] = self
        app[MAX_REQUEST_BYTES] = self.config.max_request_bytes
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        r = app.router
        # The router tries routes in order: the hot path first.
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_post(prefix + "/infer", self.infer)
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/v2/repository/index", self.repository_index)
        r.add_get("/v2/tidal/replicas", self.get_replicas)
        r.add_put("/v2/tidal/replicas", self.put_replicas)
        r.add_get("/v2/tidal/held", self.get_held)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.proxy_metadata)
            r.add_get(prefix + "/config", self.proxy_metadata)
            r.add_get(prefix + "/stats", self.proxy_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()
        self.set_replicas(self._initial, {})

    async def _on_cleanup(self, app: web.Application) -> None:
        self.offload.close()
        tasks = [r.watcher for r in self.replicas.values() if r.watcher is not None]
        tasks += list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for replica in self.replicas.values():
            replica.pool.close()
            if replica.control is not None:
                await replica.control.close()

    def start_draining(self) -> None:
        """Not ready from now on; every hold ends within ``shutdownDrainSeconds`` (held
        requests are forwarded if a replica becomes routable by then, else answered 503),
        so the process exits within the pod's grace period, not at the hold deadlines."""
        self.draining = True
        self.holds_end_at = self.loop.time() + self.config.shutdown_drain_seconds
        self.changes.notify()  # every held request takes the new deadline

    async def holds_answered(self, within_s: float) -> bool:
        """Wait until no request is held (True), at most ``within_s`` seconds."""
        deadline = self.loop.time() + within_s
        while self.held_now > 0:
            left = deadline - self.loop.time()
            if left <= 0:
                return False
            await self.held_changes.wait(left)
        return True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the gateway has not started"
        return self._loop

    # -- replicas -----------------------------------------------------------------------------

    def set_replicas(
        self, refs: Iterable[ReplicaRef], placement: dict[str, list[str]] | None
    ) -> None:
        """Replace the replica list (level-triggered): watch new ones, forget removed ones."""
        wanted = {ref.name: ref for ref in refs}
        kept: dict[str, Replica] = {}
        for name, replica in self.replicas.items():
            ref = wanted.get(name)
            if ref is not None and ref.url == replica.url:
                kept[name] = replica
            else:
                if replica.watcher is not None:
                    replica.watcher.cancel()
                replica.pool.close()
                if replica.control is not None:
                    task = asyncio.create_task(replica.control.close())
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
        limit = self.config.max_connections_per_replica
        for name, ref in wanted.items():
            if name not in kept:
                kept[name] = Replica(
                    name=name,
                    url=ref.url,
                    pool=UpstreamPool(ref.url, limit),
                    slots_per_concurrency=self.config.slots_per_concurrency,
                )
                self._watch(kept[name])
        if list(wanted) != list(self.replicas):
            log.info("replicas: %s", ", ".join(f"{n} ({r.url})" for n, r in wanted.items()))
        self.replicas = {name: kept[name] for name in wanted}
        if placement is not None:
            self.placement = {model: tuple(names) for model, names in placement.items()}
        self._replicas_changed()

    def _replicas_changed(self) -> None:
        healthy = sum(1 for r in self.replicas.values() if r.healthy)
        self.metrics.replicas.labels("healthy").set(healthy)
        self.metrics.replicas.labels("unhealthy").set(len(self.replicas) - healthy)
        self.changes.notify()

    @staticmethod
    def _control_session(replica: Replica) -> aiohttp.ClientSession:
        if replica.control is None:
            replica.control = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=16),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return replica.control

    def _watch(self, replica: Replica) -> None:
        if replica.watcher is not None:
            replica.watcher.cancel()
        replica.watcher = asyncio.create_task(self._watcher(replica), name=f"watch-{replica.name}")

    def _mark_unhealthy(self, replica: Replica, reason: str) -> None:
        """A forward or load to it failed: stop routing there and re-check it at once."""
        replica.last_error = reason
        if replica.healthy:
            log.warning("replica %s (%s) is unhealthy: %s", replica.name, replica.url, reason)
            replica.healthy = False
            replica.invalidate()
            if self.replicas.get(replica.name) is replica:
                self._watch(replica)  # a fresh poll answers at once, whatever the generation
            self._replicas_changed()

    async def _watcher(self, replica: Replica) -> None:
        """Long-poll the replica's hot set for as long as it is in the list."""
        control = self._control_session(replica)
        retry = Retry(WATCH_BACKOFF)
        since: int | None = None
        wait = self.config.watch_wait_seconds
        url = f"{replica.url}/v2/tidal/models"
        while True:
            params = {} if since is None else {"since": str(since), "wait": str(wait)}
            try:
                async with control.get(
                    url, params=params, timeout=aiohttp.ClientTimeout(total=wait + 10)
                ) as response:
                    if response.status != 200:
                        text = (await response.text())[:200]
                        raise ValueError(f"GET /v2/tidal/models answered {response.status}: {text}")
                    snapshot = await response.json()
                self._apply_snapshot(replica, snapshot)
                since = int(snapshot["generation"])
                retry.reset()
            except asyncio.CancelledError:
                raise
            except (
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                ValueError,
                KeyError,
                TypeError,
            ) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if replica.healthy or replica.last_error != reason:
                    log.info("watching %s (%s): %s", replica.name, replica.url, reason)
                replica.last_error = reason
                since = None
                if replica.healthy:
                    replica.healthy = False
                    replica.invalidate()
                    self._replicas_changed()
                await retry.wait()

    def _apply_snapshot(self, replica: Replica, document: dict[str, Any]) -> None:
        snapshot = parse_snapshot(document)
        if snapshot.ready != replica.healthy:
            log.info("replica %s is %s", replica.name, "healthy" if snapshot.ready else "not ready")
        if replica.refused_until_change and snapshot.generation != replica.generation:
            replica.refused -= replica.refused_until_change  # the room may be there now
            replica.refused_until_change.clear()
        replica.snapshot = snapshot
        replica.healthy = snapshot.ready
        replica.last_error = None
        replica.invalidate()
        self._replicas_changed()

    # -- routing ------------------------------------------------------------------------------

    def route(
        self, model: str, excluded: frozenset[str] = frozenset(), *, may_wait: bool = True
    ) -> Route:
        views = [r.view() for r in self.replicas.values()]
        if excluded:
            views = [replace(v, healthy=False) if v.name in excluded else v for v in views]
        return choose_route(
            model,
            views,
            self.loads,
            self.placement,
            busy_outstanding=self.config.busy_outstanding,
            known_models=self.known,
            model_bytes=self._model_bytes(model),
            wait_for_slot=may_wait,
        )

    def _model_bytes(self, model: str) -> int:
        return model_bytes((r.snapshot for r in self.replicas.values()), model)

    def _model_label(self, model: str) -> str:
        if self.known:
            return model if model in self.known else UNKNOWN_LABEL
        return model if any(model in r.models for r in self.replicas.values()) else UNKNOWN_LABEL

    # -- forwarding ---------------------------------------------------------------------------

    async def _forward(
        self,
        replica: Replica,
        method: str,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
    ) -> web.Response | Failed:
        replica.outstanding += 1
        try:
            async with asyncio.timeout(self.config.upstream_timeout_seconds):
                answer = await replica.pool.request(method, path, body, headers)
        except UpstreamError as exc:
            return self._failed(replica, exc.kind, exc)
        except TimeoutError:
            self.metrics.upstream_error["timeout"].inc()
            return error(
                504,
                f"replica {replica.name} did not answer within upstreamTimeoutSeconds "
                f"({self.config.upstream_timeout_seconds:g} s)",
            )
        finally:
            replica.outstanding -= 1
            self.changes.notify_one()  # a slot is free: the oldest request in line takes it
        response = web.Response(body=answer.body, status=answer.status, headers=answer.headers)
        if answer.status in RETRIED_STATUSES:
            self.metrics.upstream_error["unavailable"].inc()
            detail = f"replica {replica.name} answered {answer.status}"
            return Failed("unavailable", detail, response)
        return response

    def _failed(self, replica: Replica, kind: str, exc: BaseException) -> Failed:
        self.metrics.upstream_error[kind].inc()
        detail = f"replica {replica.name} ({replica.url}): {exc}"
        self._mark_unhealthy(replica, detail)
        return Failed(kind, detail)

    async def dispatch(
        self,
        model: str,
        method: str,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        hold: bool,
        client: ClientWatch | None = None,
    ) -> tuple[web.Response, bool]:
        """Route, forward, retry once, hold for a cold model; returns (answer, was held).

        ``client``: an HTTP infer request's client, whose body is checked before it is held
        (a 400 at once for what no model accepts) and who leaves the hold if it hangs up."""
        if hold and client is None:  # an HTTP request counts once judged servable (infer)
            self.arrived()
        failures: list[Failed] = []
        excluded: frozenset[str] = frozenset()
        held: Held | None = None
        holding = False  # counted in held_now: from the first hold until forwarded or answered
        outcome = "other"
        in_line = False  # waited for a slot (the burst buffer) and was woken or timed out
        cold = False  # held for a model that was not hot (else only for a slot)
        try:
            while True:
                if client is not None and client.gone and held is not None:
                    outcome = "gone"
                    return self._gone(), True
                route = self.route(model, excluded, may_wait=hold)
                if route.action == "reject" and excluded:
                    route = self.route(model, may_wait=hold)  # the failed one, once healthy
                self.metrics.decision[route.reason].inc()
                target = route.replica if (route.action == "forward" or not hold) else None
                if target is not None:
                    if holding and held is not None:  # forwarded: the replica's, not held
                        holding = False
                        self._hold_end(held, forwarded=True)
                    if route.extra_load is not None:
                        self._start_load(route.extra_load, model)
                    answer = await self._forward(self.replicas[target], method, path, body, headers)
                    if not isinstance(answer, Failed):
                        outcome = "forwarded"
                        # held for a slot alone, the model was hot: not a cold request
                        return answer, held is not None and cold
                    failures.append(answer)
                    refused = hold and answer.response is not None and answer.response.status == 503
                    if refused:  # no room or no capacity there now: load elsewhere for a while
                        self._refuse(self.replicas[target], model)
                    # A request that may be held gets one more replica after a replica's 503: a
                    # replica killed mid-request, then a copy the gateway saw hot but evicted in
                    # the meantime, must not fail a request that a third replica can load.
                    if len(failures) == (3 if hold and any(_is_503(f) for f in failures) else 2):
                        return self._give_up(model, failures), held is not None
                    excluded = excluded | {target}
                    continue
                if route.status == 404:
                    return error(404, f"unknown model {model!r}"), held is not None
                if not hold:
                    return self._not_ready(model, route, 0.0), False
                now = self.loop.time()
                if held is None:
                    timeout_us = None
                    if client is not None and client.gone:  # never held, never demand
                        return self._gone(), False
                    if client is not None:  # judged before it may count as demand
                        try:
                            timeout_us = await self._judge(body, headers, client)
                        except BodyError as exc:
                            return body_error(exc), False
                    refusal = admit(self.held_now, self.held_bytes, len(body), self.hold_limits)
                    if refusal is not None:
                        self.metrics.hold_outcome["full"].inc()
                        return self._full(model, route.reason, refusal), False
                    seconds = hold_seconds(self.config.hold_timeout_seconds, timeout_us)
                    held = self.hold_begin(model, len(body), now, now + seconds)
                    holding = True
                failure = self._load_failures.get(model)
                if failure is not None and failure.at >= held.held_at:
                    headers_out = {"Content-Type": failure.content_type}
                    return web.Response(
                        body=failure.body, status=failure.status, headers=headers_out
                    ), True
                if route.action == "load" and route.replica is not None:
                    self._start_load(route.replica, model)
                deadline = self.hold_deadline(held)
                if now >= deadline:
                    if self.draining and deadline < held.deadline:
                        outcome = "drained"
                        return self._drained(model, route.reason, now - held.held_at), True
                    outcome = "expired"
                    return self._not_ready(model, route, now - held.held_at), True
                slot = route.reason == "busy:wait-slot"
                cold = cold or not slot
                if slot and not in_line:
                    self.metrics.slot_waits.inc()
                if client is None:
                    await self.wait(slot, deadline - now, in_line)
                    in_line = in_line or slot
                    continue
                task = asyncio.current_task()
                client.waiting = task
                try:
                    await self.wait(slot, deadline - now, in_line)
                    in_line = in_line or slot
                except asyncio.CancelledError:
                    if not client.gone or task is None:
                        raise
                    task.uncancel()  # our own cancel (the client left), not the server's
                finally:
                    client.waiting = None
        finally:
            if holding and held is not None:
                self._hold_end(held)
                if in_line:  # left the line unserved: a slot it was woken for goes on
                    self.changes.notify_one()
            if held is not None:
                self.metrics.hold_outcome[outcome].inc()

    async def wait(self, slot: bool, seconds: float, in_line: bool) -> None:
        """Wait for the next change: in the burst buffer's line for a slot (``slot``), else
        for any change of the fleet."""
        if slot:
            await self.changes.wait_in_line(seconds, front=in_line)
        else:
            await self.changes.wait(seconds)

    async def _judge(
        self, body: bytes, headers: list[tuple[str, str]], client: ClientWatch
    ) -> int | None:
        """The request's own timeout (µs), or :class:`BodyError` for what no model serves;
        a servable request is an arrival from here on, a refused one never.
        A compressed body or a large one is judged in the worker process: 64 KB of gzip can
        inflate to a parse of seconds, which must not stall the event loop."""
        try:
            timeout_us = await self._judged(body, headers)
        except BodyError:
            client.refused = True
            raise
        client.arrived = True
        self.arrived()
        return timeout_us

    async def _judged(self, body: bytes, headers: list[tuple[str, str]]) -> int | None:
        encoding = _header(headers, "Content-Encoding")
        args = (
            body,
            encoding,
            _header(headers, HEADER_LENGTH),
            self.config.max_request_bytes,
            self.config.max_json_values,
        )
        if not encoding and len(body) <= OFFLOAD_BYTES:
            return judge_held_request(*args)
        return await self.offload.run(judge_held_request, *args)

    # -- the hold's book-keeping (HTTP and gRPC alike) ------------------------------------------

    def arrived(self) -> None:
        """One more infer request the operator's forecast learns from (``arrivals``)."""
        self.arrivals += 1
        if self.arrival_watchers:
            self.held_changes.notify()

    def hold_begin(self, model: str, size: int, now: float, deadline: float) -> Held:
        """Count one more held request (admitted by :func:`admit`): demand the operator sees."""
        held = Held(model, size, now, deadline)
        self._held.setdefault(model, {})[held] = None
        self._held_all[held] = None
        self._held_counts(1, size)
        return held

    def _hold_end(self, held: Held, forwarded: bool = False) -> None:
        now = self.loop.time()
        waiting = self._held.get(held.model)
        if waiting is not None:
            if forwarded and next(iter(waiting)) is held:  # the oldest: how long a wake took
                self._wake_seconds[held.model] = now - held.held_at
            waiting.pop(held, None)
            if not waiting:
                del self._held[held.model]
        self._held_all.pop(held, None)
        self._held_counts(-1, -held.size)
        self.metrics.load_wait.observe(now - held.held_at)

    def hold_end(self, held: Held, forwarded: bool = False) -> None:
        """The request is no longer held: forwarded (``forwarded``), answered or gone."""
        self._hold_end(held, forwarded)

    def hold_deadline(self, held: Held) -> float:
        """Its own deadline, or the end of the drain when that comes first."""
        if self.holds_end_at is not None and self.holds_end_at < held.deadline:
            return self.holds_end_at
        return held.deadline

    def _held_counts(self, requests: int, size: int) -> None:
        self.held_now += requests
        self.held_bytes += size
        self.metrics.held.set(self.held_now)
        self.metrics.held_bytes.set(self.held_bytes)
        self.held_changes.notify()

    def _gone(self) -> web.Response:
        return error(CLIENT_CLOSED, "the client closed the connection while its request was held")

    def _full(self, model: str, reason: str, refusal: str) -> web.Response:
        return error(
            503,
            f"model {model!r} is not ready on any replica ({reason}) and it cannot be held: "
            f"{refusal}; retry later",
            self.retry_after(model, full=True),
        )

    def _drained(self, model: str, reason: str, held_s: float) -> web.Response:
        return error(
            503,
            f"the gateway is shutting down and model {model!r} is not ready on any replica "
            f"({reason}); held {held_s:.1f} s, retry later (another gateway pod holds it)",
            self.retry_after(model),
        )

    def _give_up(self, model: str, failures: list[Failed]) -> web.Response:
        last = failures[-1]
        if last.response is not None:
            return last.response  # the replica's own 502/503 says why (with Retry-After)
        tried = "; then ".join(f.detail for f in failures)
        return error(502, f"model {model!r}: no replica answered: {tried}")

    def expected_wake(self, model: str) -> float | None:
        """How long until ``model`` is routable once a hold begins: its last measured load
        time on a replica, else how long the last hold for it waited for a replica (a wake
        from zero), else unknown."""
        loads = max((r.load_seconds.get(model, 0.0) for r in self.replicas.values()), default=0.0)
        return loads if loads > 0 else self._wake_seconds.get(model)

    def retry_after(self, model: str, full: bool = False) -> int:
        """``Retry-After`` of a 503 for ``model`` (:func:`~tidal.gateway.core.hold.retry_after`):
        the time a replica is still expected to take, judged by the age of the oldest hold for
        the model; ``full``: no later than the oldest held request leaves (room)."""
        waiting = self._held.get(model)
        oldest = next(iter(waiting)) if waiting else None
        first = next(iter(self._held_all)) if full and self._held_all else None
        return retry_after(
            self.loop.time(),
            expected_wake_s=self.expected_wake(model),
            waiting_since=oldest.held_at if oldest is not None else None,
            room_at=self.hold_deadline(first) if first is not None else None,
        )

    def _not_ready(self, model: str, route: Route, held: float) -> web.Response:
        waited = f"held {held:.1f} s, " if held > 0 else ""
        return error(
            503,
            f"model {model!r} is not ready on any replica ({route.reason}); {waited}retry later",
            self.retry_after(model),
        )

    # -- loads --------------------------------------------------------------------------------

    def _start_load(self, replica_name: str, model: str) -> None:
        replica = self.replicas.get(replica_name)
        if replica is None or model in replica.own_loads:
            return
        replica.own_loads = replica.own_loads.reserve(model, self._model_bytes(model))
        replica.invalidate()
        task = asyncio.create_task(self._load(replica, model), name=f"load-{model}@{replica_name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _load(self, replica: Replica, model: str) -> None:
        control = self._control_session(replica)
        result = "error"
        timeout = max(self.config.upstream_timeout_seconds, self.config.hold_timeout_seconds)
        try:
            async with control.post(
                f"{replica.url}/v2/repository/models/{model}/load",
                data=b"{}",
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                data = await response.read()
                if response.status == 200:
                    result = "ok"
                    replica.snapshot = with_hot(
                        replica.snapshot, model
                    )  # the long-poll confirms it
                elif response.status == 503:  # no room there now: try elsewhere for a while
                    result = "refused"
                    self._refuse(replica, model, until_change=bool(waiting_on(data)))
                elif response.status == 404:  # its configuration lacks the model after all
                    result = "failed"
                    replica.snapshot = without_model(replica.snapshot, model)
                else:
                    result = "failed"
                    self._load_failures[model] = LoadFailure(
                        self.loop.time(),
                        response.status,
                        data,
                        response.headers.get("Content-Type", "application/json"),
                    )
                if result != "ok":
                    log.warning(
                        "loading %s on %s: %d %s", model, replica.name, response.status, data[:300]
                    )
        except (aiohttp.ClientError, OSError) as exc:
            self._mark_unhealthy(replica, f"load of {model}: {type(exc).__name__}: {exc}")
        except TimeoutError:
            log.warning("loading %s on %s: no answer within %.0f s", model, replica.name, timeout)
        finally:
            replica.own_loads = replica.own_loads.release(model)
            replica.invalidate()
            self.metrics.load_result[result].inc()
            self.changes.notify()

    def _refuse(self, replica: Replica, model: str, until_change: bool = False) -> None:
        """Keep loads of ``model`` off ``replica`` for ``refusedCooldownSeconds``, or only
        until its next snapshot where it said which requests hold the room (``until_change``)."""
        replica.refused.add(model)
        if until_change:
            replica.refused_until_change.add(model)

        def forgive() -> None:
            replica.refused.discard(model)
            replica.refused_until_change.discard(model)
            replica.invalidate()
            self.changes.notify()

        self.loop.call_later(self.config.refused_cooldown_seconds, forgive)

    # -- handlers -----------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        started = self.loop.time()
        model = request.match_info["model"]
        held = False
        client = ClientWatch()
        try:
            body = await self._read(request)
        except BodyError as exc:
            response = body_error(exc)
        else:
            request[ON_CLIENT_GONE] = client.client_gone
            transport = request.transport
            if transport is None or transport.is_closing():  # gone before the hook was set
                client.gone = True
            response, held = await self.dispatch(
                model,
                "POST",
                request.raw_path,
                body,
                forwarded_headers(request),
                hold=True,
                client=client,
            )
        if not client.arrived and servable(response.status):  # answered by a replica
            self.arrived()
        cache = "none" if client.refused else "cold" if held else "hot"
        self.metrics.answered(
            self._model_label(model), response.status, cache, self.loop.time() - started
        )
        request[COUNTED] = True  # (a crash before this point is counted by the middleware)
        return response

    async def _read(self, request: web.Request) -> bytes:
        config = self.config
        return await read_body(
            request, config.max_request_bytes, config.request_read_timeout_seconds
        )

    async def proxy_metadata(self, request: web.Request) -> web.Response:
        """Model metadata, config and statistics: from a replica that has (or is getting) the
        model (statistics are that replica's own)."""
        model = request.match_info["model"]
        response, _ = await self.dispatch(model, "GET", request.raw_path, b"", [], hold=False)
        return response

    async def model_ready(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        route = self.route(model)
        if route.reason == "unknown:model":
            return error(404, f"unknown model {model!r}")
        ready = route.action == "forward"
        return web.json_response({"name": model, "ready": ready}, status=200 if ready else 400)

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        healthy = sum(1 for r in self.replicas.values() if r.healthy)
        # An activator takes requests with no replica at all: it holds them while the
        # service wakes from zero.
        ready = (healthy > 0 or self.config.activator) and not self.draining
        body: dict[str, Any] = {"ready": ready, "healthyReplicas": healthy}
        if self.draining:
            body["draining"] = True
        elif not ready:
            body["error"] = f"no healthy replica among {len(self.replicas)} known"
        return web.json_response(body, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def repository_index(self, request: web.Request) -> web.Response:
        """Every model of the fleet: READY when hot on a healthy replica, LOADING, UNAVAILABLE."""
        raw = await self._read(request)
        body = parse_json(raw, "the body", CONTROL_JSON_VALUES, CONTROL_LIMIT) if raw else {}
        if not isinstance(body, dict):
            raise BodyError(400, "the body must be a JSON object")
        unknown = sorted(set(body) - {"ready"})
        if unknown:
            raise BodyError(400, f"unknown fields {unknown}; expected ['ready']")
        only_ready = body.get("ready", False)
        if not isinstance(only_ready, bool):
            raise BodyError(400, "'ready' must be true or false")
        live = [r for r in self.replicas.values() if r.healthy]
        names = set(self.known) or {n for r in self.replicas.values() for n in r.models}
        index = []
        for name in sorted(names):
            if any(name in r.hot for r in live):
                state = "READY"
            elif any(name in r.loading or name in r.own_loads for r in live):
                state = "LOADING"
            else:
                state = "UNAVAILABLE"
            if not only_ready or state == "READY":
                index.append({"name": name, "version": "1", "state": state})
        return web.json_response(index)

    async def get_replicas(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "gateway": self.name,
                "replicas": [r.describe() for r in self.replicas.values()],
                "placement": {m: list(names) for m, names in self.placement.items()},
            }
        )

    async def get_held(self, request: web.Request) -> web.Response:
        """How many requests are held now: the operator's push of demand at zero; with it
        ``arrivals``, the infer requests received since the gateway started (the count the
        operator's forecast learns from).

        ``?seen=N&wait=S``: answer as soon as the count differs from ``N`` (at once if it
        already does), at the latest after ``S`` seconds (at most 30); without them, at once.
        ``&arrivals=A&every=E`` (the arrival count the caller last read): also answer once the
        arrival count differs from ``A`` and the poll is ``E`` seconds old (0 to 30; none: at
        the first arrival), so the forecast learns a busy service's requests within ``E``
        seconds, not at the end of ``S``. A quiet service costs one parked request per gateway
        pod per ``S``, no polling loop; a busy one an answer per ``E``.
        """
        query = request.query
        try:
            seen = int(query.get("seen", "-1"))
            wait = float(query.get("wait", "0"))
            known = int(query["arrivals"]) if "arrivals" in query else None
            every = float(query.get("every", "0"))
        except ValueError:
            return error(
                400,
                "'seen' and 'arrivals' must be integers, 'wait' and 'every' numbers of seconds",
            )
        if not 0 <= wait <= MAX_LONG_POLL_S:
            return error(400, f"'wait' must be between 0 and {MAX_LONG_POLL_S:g} seconds")
        if not 0 <= every <= MAX_LONG_POLL_S:
            return error(400, f"'every' must be between 0 and {MAX_LONG_POLL_S:g} seconds")
        start = self.loop.time()
        deadline = start + wait
        watching = False  # counted in arrival_watchers: an arrival wakes this poll
        try:
            while self.held_now == seen and not self.draining:
                until = deadline
                if known is not None and self.arrivals != known:
                    until = min(deadline, start + every)
                    if watching:
                        self.arrival_watchers -= 1
                        watching = False
                elif known is not None and not watching:
                    self.arrival_watchers += 1
                    watching = True
                left = until - self.loop.time()
                if left <= 0:
                    break
                await self.held_changes.wait(left)
        finally:
            if watching:
                self.arrival_watchers -= 1
        return web.json_response(
            {"gateway": self.name, "held": self.held_now, "arrivals": self.arrivals}
        )

    async def put_replicas(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        check_json_values(raw, "the replica list", CONTROL_JSON_VALUES, CONTROL_LIMIT)
        try:
            update = ReplicaList.model_validate_json(raw)
        except ValidationError as exc:
            return error(400, format_validation_error(exc, "replica list"))
        self.set_replicas(update.replicas, update.placement)
        return web.json_response(
            {
                "replicas": list(self.replicas),
                "placement": {m: list(names) for m, names in self.placement.items()},
            }
        )


GATEWAY = web.AppKey("tidal_gateway", Gateway)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


def servable(status: int) -> bool:
    """An answer to a request that was an arrival: served, or failed or refused for the
    server's sake (5xx, 429), not a client's mistake (400, 404, 413, …)."""
    return status < 400 or status >= 500 or status == 429


def forwarded_headers(request: web.BaseRequest) -> list[tuple[str, str]]:
    """The headers that carry a body's meaning, first of each name, exactly as they came."""
    found: dict[str, str] = {}
    for raw_name, raw_value in request.raw_headers:
        name = FORWARDED.get(raw_name.lower())
        if name is not None and name not in found:
            found[name] = raw_value.decode("latin-1")
    return list(found.items())


async def serve(
    config: GatewayConfig,
    host: str,
    port: int,
    replicas: Sequence[ReplicaRef] = (),
    stop: asyncio.Event | None = None,
    grpc_port: int = 0,
) -> None:
    """Run the gateway until cancelled or until ``stop`` is set, then drain like the runtime.
    ``grpc_port``: also pass OIP v2 gRPC calls through (``tidal.gateway.grpc_proxy``); 0: not."""
    from .grpc_proxy import start_grpc

    gateway = Gateway(config, replicas)
    runner = JsonErrorRunner(
        gateway.build_app(),
        access_log=None,
        handle_signals=False,
        auto_decompress=False,
        header_read_timeout=config.header_read_timeout_seconds,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    grpc_server = proxy = None
    try:
        if grpc_port:
            grpc_server, proxy = await start_grpc(gateway, host, grpc_port)
        log.info(
            "tidal-gateway listening on %s:%d%s, %d replicas",
            host,
            port,
            f" (gRPC {proxy.port})" if proxy is not None else "",
            len(replicas),
        )
        await (stop or asyncio.Event()).wait()
        gateway.start_draining()
        log.info(
            "stopping: not ready, serving for %.1fs more (%d requests held)",
            config.shutdown_drain_seconds,
            gateway.held_now,
        )
        await asyncio.sleep(config.shutdown_drain_seconds)
        # Each hold ended with the drain: wait for the last answers to leave (a held request
        # forwarded at the end is the replica's, no longer held).
        if not await gateway.holds_answered(HOLDS_ANSWERED_S):
            log.warning("stopping with %d requests still held", gateway.held_now)
    finally:
        if grpc_server is not None and proxy is not None:
            await grpc_server.stop(1.0)
            await proxy.close()
        await runner.cleanup()
