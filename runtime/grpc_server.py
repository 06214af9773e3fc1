"""gRPC transport: the Open Inference Protocol v2 service (``inference.GRPCInferenceService``).

The calls KServe and Triton serve over gRPC — ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelConfig, ModelInfer, ModelStatistics and the repository
calls — answered by the same :class:`~tidal.runtime.server.RuntimeServer` as HTTP: one event
loop (``grpc.aio``), one engine cache, one batcher per model (a gRPC and an HTTP request can
share a batch), one set of Prometheus metrics and statistics.  Infer requests are counted under
the HTTP status their outcome maps to (``code="200"``, ``"400"``, ``"503"``, ``"499"`` for a
client that went away, …) whatever the transport, so error rates read the same.

Every :class:`~tidal.runtime.errors.ServingError` becomes the gRPC status of
:func:`grpc_status` with its message (and ``retry-after`` in the trailing metadata when it has
one); requests are parsed here, not by gRPC, so that an undecodable message is an
INVALID_ARGUMENT rather than gRPC's INTERNAL.  Calls the runtime does not serve
(streaming, shared memory, trace, logs) are UNIMPLEMENTED.

Tensors come as ``raw_input_contents`` (one little-endian buffer per input, read as a numpy
view without a copy) or as typed ``contents``; outputs always go back as
``raw_output_contents``, as Triton answers them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from . import __version__
from .backends import Backend
from .config import RuntimeConfig
from .enginecache import READY
from .errors import (
    InjectedFault,
    InvalidInput,
    InvalidRequest,
    ServingError,
)
from .grpc import oip_v2_pb2 as pb
from .protocol import DATATYPES, datatype_of
from .server import (
    RequestAccounting,
    RuntimeServer,
    _validate,
    check_version,
    make_runner,
)

log = logging.getLogger("tidal.runtime.grpc")

SERVICE = "inference.GRPCInferenceService"
# The same service under the name runtime/grpc/oip_v2.proto declares (package tidal.oip.v2),
# so that a client stub generated from that file reaches it too.
STUB_SERVICE = "tidal.oip.v2.GRPCInferenceService"
MAX_DIMS = 64  # numpy's limit, and Triton's (as over HTTP)

Arrays = dict[str, np.ndarray[Any, Any]]

# HTTP status -> gRPC code, for errors that do not name their own (``grpc_code``).
_BY_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
}

# Which typed-contents field carries each datatype (FP16 only travels raw, as in Triton).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

# Triton's model configuration names BYTES "STRING".
_TRITON_TYPES = {
    name: pb.DataType.Value("TYPE_STRING" if name == "BYTES" else "TYPE_" + name)
    for name in DATATYPES
}
_LENGTH = struct.Struct("<I")  # the length prefix of each raw BYTES element (Triton's layout)


def _raw_bytes(name: str, buffer: bytes, count: int) -> np.ndarray[Any, Any]:
    """A raw BYTES tensor: each element a 4-byte little-endian length, then its bytes."""
    items: list[bytes] = []
    offset = 0
    while offset < len(buffer) and len(items) < count:
        if offset + _LENGTH.size > len(buffer):
            break
        (length,) = _LENGTH.unpack_from(buffer, offset)
        offset += _LENGTH.size
        if offset + length > len(buffer):
            break
        items.append(buffer[offset : offset + length])
        offset += length
    if len(items) != count or offset != len(buffer):
        raise InvalidInput(
            f"input {name!r}: raw BYTES contents do not hold exactly {count} "
            "length-prefixed elements"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def _raw_of(array: np.ndarray[Any, Any]) -> bytes:
    """The raw contents of an output tensor (BYTES length-prefixed, numbers little-endian)."""
    if array.dtype == object:
        parts = []
        for item in array.ravel():
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    little: bytes = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return little


def grpc_status(error: ServingError) -> grpc.StatusCode:
    """The gRPC status of a serving error (its ``grpc_code``, else from its HTTP status)."""
    named = getattr(error, "grpc_code", None)
    if isinstance(named, str) and named in grpc.StatusCode.__members__:
        return grpc.StatusCode[named]
    if error.status in _BY_STATUS:
        return _BY_STATUS[error.status]
    return grpc.StatusCode.INVALID_ARGUMENT if error.status < 500 else grpc.StatusCode.INTERNAL


def _check_version(runtime: RuntimeServer, name: str, version: str) -> None:
    """Like the HTTP paths: unknown model first (NOT_FOUND), then the version (a model has the one
    version its configuration names, default 1; empty means that one)."""
    check_version(name, version, runtime.cache.slot(name).spec.version)


def _timeout_ms(request: Any, deadline_ms: float | None) -> float | None:
    """The shorter of the call's deadline and Triton's ``timeout`` parameter (microseconds)."""
    parameter = request.parameters.get("timeout")
    if parameter is None:
        return deadline_ms
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param") or getattr(parameter, kind) < 0:
        raise InvalidRequest("parameter 'timeout' must be a non-negative integer (microseconds)")
    microseconds = int(getattr(parameter, kind))
    if microseconds == 0:
        return deadline_ms
    return min(microseconds / 1000.0, deadline_ms) if deadline_ms else microseconds / 1000.0


def _shape(name: str, dims: Any) -> list[int]:
    shape = [int(d) for d in dims]
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"input {name!r}: {len(shape)} dimensions; at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input {name!r}: shape {shape} has a negative dimension")
    return shape


def _typed_array(tensor: Any, dtype: np.dtype[Any], shape: list[int]) -> np.ndarray[Any, Any]:
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidInput(
            f"input {tensor.name!r}: {tensor.datatype} travels only in raw_input_contents"
        )
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"input {tensor.name!r}: shape {shape} needs {count} elements, "
            f"contents.{field} has {len(values)}"
        )
    if field == "bytes_contents":
        wide = np.empty(count, dtype=object)
        wide[:] = list(values)
    else:
        wide = np.array(values, dtype=np.dtype(field_dtype(field)))
    array = wide.astype(dtype)
    if dtype.kind in "iu" and wide.size and not np.array_equal(array, wide):
        raise InvalidInput(f"input {tensor.name!r}: a value is out of range for {tensor.datatype}")
    for other in _CONTENTS_FIELD.values():
        if other != field and len(getattr(tensor.contents, other)):
            raise InvalidInput(
                f"input {tensor.name!r}: {tensor.datatype} data belongs in contents.{field}, "
                f"not contents.{other}"
            )
    return array.reshape(shape)


def field_dtype(field: str) -> str:
    """The numpy type of one typed-contents field, as protobuf stores it."""
    return {
        "bool_contents": "bool",
        "int_contents": "int32",
        "int64_contents": "int64",
        "uint_contents": "uint32",
        "uint64_contents": "uint64",
        "fp32_contents": "float32",
        "fp64_contents": "float64",
        "bytes_contents": "object",
    }[field]


def decode_inputs(request: Any) -> Arrays:
    """Named numpy arrays of a ModelInferRequest (raw or typed contents); raises InvalidInput."""
    if not request.inputs:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} buffers for {len(request.inputs)} inputs"
        )
    inputs: Arrays = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise InvalidInput(f"input {name!r} given twice")
        dtype = DATATYPES.get(tensor.datatype)
        if dtype is None:
            raise InvalidInput(
                f"input {name!r}: datatype {tensor.datatype!r} is not supported; "
                f"expected one of {sorted(DATATYPES)}"
            )
        shape = _shape(name, tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(
                    f"input {name!r} has contents although raw_input_contents is given"
                )
            buffer = raw[index]
            if tensor.datatype == "BYTES":
                inputs[name] = _raw_bytes(name, buffer, math.prod(shape)).reshape(shape)
                continue
            need = math.prod(shape) * dtype.itemsize
            if len(buffer) != need:
                raise InvalidInput(
                    f"input {name!r}: shape {shape} of {tensor.datatype} needs {need} bytes, "
                    f"raw_input_contents[{index}] has {len(buffer)}"
                )
            array = np.frombuffer(buffer, dtype=dtype.newbyteorder("<"))
            inputs[name] = array.astype(dtype, copy=False).reshape(shape)
        else:
            inputs[name] = _typed_array(tensor, dtype, shape)
    return inputs


def encode_outputs(response: Any, outputs: Arrays, names: list[str] | None) -> None:
    """Fill ``response`` with ``outputs`` (all, or those ``names``), as raw contents."""
    for name in names if names is not None else list(outputs):
        array = outputs[name]
        tensor = response.outputs.add()
        tensor.name = name
        tensor.datatype = datatype_of(array.dtype)
        tensor.shape.extend(array.shape)
        response.raw_output_contents.append(_raw_of(array))


class GrpcInference:
    """The service's calls, over a :class:`RuntimeServer` that HTTP serves as well."""

    def __init__(self, runtime: RuntimeServer) -> None:
        self.runtime = runtime

    # -- health and metadata ------------------------------------------------------------------

    async def server_live(self, request: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.runtime.ready and not self.runtime.draining)

    async def server_metadata(self, request: Any) -> Any:
        return pb.ServerMetadataResponse(
            name="tidal-runtime",
            version=__version__,
            extensions=["binary_tensor_data", "model_repository", "statistics"],
        )

    async def model_ready(self, request: Any) -> Any:
        _check_version(self.runtime, request.name, request.version)
        return pb.ModelReadyResponse(ready=self.runtime.cache.slot(request.name).state == READY)

    async def model_metadata(self, request: Any) -> Any:
        _check_version(self.runtime, request.name, request.version)
        slot = await self.runtime._known_metadata(request.name)
        meta = pb.ModelMetadataResponse
        return meta(
            name=request.name,
            versions=[slot.spec.version],
            platform=slot.platform or "",
            inputs=[
                meta.TensorMetadata(name=s.name, datatype=s.datatype, shape=s.shape)
                for s in slot.inputs
            ],
            outputs=[
                meta.TensorMetadata(name=s.name, datatype=s.datatype, shape=s.shape)
                for s in slot.outputs
            ],
            properties=self.runtime.model_properties(slot),
        )

    async def model_config(self, request: Any) -> Any:
        _check_version(self.runtime, request.name, request.version)
        slot = await self.runtime._known_metadata(request.name)
        spec = slot.spec
        config = pb.ModelConfig(
            name=request.name,
            platform=slot.platform or "",
            backend=self.runtime.config.backend,
            max_batch_size=spec.max_batch_size,
            input=[
                pb.ModelInput(name=s.name, data_type=_TRITON_TYPES[s.datatype], dims=s.shape[1:])
                for s in slot.inputs
            ],
            output=[
                pb.ModelOutput(name=s.name, data_type=_TRITON_TYPES[s.datatype], dims=s.shape[1:])
                for s in slot.outputs
            ],
        )
        if spec.batching.enabled:
            config.dynamic_batching.preferred_batch_size.extend(spec.batching.preferred_batch_sizes)
            config.dynamic_batching.max_queue_delay_microseconds = int(
                spec.batching.max_queue_delay_ms * 1000
            )
        return pb.ModelConfigResponse(config=config)

    async def model_statistics(self, request: Any) -> Any:
        """The statistics extension (every model when no name is given), shared with HTTP."""
        if request.name:
            _check_version(self.runtime, request.name, request.version)
            names = [request.name]
        else:
            names = list(self.runtime.cache.slots)
        response = pb.ModelStatisticsResponse()
        for name in names:
            served = self.runtime.cache.slot(name).spec.version
            stats = self.runtime.metrics.stats_for(name).as_json(name, served)
            json_format.ParseDict(stats, response.model_stats.add(), ignore_unknown_fields=True)
        return response

    # -- repository extension -----------------------------------------------------------------

    async def repository_index(self, request: Any) -> Any:
        index = pb.RepositoryIndexResponse
        models = [
            index.ModelIndex(
                name=name, version=slot.spec.version, state=slot.state, reason=slot.last_error or ""
            )
            for name, slot in self.runtime.cache.slots.items()
            if not request.ready or slot.state == READY
        ]
        return index(models=models)

    async def repository_load(self, request: Any) -> Any:
        await self.runtime.cache.ensure_loaded(request.model_name, on_demand=False)
        return pb.RepositoryModelLoadResponse()

    async def repository_unload(self, request: Any) -> Any:
        await self.runtime.cache.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- inference ----------------------------------------------------------------------------

    async def model_infer(self, request: Any, deadline_ms: float | None = None) -> Any:
        """One inference, counted in the same metrics (and batched with) HTTP requests; a call
        cancelled (the client went away, its deadline passed) counts as 499."""
        with RequestAccounting(self.runtime, request.model_name) as accounting:
            response, accounting.cold = await self._infer(request, deadline_ms)
            return response

    async def _infer(self, request: Any, deadline_ms: float | None) -> tuple[Any, bool]:
        runtime = self.runtime
        name = request.model_name
        spec = runtime.cache.slot(name).spec
        _check_version(runtime, name, request.model_version)
        runtime.check_servable(name)
        inputs = decode_inputs(request)
        wanted = [o.name for o in request.outputs] if request.outputs else None
        faults = runtime.config.faults
        if faults.error_rate and runtime._random.random() < faults.error_rate:
            raise InjectedFault("injected fault (faults.errorRate)")
        engine, cold = await runtime.cache.acquire(name)
        try:
            rows, key = _validate(inputs, engine.inputs, spec.max_batch_size)
            if wanted is not None:
                known = {o.name for o in engine.outputs}
                for output in wanted:
                    if output not in known:
                        raise InvalidInput(
                            f"unknown output {output!r}; outputs are {sorted(known)}"
                        )
                if len(set(wanted)) != len(wanted):
                    raise InvalidInput(f"an output is requested twice: {wanted}")
            timeout_ms = _timeout_ms(request, deadline_ms)
            future = runtime.batchers[name].submit(inputs, rows, key, timeout_ms)
            outputs = await future
        finally:
            runtime.cache.release(name)
        response = pb.ModelInferResponse(model_name=name, model_version=spec.version, id=request.id)
        encode_outputs(response, outputs, wanted)
        if faults.added_latency_ms:
            await asyncio.sleep(faults.added_latency_ms / 1000.0)
        return response, cold


