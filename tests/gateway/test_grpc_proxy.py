"""OIP v2 gRPC through the gateway: unary calls pass through to a real runtime as raw bytes,
are held at zero like HTTP requests (counted in the same held count, bounded by the same
maxHeldRequests, until holdTimeoutSeconds or the call's deadline), then UNAVAILABLE saying so."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import numpy as np
import pytest
from gatewaytest import http, wait_for

from tidal.gateway.grpc_proxy import WireError, model_name
from tidal.runtime.grpc import oip_v2_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"
VECTOR = np.linspace(-1.0, 1.0, 16, dtype=np.float32)


def _infer_request(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id="r1")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(VECTOR.tobytes())
    return request


def _raw_call(port: int, method: str, request: bytes, timeout: float = 60.0) -> bytes:
    """One unary call with raw bytes both ways (what the gateway forwards)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(SERVICE + method)
        answer: bytes = call(request, timeout=timeout)
        return answer


def _held(gw: Any) -> int:
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held")
    assert status == 200, body
    return int(body["held"])


@pytest.mark.parametrize(
    ("message", "name"),
    [
        (pb.ModelInferRequest(model_name="m0", id="x", model_version="1"), "m0"),
        (pb.ModelInferRequest(id="x"), ""),  # proto3: an empty name is not on the wire
        (pb.ModelReadyRequest(name="räksmörgås", version="2"), "räksmörgås"),
        (_infer_request("m1"), "m1"),
    ],
)
def test_the_model_name_is_read_from_the_wire_without_a_message_class(
    message: Any, name: str
) -> None:
    assert model_name(message.SerializeToString()) == name


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\x0b\x00", b"\xff"])
def test_a_truncated_or_odd_message_is_a_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        model_name(data)


def test_a_grpc_call_at_zero_is_held_then_passed_through_to_the_replica_byte_for_byte(
    runtimes, runtime_config, gateway
) -> None:
    # The replica runs, but the gateway does not know it yet: the service is at zero.
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    gw = gateway(
        [],
        grpc=True,
        activator=True,
        models=["m0"],
        holdTimeoutSeconds=120,
        replicaGrpcPort=a.grpc_port,
    )
    # The gateway answers ServerReady itself: an activator is ready at zero.
    ready = pb.ServerReadyResponse.FromString(_raw_call(gw.grpc_port, "ServerReady", b""))
    assert ready.ready
    request = _infer_request("m0").SerializeToString()
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["answer"] = _raw_call(gw.grpc_port, "ModelInfer", request, timeout=90)
        except grpc.RpcError as exc:
            result["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    # Held: counted where the operator's long-poll reads it, like an HTTP request.
    wait_for(lambda: _held(gw) == 1, what="the gRPC call held at zero")
    # The operator pushes the replica once it is Ready: the held call goes to it.
    status, _, body = http("PUT", f"{gw.url}/v2/tidal/replicas", {"replicas": [a.ref.model_dump()]})
    assert status == 200, body
    caller.join(60)
    assert not caller.is_alive(), "the held gRPC call was not answered once the replica came"
    assert "error" not in result, result
    # The same bytes the runtime answers directly (ids and outputs alike): passed through.
    direct = _raw_call(a.grpc_port, "ModelInfer", request)
    assert result["answer"] == direct
    answer = pb.ModelInferResponse.FromString(result["answer"])
    assert answer.model_name == "m0" and answer.id == "r1", answer
    assert a.answered("m0") == 2  # the held call once, the direct one once: none duplicated
    assert _held(gw) == 0
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="forwarded") == 1
    # Awake: straight through, and other model calls too.
    ready_m0 = pb.ModelReadyResponse.FromString(
        _raw_call(gw.grpc_port, "ModelReady", pb.ModelReadyRequest(name="m0").SerializeToString())
    )
    assert ready_m0.ready
    # A replica's own error comes back with its status and message.
    bad = pb.ModelInferRequest(model_name="m0")
    bad.inputs.add(name="input", datatype="FP32", shape=[1, 3])
    bad.raw_input_contents.append(b"\x00" * 12)
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", bad.SerializeToString())
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", _infer_request("nope").SerializeToString())
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value
    assert "unknown model 'nope'" in (caught.value.details() or ""), caught.value.details()


