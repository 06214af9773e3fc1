"""The gateway's HTTP front: OIP v2 and the ``/v2/tidal/*`` control endpoints over aiohttp.

* **Forwarding** (the hot path): the body is read once and sent on byte for byte with the
  headers that carry its meaning (``Content-Type``, ``Inference-Header-Content-Length``,
  ``Content-Encoding``); the answer comes back the same way.  No tensor is decoded, no JSON
  parsed; forwards travel on keep-alive connections of :mod:`tidal.gateway.upstream` (a lean
  HTTP/1.1 client: aiohttp's client cost more CPU per request than the runtime's whole work).
  Routing, retries and holding are :class:`~tidal.gateway.dispatch.Dispatcher`'s, shared with
  the gRPC front; this module words its :class:`~tidal.gateway.dispatch.Refusal` as HTTP.
* **Before a hold** an infer request is judged
  (:func:`~tidal.gateway.core.hold.judge_held_request`): one no model could serve is a 400 at
  once (never held, never demand); a large or compressed body is judged in a worker process,
  so that its parse never stalls the event loop.
* **Errors**: every answer the gateway makes is JSON and counted (:func:`json_errors`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from ..common.body import CONTROL_JSON_VALUES, CONTROL_LIMIT, OFFLOAD_BYTES, check_json_values
from ..common.contract import PATH_HELD, PATH_REPLICAS
from ..common.http import (
    CLIENT_CLOSED,
    ON_CLIENT_GONE,
    BodyError,
    declared_too_large,
    json_error,
    parse_json,
    quiet_logger,
    read_body,
)
from . import EXTENSIONS, SERVER_NAME, __version__
from .config import ReplicaList, format_validation_error
from .core.hold import hold_seconds, judge_held_request
from .dispatch import Call, Failed, Refusal
from .replicas import Replica
from .upstream import UpstreamError

if TYPE_CHECKING:
    from .server import Gateway

log = logging.getLogger("tidal.gateway")
http_log = quiet_logger("tidal.gateway.http")  # aiohttp's protocol-level errors

HEADER_LENGTH = "Inference-Header-Content-Length"
# Headers that carry the meaning of a body: forwarded both ways, nothing else is.
REQUEST_HEADERS = ("Content-Type", HEADER_LENGTH, "Content-Encoding", "Accept-Encoding", "Accept")
# Raw (lower-case) name -> the name forwarded; values go on byte for byte (latin-1 both ways).
FORWARDED = {name.lower().encode(): name for name in REQUEST_HEADERS}
RETRIED_STATUSES = frozenset({502, 503})  # from a replica, before any byte of an answer
MAX_LONG_POLL_S = 30.0  # longest a GET /v2/tidal/held?seen=… waits for a change
NO_MODEL_LABEL = "(none)"  # metrics label of answers on routes that name no model
COUNTED = web.RequestKey("tidal_counted", bool)  # the handler counted its answer itself


def error(status: int, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_error(status, message, headers)


def body_error(exc: BodyError) -> web.Response:
    response = error(exc.status, exc.message)
    if exc.status in (408, 413, CLIENT_CLOSED):
        response.force_close()  # what is left of the body is not worth reading
    return response


def refused(refusal: Refusal) -> web.Response:
    """A request no replica answers, worded as HTTP."""
    model, kind, reason = refusal.model, refusal.kind, refusal.reason
    if kind == "unknown":
        return error(404, f"unknown model {model!r}")
    if kind == "gone":
        return error(CLIENT_CLOSED, "the client closed the connection while its request was held")
    if kind == "gave-up":
        return error(502, f"model {model!r}: no replica answered: {refusal.detail}")
    if kind == "load-failed" and refusal.failure is not None:
        failure = refusal.failure
        headers = {"Content-Type": failure.content_type}
        return web.Response(body=failure.body, status=failure.status, headers=headers)
    not_ready = f"model {model!r} is not ready on any replica ({reason})"
    if kind == "full":
        message = f"{not_ready} and it cannot be held: {refusal.detail}; retry later"
    elif kind == "drained":
        message = (
            f"the gateway is shutting down and {not_ready}; held {refusal.held_s:.1f} s, "
            "retry later (another gateway pod holds it)"
        )
    else:
        waited = f"held {refusal.held_s:.1f} s, " if refusal.held_s > 0 else ""
        message = f"{not_ready}; {waited}retry later"
    return error(503, message, refusal.retry_after)


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


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)


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

    async def wait(self, waiting: Awaitable[None]) -> bool:
        """Await ``waiting``; False when the client hung up meanwhile."""
        task = asyncio.current_task()
        self.waiting = task
        try:
            await waiting
            return True
        except asyncio.CancelledError:
            if not self.gone or task is None:
                raise
            task.uncancel()  # our own cancel (the client left), not the server's
            return False
        finally:
            self.waiting = None


@dataclass(eq=False)
class HttpCall(Call[web.Response]):
    """One HTTP request as :class:`~tidal.gateway.dispatch.Dispatcher` dispatches it."""

    gateway: Gateway
    method: str
    path: str
    body: bytes
    headers: list[tuple[str, str]]
    client: ClientWatch | None = None  # an infer request's: judged before a hold, may leave

    async def send(self, replica: Replica) -> web.Response | Failed[web.Response]:
        """Forward it as it came; the replica's answer as it comes back."""
        metrics, timeout = self.gateway.metrics, self.gateway.config.upstream_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                answer = await replica.pool.request(self.method, self.path, self.body, self.headers)
        except UpstreamError as exc:
            metrics.upstream_error[exc.kind].inc()
            detail = f"replica {replica.name} ({replica.url}): {exc}"
            self.gateway.fleet.mark_unhealthy(replica, detail)
            return Failed(exc.kind, detail)
        except TimeoutError:
            metrics.upstream_error["timeout"].inc()
            return error(
                504,
                f"replica {replica.name} did not answer within upstreamTimeoutSeconds "
                f"({timeout:g} s)",
            )
        response = web.Response(body=answer.body, status=answer.status, headers=answer.headers)
        if answer.status in RETRIED_STATUSES:
            metrics.upstream_error["unavailable"].inc()
            detail = f"replica {replica.name} answered {answer.status}"
            return Failed("unavailable", detail, response, refused=answer.status == 503)
        return response

    async def hold_seconds(self) -> float:
        """``holdTimeoutSeconds``, or the request's own ``timeout`` when smaller; judged first
        (:class:`BodyError` for what no model serves): a servable request is an arrival from
        here on, a refused one never. A compressed body or a large one is judged in the
        worker process: 64 KB of gzip can inflate to a parse of seconds, which must not stall
        the event loop."""
        config, client = self.gateway.config, self.client
        if client is None:
            return config.hold_timeout_seconds
        encoding = _header(self.headers, "Content-Encoding")
        length = _header(self.headers, HEADER_LENGTH)
        args = (self.body, encoding, length, config.max_request_bytes, config.max_json_values)
        try:
            if not encoding and len(self.body) <= OFFLOAD_BYTES:
                timeout_us = judge_held_request(*args)
            else:
                timeout_us = await self.gateway.offload.run(judge_held_request, *args)
        except BodyError:
            client.refused = True
            raise
        client.arrived = True
        self.gateway.holds.arrived()
        return hold_seconds(config.hold_timeout_seconds, timeout_us)

    def gone(self) -> bool:
        return self.client is not None and self.client.gone

    async def wait(self, waiting: Awaitable[None]) -> bool:
        return await (super().wait(waiting) if self.client is None else self.client.wait(waiting))