Call = Callable[..., Awaitable[Any]]


def _unary(call: Call, request_type: Any, *, deadline: bool = False) -> grpc.RpcMethodHandler:
    """A unary handler that parses its own request (bad bytes: INVALID_ARGUMENT, not INTERNAL)
    and maps every error once."""

    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            try:
                request = request_type.FromString(raw)
            except (DecodeError, ValueError, RuntimeError) as exc:
                raise InvalidRequest(
                    f"the request is not a valid {request_type.__name__}: {exc}"
                ) from None
            if deadline:
                remaining = context.time_remaining()
                deadline_ms = remaining * 1000.0 if remaining is not None else None
                response: ProtoMessage = await call(request, deadline_ms)
            else:
                response = await call(request)
            serialized: bytes = response.SerializeToString()
            return serialized
        except ServingError as error:
            metadata: tuple[tuple[str, str], ...] = ()
            if error.retry_after is not None:
                metadata = (("retry-after", str(error.retry_after)),)
            await context.abort(grpc_status(error), error.message, trailing_metadata=metadata)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # the process must survive anything a client sends
            log.exception("unhandled error in a gRPC call")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
        raise AssertionError("unreachable: abort raises")

    return grpc.unary_unary_rpc_method_handler(handle)


def service_handlers(service: GrpcInference) -> tuple[grpc.GenericRpcHandler, ...]:
    """The ``GRPCInferenceService`` calls the runtime answers, under both service names."""
    methods = {
        "ServerLive": _unary(service.server_live, pb.ServerLiveRequest),
        "ServerReady": _unary(service.server_ready, pb.ServerReadyRequest),
        "ServerMetadata": _unary(service.server_metadata, pb.ServerMetadataRequest),
        "ModelReady": _unary(service.model_ready, pb.ModelReadyRequest),
        "ModelMetadata": _unary(service.model_metadata, pb.ModelMetadataRequest),
        "ModelConfig": _unary(service.model_config, pb.ModelConfigRequest),
        "ModelStatistics": _unary(service.model_statistics, pb.ModelStatisticsRequest),
        "ModelInfer": _unary(service.model_infer, pb.ModelInferRequest, deadline=True),
        "RepositoryIndex": _unary(service.repository_index, pb.RepositoryIndexRequest),
        "RepositoryModelLoad": _unary(service.repository_load, pb.RepositoryModelLoadRequest),
        "RepositoryModelUnload": _unary(service.repository_unload, pb.RepositoryModelUnloadRequest),
    }
    return tuple(
        grpc.method_handlers_generic_handler(name, methods) for name in (SERVICE, STUB_SERVICE)
    )


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(runtime: RuntimeServer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC listener on the running loop; returns the server and its bound port.

    Messages may be as large as ``maxRequestBytes`` (gRPC itself refuses larger ones with
    RESOURCE_EXHAUSTED before they are read).  Raises OSError when the port cannot be bound."""
    limit = runtime.config.max_request_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
            # gRPC sets SO_REUSEPORT by default: a second runtime on the same port would then
            # silently take half of this one's calls. Refuse instead.
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers(service_handlers(GrpcInference(runtime)))
    try:
        bound = server.add_insecure_port(_address(host, port))
    except RuntimeError as exc:  # grpcio raises this when the address is taken
        raise OSError(f"cannot listen for gRPC on {_address(host, port)}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {_address(host, port)}")
    await server.start()
    return server, bound


async def serve(
    config: RuntimeConfig,
    host: str,
    port: int,
    grpc_port: int,
    backend: Backend | None = None,
    stop: asyncio.Event | None = None,
    *,
    grpc_optional: bool = False,
) -> None:
    """Serve HTTP on ``port`` and gRPC on ``grpc_port`` from one process and one event loop.

    ``grpc_optional`` (the port is the default, not asked for): when it is taken, log a
    warning and serve HTTP only, so that several runtimes started by hand on one host do not
    fail; an explicitly configured port that cannot be bound raises OSError.  The same drain
    as :func:`tidal.runtime.server.serve`: after ``stop`` readiness fails on both transports at
    once, requests are still served for ``shutdownDrainSeconds``, then both stop.
    """
    from aiohttp import web

    runtime = RuntimeServer(config, backend)
    # The same runner as HTTP alone: a plain AppRunner answered malformed HTTP in plain text.
    runner = make_runner(runtime)
    await runner.setup()  # starts the batchers (the app's on_startup)
    grpc_server: grpc.aio.Server | None = None
    try:
        try:
            grpc_server, bound = await start_grpc(runtime, host, grpc_port)
            log.info("tidal-runtime gRPC listening on %s", _address(host, bound))
        except OSError as exc:
            if not grpc_optional:
                raise
            log.warning("%s; serving HTTP only (set --grpc-port or TIDAL_GRPC_PORT)", exc)
        site = web.TCPSite(runner, host, port)
        await site.start()
        log.info("tidal-runtime listening on %s:%d (backend %s)", host, port, config.backend)
        await (stop or asyncio.Event()).wait()
        runtime.start_draining()
        log.info("stopping: not ready, serving for %.1fs more", config.shutdown_drain_seconds)
        await asyncio.sleep(config.shutdown_drain_seconds)
    finally:
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)
        await runner.cleanup()
