"""HTTP transport: Open Inference Protocol v2 routes over aiohttp, errors mapped once.

Routes: health (live/ready), server and model metadata, model ready, model config (Triton
extension, used by tritonclient), infer (JSON and binary tensors), the statistics extension,
the model-repository extension (index, load, unload), the fleet endpoints the gateway and the
operator use (``/v2/tidal/*``, :mod:`tidal.runtime.fleet`), and ``/metrics``; model routes also
under ``/versions/{v}`` (version 1).

Every error becomes ``{"error": message}`` in :func:`error_middleware`, with the status of
:mod:`tidal.runtime.errors` — unknown routes and methods included; anything unexpected becomes a
500 without taking the process down.  Bodies are read by :func:`read_body` only: a declared
``Content-Length`` over ``maxRequestBytes`` is refused before reading, a body that does not
arrive within the read timeout is a 408, and a client that goes away mid-upload is a quiet 499.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..common import http as common_http
from ..common.backoff import Backoff, Retry
from ..common.body import CONTROL_JSON_VALUES, CONTROL_LIMIT, OFFLOAD_BYTES
from ..common.clock import CLOCK, Clock
from ..common.contract import ENV_POD_NAME
from ..common.http import BodyError, JsonErrorRunner, declared_too_large, quiet_logger
from ..common.offload import Offload
from . import __version__, tiers
from .backends import Backend, TensorSpec, make_backend
from .batcher import ModelBatcher
from .config import RuntimeConfig
from .enginecache import READY, ChangeFeed, EngineCache
from .errors import (
    ClientDisconnected,
    InjectedFault,
    InternalError,
    InvalidInput,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    PayloadTooLarge,
    RequestTimeout,
    RouteNotFound,
    ServingError,
    Unavailable,
    as_serving_error,
)
from .fleet import FleetEndpoints
from .metrics import RuntimeMetrics
from .protocol import (
    DATATYPES,
    HEADER_LENGTH,
    InferRequest,
    decode_request,
    encode_response,
    parse_json,
)
from .storage import EngineStore

log = logging.getLogger("tidal.runtime.server")

# A failed preload is tried again after 1 s, 2 s, ... 30 s (reported as Retry-After meanwhile).
PRELOAD_BACKOFF = Backoff(first_seconds=1.0, max_seconds=30.0)
MAX_REQUEST_BYTES = web.AppKey("max_request_bytes", int)  # for the middleware's early check


http_log = quiet_logger("tidal.runtime.http")  # aiohttp's protocol-level errors


def _error_response(error: ServingError) -> web.Response:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    body: dict[str, Any] = {"error": error.message}
    if error.waiting_on:
        body["waitingOn"] = list(error.waiting_on)
    response = web.json_response(body, status=error.status, headers=headers)
    if isinstance(error, ClientDisconnected | RequestTimeout | PayloadTooLarge):
        response.force_close()  # what is left of the body is not worth reading
    return response


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> ServingError:
    if isinstance(exc, web.HTTPNotFound):
        return RouteNotFound(f"no endpoint {request.method} {request.path}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}: {allowed}")
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("request body is larger than maxRequestBytes")
    error = ServingError(exc.reason or "error")
    error.status = exc.status
    return error


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    limit = request.app.get(MAX_REQUEST_BYTES)
    # Infer refuses it itself, inside its accounting, so that the 413 is counted per model.
    refused = (
        declared_too_large(request, limit)
        if limit is not None and not request.path.endswith("/infer")
        else None
    )
    if refused is not None:
        return _error_response(as_body_error(refused))
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ServingError as error:
        if isinstance(error, ClientDisconnected):
            log.debug("%s %s: %s", request.method, request.path, error.message)
        return _error_response(error)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error_response(_from_http_exception(request, exc))
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the process must survive anything a client sends
        mapped = as_serving_error(exc)
        if isinstance(mapped, InternalError):
            log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_response(mapped)


_BODY_ERRORS: dict[int, type[ServingError]] = {
    400: InvalidRequest,
    408: RequestTimeout,
    413: PayloadTooLarge,
    503: Unavailable,  # the parser process died (tidal.common.offload)
    ClientDisconnected.status: ClientDisconnected,
}


def as_body_error(error: BodyError) -> ServingError:
    """The runtime's error for a request that could not be read (:mod:`tidal.common.http`)."""
    return _BODY_ERRORS.get(error.status, InvalidRequest)(error.message)


