"""The gateway's gRPC transport: OIP v2 unary calls passed through to a replica as raw bytes.

A ``grpc.aio`` generic handler takes every unary call of ``inference.GRPCInferenceService``
(and of ``tidal.oip.v2.GRPCInferenceService``, the name of the runtime's own ``.proto``)
without deserialising it: the gateway reads only the model name (field 1 of the model calls'
requests, found by walking the protobuf wire format, no message class), routes it through the
same loop as HTTP (:class:`~tidal.gateway.dispatch.Dispatcher`: the same decisions, counts and
loads), and sends the same bytes to the replica's
gRPC port (its HTTP URL's host, ``replicaGrpcPort``); the answer's bytes, status, details and
trailing metadata (``retry-after``) come back unchanged. A model call with no routable replica
is held like an HTTP request: counted in the same ``held_now`` (so ``GET /v2/tidal/held`` and
the operator's wake see it), bounded by the same ``maxHeldRequests`` and ``maxHeldBytes``, for
``holdTimeoutSeconds`` or the call's own deadline when shorter (and no longer than the drain on
SIGTERM), then ``UNAVAILABLE`` with a message saying so and a ``retry-after`` (seconds).
A replica that answers ``UNAVAILABLE`` (no such answer is a served request) or cannot be
reached is tried once more on another, as HTTP does.

``ServerLive``/``ServerReady`` are answered by the gateway itself, as ``/v2/health/*`` are
(an activator is ready with no replica), and so is ``ServerMetadata``, as ``GET /v2`` is (the
gateway, not whichever replica's ``tidal-runtime``); the other calls without a model
(repository) go to any healthy replica, unheld.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

import grpc

from . import EXTENSIONS, SERVER_NAME, __version__
from .dispatch import Call, Failed, Refusal
from .replicas import Replica

if TYPE_CHECKING:
    from .server import Gateway

log = logging.getLogger("tidal.gateway.grpc")

SERVICES = ("inference.GRPCInferenceService", "tidal.oip.v2.GRPCInferenceService")
# Calls whose request names the model in field 1 (``name`` or ``model_name``).
MODEL_CALLS = frozenset(
    {"ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"}
)
HELD_CALLS = frozenset({"ModelInfer"})  # held at zero, like POST .../infer
LOCAL_CALLS = frozenset({"ServerLive", "ServerReady", "ServerMetadata"})
TRUE = b"\x08\x01"  # a response message whose bool field 1 is true; b"": false
# Metadata a proxy must not copy onto its own call (gRPC sets these, and grpc-*, itself).
HOP_BY_HOP = frozenset({"grpc-timeout", "content-type", "user-agent", "te", ":authority"})
Answer: TypeAlias = "bytes | grpc.aio.AioRpcError"  # a replica's: its message, or its status


async def start_grpc(gateway: Gateway, host: str, port: int) -> tuple[grpc.aio.Server, GrpcProxy]:
    """Listen for gRPC on ``host:port`` (0: a free port, see ``grpc_port`` of the result)."""
    proxy = GrpcProxy(gateway)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", gateway.config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    server.add_generic_rpc_handlers((proxy,))
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    proxy.port = bound
    await server.start()
    return server, proxy


class WireError(ValueError):
    """The request is not a protobuf message."""


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def model_name(data: bytes) -> str:
    """Field 1 (a string) of a serialised protobuf message; ``""`` when absent (proto3's
    default). Other fields are skipped by their wire type, never decoded."""
    offset = 0
    name = ""
    while offset < len(data):
        key, offset = _varint(data, offset)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, offset = _varint(data, offset)
        elif kind == 1:
            offset += 8
        elif kind == 5:
            offset += 4
        elif kind == 2:
            length, offset = _varint(data, offset)
            if offset + length > len(data):
                raise WireError("a length-delimited field runs past the end")
            if number == 1:
                try:
                    name = data[offset : offset + length].decode()  # the last one wins
                except UnicodeDecodeError:
                    raise WireError("field 1 is not UTF-8") from None
            offset += length
        else:
            raise WireError(f"wire type {kind} is not supported")
    if offset != len(data):
        raise WireError("truncated field")
    return name


def _field(number: int, value: str) -> bytes:
    """A length-delimited protobuf field (string ``value`` under field ``number``)."""
    data = value.encode()
    length, size = b"", len(data)
    while True:
        byte = size & 0x7F
        size >>= 7
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([number << 3 | 2]) + length + data


def server_metadata(name: str, version: str, extensions: tuple[str, ...]) -> bytes:
    """A serialised ``ServerMetadataResponse`` (name 1, version 2, extensions 3)."""
    return _field(1, name) + _field(2, version) + b"".join(_field(3, e) for e in extensions)


def grpc_target(url: str, port: int) -> str:
    """The replica's gRPC address: its HTTP URL's host with the gRPC port."""
    host = urlsplit(url).hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcProxy(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no types
    """Routes the calls of :data:`SERVICES` through ``gateway``; others are UNIMPLEMENTED."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.channels: dict[str, tuple[str, grpc.aio.Channel]] = {}  # replica -> (target, ch)
        self.port = 0  # where it listens, once started
        self._closing: set[asyncio.Task[None]] = set()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = str(details.method)  # "/package.Service/Call"
        service, _, call = method.lstrip("/").partition("/")
        if service not in SERVICES:
            return None
        if call in LOCAL_CALLS:
            return grpc.unary_unary_rpc_method_handler(self._local(call))
        return grpc.unary_unary_rpc_method_handler(self._forwarder(method, call))

    def _local(self, call: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            gw = self.gateway
            if call == "ServerLive":
                return TRUE
            if call == "ServerMetadata":
                return server_metadata(SERVER_NAME, __version__, EXTENSIONS)
            return TRUE if gw.ready else b""

        return answer

    def _forwarder(
        self, method: str, call: str
    ) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self.dispatch(method, call, request, context)

        return forward

    async def close(self) -> None:
        channels = [channel for _, channel in self.channels.values()]
        self.channels.clear()
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    def _channel(self, name: str, url: str) -> grpc.aio.Channel:
        target = grpc_target(url, self.gateway.config.replica_grpc_port)
        known = self.channels.get(name)
        if known is not None and known[0] == target:
            return known[1]
        # A replica gone (or moved) keeps no channel: close those before opening another.
        for gone in [n for n in self.channels if n not in self.gateway.replicas or n == name]:
            _, old = self.channels.pop(gone)
            task = asyncio.get_running_loop().create_task(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        channel = grpc.aio.insecure_channel(target)
        self.channels[name] = (target, channel)
        return channel

    async def dispatch(
        self, method: str, call: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        gw = self.gateway
        model = ""
        if call in MODEL_CALLS:
            try:
                model = model_name(request)
            except WireError as exc:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {call} request: {exc}"
                )
            if not model and call != "ModelStatistics":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{call}: no model name")
        hold = call in HELD_CALLS
        if hold:  # the request is not parsed: a well-formed call is demand
            gw.holds.arrived()
        metadata = tuple(
            (k, v)
            for k, v in (context.invocation_metadata() or ())
            if k not in HOP_BY_HOP and not k.startswith(("grpc-", ":"))
        )
        answer, _ = await gw.dispatcher.dispatch(
            GrpcCall(model, len(request), hold, self, method, request, metadata, context)
        )
        if isinstance(answer, bytes):
            return answer
        if isinstance(answer, grpc.aio.AioRpcError):  # the replica's own status
            trailing = tuple(answer.trailing_metadata() or ())
            await context.abort(answer.code(), answer.details() or "", trailing)
        assert isinstance(answer, Refusal)
        await context.abort(*self._refused(answer))
        raise AssertionError("context.abort returns only by raising")

    def _refused(
        self, refusal: Refusal
    ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """A call no replica answers: its status, details and trailing metadata."""
        what = f"model {refusal.model!r}" if refusal.model else "the service"
        retry = (("retry-after", str(refusal.retry_after)),) if refusal.retry_after else ()
        kind = refusal.kind
        if kind == "unknown":
            return grpc.StatusCode.NOT_FOUND, f"unknown model {refusal.model!r}", ()
        if kind == "unavailable":
            return (
                grpc.StatusCode.UNAVAILABLE,
                f"{what} is not ready on any replica; retry later",
                (),
            )
        if kind == "full":
            return (
                grpc.StatusCode.UNAVAILABLE,
                f"{what} is not ready on any replica and cannot be held: {refusal.detail}; "
                "retry later",
                retry,
            )
        if kind in ("expired", "drained"):
            why = "the gateway is shutting down and " if kind == "drained" else ""
            return (
                grpc.StatusCode.UNAVAILABLE,
                f"{why}{what} is not ready on any replica; held {refusal.held_s:.1f} s "
                f"(holdTimeoutSeconds {self.gateway.config.hold_timeout_seconds:g}, or the "
                "call's deadline), retry later",
                retry,
            )
        if kind == "load-failed" and refusal.failure is not None:
            body = refusal.failure.body.decode(errors="replace")[:300]
            message = f"loading {what} failed: {refusal.failure.status} {body}"
            return grpc.StatusCode.INTERNAL, message, ()
        return grpc.StatusCode.UNAVAILABLE, f"{what}: {kind} {refusal.detail}".strip(), ()

    async def send(
        self,
        replica: Replica,
        method: str,
        request: bytes,
        metadata: tuple[tuple[str, Any], ...],
        context: grpc.aio.ServicerContext,
    ) -> Answer | Failed[Answer]:
        """The replica's answer or its error (status, details and trailing metadata);
        :class:`Failed` when it served nothing (unreachable, or ``UNAVAILABLE``)."""
        gw = self.gateway
        channel = self._channel(replica.name, replica.url)
        stub = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        timeout = gw.config.upstream_timeout_seconds
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(remaining, 0.001))
        try:
            answer: bytes = await stub(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                return exc
            gw.metrics.upstream_error["unavailable"].inc()
            log.info("replica %s over gRPC: %s", replica.name, exc.details())
            return Failed("unavailable", exc.details() or "", exc)
        return answer


@dataclass(eq=False)
class GrpcCall(Call[Answer]):
    """One gRPC call as :class:`~tidal.gateway.dispatch.Dispatcher` dispatches it (a call
    whose client leaves is cancelled by ``grpc.aio``)."""

    proxy: GrpcProxy
    method: str
    request: bytes
    metadata: tuple[tuple[str, Any], ...]
    context: grpc.aio.ServicerContext

    async def send(self, replica: Replica) -> Answer | Failed[Answer]:
        return await self.proxy.send(
            replica, self.method, self.request, self.metadata, self.context
        )

    async def hold_seconds(self) -> float:
        """``holdTimeoutSeconds``, or the call's own deadline when it comes first."""
        seconds = self.proxy.gateway.config.hold_timeout_seconds
        remaining = self.context.time_remaining()
        return seconds if remaining is None else min(seconds, max(remaining, 0.0))