def test_held_grpc_calls_are_bounded_and_expire_unavailable(gateway) -> None:
    gw = gateway(
        [], grpc=True, activator=True, models=["m0"], holdTimeoutSeconds=3, maxHeldRequests=2
    )
    request = _infer_request("m0").SerializeToString()
    errors: list[Any] = [None, None]

    def call(i: int) -> None:
        try:
            _raw_call(gw.grpc_port, "ModelInfer", request, timeout=60)
        except grpc.RpcError as exc:
            errors[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: _held(gw) == 2, what="2 gRPC calls held")
    # One more than maxHeldRequests: UNAVAILABLE at once, saying why.
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    assert "maxHeldRequests" in (caught.value.details() or ""), caught.value.details()
    # Each UNAVAILABLE of the hold says when to come back, as HTTP's Retry-After does.
    trailing = dict(caught.value.trailing_metadata() or ())
    assert 1 <= int(trailing["retry-after"]) <= 30, trailing
    for thread in threads:
        thread.join(60)
    for exc in errors:
        assert exc is not None and exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        assert "not ready on any replica; held" in (exc.details() or ""), exc.details()
        assert 1 <= int(dict(exc.trailing_metadata() or ())["retry-after"]) <= 30, exc
    assert _held(gw) == 0
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="expired") == 2
    # The call's own deadline shortens the hold: DEADLINE_EXCEEDED at the client, no wait
    # for holdTimeoutSeconds, and nothing left held.
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", request, timeout=0.5)
    assert caught.value.code() in (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
    ), caught.value
    wait_for(lambda: _held(gw) == 0, what="the deadline's call no longer held")
    # An undecodable request is the caller's mistake.
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", b"\xff")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value


def test_grpc_server_metadata_names_the_gateway_not_a_replica(
    runtimes, runtime_config, gateway
) -> None:
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    gw = gateway([a.ref], grpc=True, replicaGrpcPort=a.grpc_port)
    wait_for(lambda: http("GET", f"{gw.url}/v2/health/ready")[0] == 200, what="gateway ready")
    answer = pb.ServerMetadataResponse.FromString(_raw_call(gw.grpc_port, "ServerMetadata", b""))
    _, _, http_metadata = http("GET", f"{gw.url}/v2")
    assert answer.name == "tidal-gateway", answer
    assert (answer.version, list(answer.extensions)) == (
        http_metadata["version"],
        http_metadata["extensions"],
    ), (answer, http_metadata)
    direct = pb.ServerMetadataResponse.FromString(_raw_call(a.grpc_port, "ServerMetadata", b""))
    assert direct.name == "tidal-runtime", direct  # what leaked through before


def test_grpc_metadata_of_a_cold_model_comes_from_a_replica_as_over_http(
    runtimes, runtime_config, gateway
) -> None:
    """ModelReady and ModelMetadata are not held and start no load: for a model no replica has
    hot, the replica that would load it answers (ready: false), as HTTP's GET /v2/models/{m}."""
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0", "m1"))))
    gw = gateway([a.ref], grpc=True, replicaGrpcPort=a.grpc_port)
    wait_for(lambda: gw.hot_on("m0") == ["rt-a"], what="m0 hot on rt-a")
    ready = pb.ModelReadyResponse.FromString(
        _raw_call(gw.grpc_port, "ModelReady", pb.ModelReadyRequest(name="m1").SerializeToString())
    )
    assert not ready.ready, ready
    request = pb.ModelMetadataRequest(name="m1").SerializeToString()
    metadata = pb.ModelMetadataResponse.FromString(
        _raw_call(gw.grpc_port, "ModelMetadata", request)
    )
    direct = pb.ModelMetadataResponse.FromString(_raw_call(a.grpc_port, "ModelMetadata", request))
    assert metadata == direct, (metadata, direct)
    status, _, over_http = http("GET", f"{gw.url}/v2/models/m1")
    assert status == 200 and over_http["name"] == metadata.name == "m1", (status, over_http)
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 0, "no load started"
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="forwarded") == 0, "not held"


def test_a_held_grpc_call_gets_a_failed_load_at_once_not_at_its_deadline(
    runtimes, runtime_config, gateway
) -> None:
    """A load that fails for a reason other than room (an engine that does not match its
    digest) ends the calls held for the model with INTERNAL and the replica's reason, as held
    HTTP requests get the replica's answer, rather than holding them to their deadline."""
    config = runtime_config(preload=("m0",), models=("m0", "m1"))
    config["models"][1]["engines"][0]["sha256"] = "0" * 64
    (a,) = runtimes(("rt-a", config))
    gw = gateway([a.ref], grpc=True, replicaGrpcPort=a.grpc_port, holdTimeoutSeconds=60)
    wait_for(lambda: gw.hot_on("m0") == ["rt-a"], what="m0 hot on rt-a")
    request = _infer_request("m1").SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        _raw_call(gw.grpc_port, "ModelInfer", request, timeout=50)
    error = caught.value
    assert error.code() == grpc.StatusCode.INTERNAL, (error.code(), error.details())
    assert "loading model 'm1' failed" in (error.details() or ""), error.details()
    assert gw.metric("tidal_gateway_loads_total", result="failed") == 1
    assert _held(gw) == 0