async def read_body(request: web.Request, limit: int, within_s: float) -> bytes:
    """The whole body, or the error saying why not (413, 408, 499, 400)."""
    try:
        return await common_http.read_body(request, limit, within_s)
    except BodyError as error:
        raise as_body_error(error) from None


def _validate(
    inputs: dict[str, np.ndarray[Any, Any]],
    specs: tuple[TensorSpec, ...],
    max_batch: int,
) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """Check names, datatypes and shapes; returns (rows, non-batch shapes)."""
    expected = {s.name: s for s in specs}
    unknown = sorted(set(inputs) - set(expected))
    missing = sorted(set(expected) - set(inputs))
    if unknown or missing:
        raise InvalidInput(
            f"inputs must be {sorted(expected)}; unknown: {unknown}, missing: {missing}"
        )
    rows: int | None = None
    key = []
    for spec in specs:
        array = inputs[spec.name]
        if array.dtype != DATATYPES[spec.datatype]:
            got = next(k for k, v in DATATYPES.items() if v == array.dtype)
            raise InvalidInput(f"input {spec.name!r}: expected datatype {spec.datatype}, got {got}")
        if array.ndim != len(spec.shape):
            raise InvalidInput(
                f"input {spec.name!r}: expected shape {list(spec.shape)} (-1 = any), "
                f"got {list(array.shape)}"
            )
        for want, got_dim in zip(spec.shape[1:], array.shape[1:], strict=True):
            if want >= 0 and want != got_dim:
                raise InvalidInput(
                    f"input {spec.name!r}: expected shape {list(spec.shape)} (-1 = any), "
                    f"got {list(array.shape)}"
                )
        if rows is None:
            rows = int(array.shape[0])
        elif rows != array.shape[0]:
            raise InvalidInput("all inputs must have the same batch size (first dimension)")
        key.append(tuple(array.shape[1:]))
    assert rows is not None
    if rows < 1 or rows > max_batch:
        raise InvalidInput(f"batch size {rows} is outside 1..{max_batch} (maxBatchSize)")
    return rows, tuple(key)


def _load_error(name: str, exc: Exception) -> str:
    """The load error without the ``model 'x' failed to load:`` the cache puts before it."""
    text = exc.message if isinstance(exc, ServingError) else str(exc)
    prefix = f"model {name!r} failed to load: "
    return text[len(prefix) :] if text.startswith(prefix) else text


class RequestAccounting:
    """The bookkeeping of one infer request, the same for every transport.

    While the request runs: ``tidal_inflight_requests`` and the model's ``outstanding`` count.
    When it ends: its latency in ``tidal_request_duration_seconds`` (``cache`` cold or hot) and
    ``tidal_requests`` under ``code``, the cold start of the first request after an on-demand
    load, and the statistics extension's success or fail. The code is ``code`` when the block
    completes (200 unless the transport sets another), the error's status for a ServingError,
    499 for a client that went away (a reset connection, a cancelled call: not counted as a
    failure), else 500. Requests for an unknown model count only as inflight.
    """

    __slots__ = ("_name", "_runtime", "_slot", "_started", "code", "cold")

    def __init__(self, runtime: RuntimeServer, name: str) -> None:
        self._runtime = runtime
        self._name = name
        self._slot = runtime.cache.slots.get(name)
        self._started = 0.0
        self.code = 200
        self.cold = False

    def __enter__(self) -> RequestAccounting:
        runtime = self._runtime
        self._started = runtime.clock.monotonic()
        runtime.metrics.inflight.inc()
        runtime.arrivals.bump()
        if self._slot is not None:
            self._slot.outstanding += 1
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: Any
    ) -> None:
        runtime = self._runtime
        runtime.metrics.inflight.dec()
        slot = self._slot
        if slot is None:
            return
        if error is None:
            code = self.code
        elif isinstance(error, ServingError):
            code = error.status
        elif isinstance(error, ConnectionResetError | asyncio.CancelledError):
            code = ClientDisconnected.status
        else:
            code = 500
        slot.outstanding -= 1
        slot.requests += 1
        elapsed = runtime.clock.monotonic() - self._started
        series = runtime.metrics.request_series(self._name)
        series.observe(self.cold, code, elapsed)
        if self.cold and code == 200 and runtime.cache.take_first_request(self._name):
            runtime.metrics.cold_start.labels(self._name).observe(elapsed)
        if code == 200:
            series.stats.success.add(elapsed)
            series.stats.last_inference_ms = int(runtime.wall() * 1000)
        elif code != ClientDisconnected.status:
            series.stats.fail.add(elapsed)