MAX_REQUEST_BYTES = web.AppKey("tidal_max_request_bytes", int)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every answer is JSON (no route, wrong method, body too large, crashes) and every answer
    a handler did not count itself (errors of the other routes) is counted here."""
    started = asyncio.get_running_loop().time()
    response: web.StreamResponse
    too_large = declared_too_large(request, request.app[MAX_REQUEST_BYTES])
    try:
        if too_large is not None:  # before reading a byte of it
            raise too_large
        response = await handler(request)
    except BodyError as exc:
        if exc.status == CLIENT_CLOSED:
            log.debug("%s %s: %s", request.method, request.path, exc.message)
        response = body_error(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _http_error(request, exc)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the process must survive anything a client sends
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = error(500, f"internal error: {exc}")
    if response.status >= 400 and not request.get(COUNTED):
        gateway = request.app[FRONT].gateway
        model = request.match_info.get("model")
        gateway.metrics.answered(
            gateway.fleet.model_label(model) if model else NO_MODEL_LABEL,
            response.status,
            "hot",
            asyncio.get_running_loop().time() - started,
        )
    return response


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        response = error(405, f"{request.method} is not allowed on {request.path}: {allowed}")
        response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
    if isinstance(exc, web.HTTPNotFound):
        return error(404, f"no endpoint {request.method} {request.path}")
    if exc.status == 413:
        return error(413, "request body is larger than maxRequestBytes")
    return error(exc.status, f"{exc.reason}: {request.method} {request.path}")


class HttpFront:
    """The aiohttp application and its handlers."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config

    def build_app(self) -> web.Application:
        gateway = self.gateway
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[json_errors],
            handler_args={"logger": http_log},
        )
        app[FRONT] = self
        app[MAX_REQUEST_BYTES] = self.config.max_request_bytes
        app.on_startup.append(gateway.on_startup)
        app.on_cleanup.append(gateway.on_cleanup)
        r = app.router
        # The router tries routes in order: the hot path first.
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_post(prefix + "/infer", self.infer)
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/v2/repository/index", self.repository_index)
        r.add_get(PATH_REPLICAS, self.get_replicas)
        r.add_put(PATH_REPLICAS, self.put_replicas)
        r.add_get(PATH_HELD, self.get_held)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.proxy_metadata)
            r.add_get(prefix + "/config", self.proxy_metadata)
            r.add_get(prefix + "/stats", self.proxy_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
        return app

    async def dispatch(self, call: HttpCall) -> tuple[web.Response, bool]:
        """The answer (the replica's, or the gateway's refusal) and whether it was held."""
        answer, held = await self.gateway.dispatcher.dispatch(call)
        return (refused(answer) if isinstance(answer, Refusal) else answer), held

    # -- handlers -------------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        gateway = self.gateway
        started = gateway.time()
        model = request.match_info["model"]
        held = False
        client = ClientWatch()
        try:
            body = await self._read(request)
            request[ON_CLIENT_GONE] = client.client_gone
            transport = request.transport
            if transport is None or transport.is_closing():  # gone before the hook was set
                client.gone = True
            headers = forwarded_headers(request)
            path = request.raw_path
            call = HttpCall(model, len(body), True, gateway, "POST", path, body, headers, client)
            response, held = await self.dispatch(call)
        except BodyError as exc:  # unreadable, or judged before a hold: none is held
            response, held = body_error(exc), False
        if not client.arrived and servable(response.status):  # answered by a replica
            gateway.holds.arrived()
        cache = "none" if client.refused else "cold" if held else "hot"
        label = gateway.fleet.model_label(model)
        gateway.metrics.answered(label, response.status, cache, gateway.time() - started)
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
        call = HttpCall(model, 0, False, self.gateway, "GET", request.raw_path, b"", [])
        response, _ = await self.dispatch(call)
        return response

    async def model_ready(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        route = self.gateway.fleet.route(model)
        if route.reason == "unknown:model":
            return error(404, f"unknown model {model!r}")
        ready = route.action == "forward"
        return web.json_response({"name": model, "ready": ready}, status=200 if ready else 400)

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        gateway = self.gateway
        healthy = gateway.fleet.healthy
        ready = gateway.ready
        body: dict[str, Any] = {"ready": ready, "healthyReplicas": healthy}
        if gateway.holds.draining:
            body["draining"] = True
        elif not ready:
            body["error"] = f"no healthy replica among {len(gateway.replicas)} known"
        return web.json_response(body, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.gateway.metrics.registry),
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
        views = self.gateway.fleet.views()
        live = [v for v in views if v.healthy]
        names = set(self.gateway.fleet.known) or {n for v in views for n in v.models}
        index = []
        for name in sorted(names):
            if any(name in v.hot for v in live):
                state = "READY"
            elif any(name in v.loading for v in live):  # reported, or the gateway's own
                state = "LOADING"
            else:
                state = "UNAVAILABLE"
            if not only_ready or state == "READY":
                index.append({"name": name, "version": "1", "state": state})
        return web.json_response(index)

    def _placement(self) -> dict[str, list[str]]:
        return {m: list(names) for m, names in self.gateway.fleet.placement.items()}

    async def get_replicas(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "gateway": self.gateway.name,
                "replicas": [r.describe() for r in self.gateway.replicas.values()],
                "placement": self._placement(),
            }
        )

    async def put_replicas(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        check_json_values(raw, "the replica list", CONTROL_JSON_VALUES, CONTROL_LIMIT)
        try:
            update = ReplicaList.model_validate_json(raw)
        except ValidationError as exc:
            return error(400, format_validation_error(exc, "replica list"))
        self.gateway.fleet.set(update.replicas, update.placement)
        return web.json_response(
            {"replicas": list(self.gateway.replicas), "placement": self._placement()}
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
        holds = self.gateway.holds
        await holds.watch(seen, wait, known, every)
        return web.json_response(
            {"gateway": self.gateway.name, "held": holds.count, "arrivals": holds.arrivals}
        )


FRONT = web.AppKey("tidal_gateway_http", HttpFront)