def check_version(name: str, asked: str, served: str) -> str:
    """The version a request names, checked like Triton: empty means the served one; another
    is 404 (400 when it is not even a number)."""
    if asked in ("", served):
        return served
    if not asked.isdigit() or not asked.isascii():
        raise InvalidRequest(f"model version {asked!r:.40} is not a number")
    raise ModelNotFound(f"model {name!r} has no version {asked!r}; versions: {[served]}")


class RuntimeServer:
    """The runtime's state: configuration, cache, batchers, metrics, readiness."""

    def __init__(
        self,
        config: RuntimeConfig,
        backend: Backend | None = None,
        clock: Clock = CLOCK,
        wall: Callable[[], float] = CLOCK.wall,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall  # wall-clock seconds, only for the statistics' last_inference
        # Longest a request body may take once its headers are in (then 408): a stalled upload
        # would otherwise hold a connection and its buffer forever.
        self.body_read_timeout_s = config.request_read_timeout_seconds
        self.started_at = clock.monotonic()
        self.metrics = RuntimeMetrics()
        self.backend = backend if backend is not None else make_backend(config)
        self.store = EngineStore(config.cache_dir, config.s3)
        self.cache = EngineCache(config, self.backend, self.store, self.metrics, clock)
        self.batchers: dict[str, ModelBatcher] = {}
        self.ready = False
        self.draining = False  # shutting down: not ready, still serving
        # Infer requests arrived (every transport): long-polled by GET /v2/tidal/activity.
        self.arrivals = ChangeFeed()
        # Preloaded models whose last load failed (name -> the load error), retried in the
        # background; the others are served meanwhile. Readiness names these.
        self.preload_failures: dict[str, str] = {}
        # Preloaded models not loaded yet: refused until they are (then served like any other,
        # even while another one still fails).
        self.preload_pending = {m.name for m in config.models if m.preload}
        self._preload_retries = {name: Retry(PRELOAD_BACKOFF) for name in self.preload_pending}
        self._startup_task: asyncio.Task[None] | None = None
        self._random = random.Random(config.faults.seed)
        self.replica_name = os.environ.get(ENV_POD_NAME) or None  # else the listening host:port
        # JSON headers above OFFLOAD_BYTES are decoded in a worker process, one at a time:
        # a parse of seconds never stalls health, readiness or other models' requests.
        self.offload = Offload(workers=1)

    # -- lifecycle ----------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[error_middleware],
            handler_args={"logger": http_log},
        )
        app[MAX_REQUEST_BYTES] = self.config.max_request_bytes
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready_handler)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/v2/repository/index", self.repository_index)
        r.add_post("/v2/repository/models/{model}/load", self.repository_load)
        r.add_post("/v2/repository/models/{model}/unload", self.repository_unload)
        FleetEndpoints(self).add_routes(r)
        r.add_get("/v2/models/stats", self.model_stats)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(prefix, self.model_metadata)
            r.add_get(prefix + "/ready", self.model_ready)
            r.add_get(prefix + "/config", self.model_config)
            r.add_get(prefix + "/stats", self.model_stats)
            r.add_post(prefix + "/infer", self.infer)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        for spec in self.config.models:
            batcher = ModelBatcher(spec, self.cache, self.metrics, self.clock)
            batcher.start()
            self.batchers[spec.name] = batcher
        self._startup_task = asyncio.create_task(self._preload(), name="preload")

    @property
    def startup_error(self) -> str | None:
        """Why the runtime is not ready yet, naming each preloaded model that failed to load
        and why (the operator's ``Degraded``/``EngineLoadFailed`` quotes it); None when none
        failed."""
        if not self.preload_failures:
            return None
        total = sum(1 for m in self.config.models if m.preload)
        failed = "; ".join(
            f"model {name!r} failed to load: {error}"
            for name, error in sorted(self.preload_failures.items())
        )
        return f"{failed} (serving the other {total - len(self.preload_failures)} of {total})"

    def check_servable(self, name: str) -> None:
        """Refuse a request for a preloaded model that is not loaded yet (503 warming up) or
        whose load failed (503 naming its load error, retried in the background). A model that
        loaded is served while another one fails, as Triton does: readiness stays false and
        says which model failed, and only that model's requests are refused."""
        slot = self.cache.slot(name)  # an unknown model: 404
        if name not in self.preload_pending or slot.state == READY:
            return
        self._check_preload_failure(name)
        raise Unavailable("server is warming up; not ready", retry_after=1)

    def _check_preload_failure(self, name: str) -> None:
        """The 503 of a preloaded model whose load failed (and is being retried)."""
        failure = self.preload_failures.get(name)
        if failure is not None:
            raise Unavailable(
                f"model {name!r} failed to load: {failure} (retrying)",
                retry_after=max(1, round(self._preload_retries[name].delay)),
            )

    async def _preload(self) -> None:
        """Load and warm every ``preload`` model, retrying failures, then turn ready.

        The models load side by side, as many at once as the load slots allow
        (``maxConcurrentLoads``; the load queue is first come, first served, in the order of
        ``models``), so that one whose store is slow or stalled keeps only its own slot, not the
        models listed after it; each is served as soon as it has loaded
        (:meth:`check_servable`) and retried with its own back-off when it fails.
        Started host-warm (``TIDAL_START_TIER=host``): fetch and verify them only, and turn
        ready as a host-warm standby (requests refused until ``PUT /v2/tidal/tier``)."""
        host = os.environ.get("TIDAL_START_TIER", "device") == "host"
        if host:
            self.cache.tier = "host"
        # Partial downloads left by a runtime that died mid-fetch (this cache is the node's).
        await asyncio.get_running_loop().run_in_executor(None, self._sweep_node_cache)
        names = [m.name for m in self.config.models if m.preload]
        await asyncio.gather(*(self._preload_one(name, host) for name in names))
        self.preload_failures.clear()
        self.preload_pending.clear()
        self.ready = True
        self.cache.changes.bump()
        elapsed = self.clock.monotonic() - self.started_at
        self.metrics.startup_seconds.set(elapsed)
        log.info("ready after %.2f s", elapsed)

    def _sweep_node_cache(self) -> None:
        self.store.remove_stale_partials()
        self.metrics.cache_bytes.labels("host").set(self.store.host_bytes())

    async def _preload_one(self, name: str, host: bool) -> None:
        """Load (or, host-warm, stage) one preloaded model, retrying until it succeeds."""
        retry = self._preload_retries[name]
        while True:
            try:
                if host:
                    await tiers.stage(self.cache, [name])
                else:
                    await self.cache.ensure_loaded(name)
            except Exception as exc:
                self.preload_failures[name] = _load_error(name, exc)
                if not self.cache.closing:  # else: cancelled by the shutdown, not a failure
                    log.error("preloading %s failed (will retry): %s", name, exc)
                self.cache.changes.bump()
                await retry.wait()
            else:
                self.preload_failures.pop(name, None)
                self.preload_pending.discard(name)
                return

    def start_draining(self) -> None:
        """Not ready from now on (SIGTERM); requests are still served."""
        self.draining = True
        self.cache.changes.bump()

    async def _on_shutdown(self, app: web.Application) -> None:
        # Before aiohttp waits for running handlers: answer the long-polls now, and cancel the
        # fetches and loads under way (a stalled store would hold the exit up for minutes).
        self.cache.changes.close()
        self.arrivals.close()
        self.cache.cancel_loads()

    async def _on_cleanup(self, app: web.Application) -> None:
        self.ready = False
        if self._startup_task is not None:
            self._startup_task.cancel()
        for batcher in self.batchers.values():
            await batcher.stop()
        self.cache.close()
        self.offload.close()

    # -- health and metadata ------------------------------------------------------------------

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready_handler(self, request: web.Request) -> web.Response:
        ready = self.ready and not self.draining
        body: dict[str, Any] = {"ready": ready}
        if self.draining:
            body["draining"] = True
        if self.startup_error:
            body["error"] = self.startup_error
        return web.json_response(body, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "tidal-runtime",
                "version": __version__,
                "extensions": ["binary_tensor_data", "model_repository", "statistics"],
            }
        )

    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.cache.publish()
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    def _version(self, request: web.Request) -> str:
        """The model's version the path names: checked like Triton (404 for unknown ones)."""
        name = request.match_info["model"]
        served = self.cache.slot(name).spec.version  # unknown model: 404 first
        return check_version(name, request.match_info.get("version") or "", served)

    async def _known_metadata(self, name: str) -> Any:
        slot = self.cache.slot(name)
        if not slot.inputs:
            # Metadata is known once the engine has been loaded (it stays known after eviction);
            # a preload that failed is not tried again here (the preload retries it).
            self._check_preload_failure(name)
            await self.cache.ensure_loaded(name)
        return slot

    async def model_metadata(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        self._version(request)
        slot = await self._known_metadata(name)

        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

        return web.json_response(
            {
                "name": name,
                "versions": [slot.spec.version],
                "platform": slot.platform,
                "inputs": tensors(slot.inputs),
                "outputs": tensors(slot.outputs),
                "properties": self.model_properties(slot),
            }
        )

    def model_properties(self, slot: Any) -> dict[str, str]:
        """The protocol's optional model ``properties`` (strings): how this model is served."""
        return {"backend": self.config.backend, "max_batch_size": str(slot.spec.max_batch_size)}

    async def model_config(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        self._version(request)
        slot = await self._known_metadata(name)
        spec = slot.spec

        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "data_type": "TYPE_" + s.datatype, "dims": list(s.shape[1:])}
                for s in specs
            ]

        return web.json_response(
            {
                "name": name,
                "platform": slot.platform,
                "backend": self.config.backend,
                "max_batch_size": spec.max_batch_size,
                "input": tensors(slot.inputs),
                "output": tensors(slot.outputs),
                "dynamic_batching": {
                    "preferred_batch_size": spec.batching.preferred_batch_sizes,
                    "max_queue_delay_microseconds": int(spec.batching.max_queue_delay_ms * 1000),
                }
                if spec.batching.enabled
                else None,
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        self._version(request)
        slot = self.cache.slot(request.match_info["model"])
        ready = slot.state == READY
        body: dict[str, Any] = {"name": request.match_info["model"], "ready": ready}
        failure = None if ready else self.preload_failures.get(slot.spec.name) or slot.last_error
        if failure:
            body["error"] = f"model {slot.spec.name!r} failed to load: {failure}"
        return web.json_response(body, status=200 if ready else 400)

    async def model_stats(self, request: web.Request) -> web.Response:
        """The statistics extension: Triton's ``model_stats`` list (all models without a name)."""
        if "model" in request.match_info:
            names = [request.match_info["model"]]
            version = self._version(request)
        else:
            names, version = list(self.cache.slots), ""
        stats, slots = self.metrics.stats_for, self.cache.slots
        return web.json_response(
            {
                "model_stats": [
                    stats(name).as_json(name, version or slots[name].spec.version) for name in names
                ]
            }
        )

    # -- repository extension -----------------------------------------------------------------

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await self.json_body(request, {"ready"})
        only_ready = body.get("ready", False)
        if not isinstance(only_ready, bool):
            raise InvalidRequest("'ready' must be true or false")
        index = []
        for name, slot in self.cache.slots.items():
            if only_ready and slot.state != READY:
                continue
            entry = {"name": name, "version": slot.spec.version, "state": slot.state}
            if slot.last_error:
                entry["reason"] = slot.last_error
            index.append(entry)
        return web.json_response(index)

    async def repository_load(self, request: web.Request) -> web.Response:
        body = await self.json_body(request, {"parameters"})
        parameters = body.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be a JSON object")
        if parameters:
            raise InvalidRequest(
                f"load parameters {sorted(parameters)} are not supported: the model's "
                "configuration comes from the runtime configuration"
            )
        await self.cache.ensure_loaded(request.match_info["model"], on_demand=False)
        return web.json_response({})

    async def repository_unload(self, request: web.Request) -> web.Response:
        body = await self.json_body(request, {"parameters"})
        parameters = body.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, dict) or set(parameters) - {"unload_dependents"}:
            raise InvalidRequest("'parameters' may only hold 'unload_dependents'")
        if not isinstance(parameters.get("unload_dependents", False), bool):
            raise InvalidRequest("'unload_dependents' must be true or false")
        await self.cache.unload(request.match_info["model"])
        return web.json_response({})

    async def json_body(
        self, request: web.Request, allowed: set[str] | None = None
    ) -> dict[str, Any]:
        raw = await read_body(request, self.config.max_request_bytes, self.body_read_timeout_s)
        if not raw:
            return {}
        body = parse_json(raw, "the body", CONTROL_JSON_VALUES, CONTROL_LIMIT)
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        unknown = sorted(set(body) - allowed) if allowed is not None else []
        if unknown:
            raise InvalidRequest(f"unknown fields {unknown}; expected {sorted(allowed or ())}")
        return body

    # -- inference ----------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        with RequestAccounting(self, name) as accounting:
            response, accounting.cold = await self._infer(name, request)
            accounting.code = response.status
            return response

    async def _decode(self, body: bytes, header_length: int | None) -> InferRequest:
        """The request decoded: in place when its JSON is small, else in the worker process
        (``json.loads`` of megabytes holds the interpreter for seconds)."""
        json_bytes = len(body) if header_length is None else header_length
        max_values = self.config.max_json_values
        if json_bytes <= OFFLOAD_BYTES:
            return decode_request(body, header_length, max_values)
        try:
            return await self.offload.run(decode_request, body, header_length, max_values)
        except BodyError as error:  # the worker died
            raise as_body_error(error) from None

    async def _infer(self, name: str, request: web.Request) -> tuple[web.Response, bool]:
        refused = declared_too_large(request, self.config.max_request_bytes)
        if refused is not None:
            raise as_body_error(refused)
        version = self._version(request)
        spec = self.cache.slot(name).spec
        self.check_servable(name)
        body = await read_body(request, self.config.max_request_bytes, self.body_read_timeout_s)
        header = request.headers.get(HEADER_LENGTH)
        try:
            header_length = int(header) if header is not None else None
        except ValueError:
            raise InvalidRequest(f"{HEADER_LENGTH} must be an integer") from None
        decoded = await self._decode(body, header_length)
        faults = self.config.faults
        if faults.error_rate and self._random.random() < faults.error_rate:
            raise InjectedFault("injected fault (faults.errorRate)")
        engine, cold = await self.cache.acquire(name)
        try:
            rows, key = _validate(decoded.inputs, engine.inputs, spec.max_batch_size)
            if decoded.outputs is not None:
                known = {o.name for o in engine.outputs}
                for wanted in decoded.outputs:
                    if wanted.name not in known:
                        raise InvalidInput(
                            f"unknown output {wanted.name!r}; outputs are {sorted(known)}"
                        )
            timeout_ms = decoded.timeout_us / 1000.0 if decoded.timeout_us else None
            future = self.batchers[name].submit(decoded.inputs, rows, key, timeout_ms)
            outputs = await future
        finally:
            self.cache.release(name)
        payload, header_len = encode_response(
            name,
            outputs,
            decoded.outputs,
            decoded.binary_default,
            decoded.id,
            version,
            self.config.non_finite_json,
        )
        if faults.added_latency_ms:
            await asyncio.sleep(faults.added_latency_ms / 1000.0)
        if header_len is None:
            return web.Response(body=payload, content_type="application/json"), cold
        return (
            web.Response(
                body=payload,
                headers={
                    HEADER_LENGTH: str(header_len),
                    "Content-Type": "application/octet-stream",
                },
            ),
            cold,
        )


def make_runner(server: RuntimeServer) -> JsonErrorRunner:
    """The one runner of the HTTP app, alone or beside gRPC: aiohttp's own protocol-level
    answers in JSON, and header blocks bounded by ``headerReadTimeoutSeconds``."""
    return JsonErrorRunner(
        server.build_app(),
        access_log=None,
        handle_signals=False,
        header_read_timeout=server.config.header_read_timeout_seconds,
    )


async def serve(
    config: RuntimeConfig,
    host: str,
    port: int,
    backend: Backend | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the server until cancelled or until ``stop`` is set.

    After ``stop`` the server drains: readiness fails at once, requests are still served for
    ``shutdownDrainSeconds`` (endpoints and client balancers catch up meanwhile), then it exits.
    """
    server = RuntimeServer(config, backend)
    runner = make_runner(server)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("tidal-runtime listening on %s:%d (backend %s)", host, port, config.backend)
    try:
        await (stop or asyncio.Event()).wait()
        server.start_draining()
        log.info("stopping: not ready, serving for %.1fs more", config.shutdown_drain_seconds)
        await asyncio.sleep(config.shutdown_drain_seconds)
    finally:
        await runner.cleanup()
