"""The runtime over OIP v2 gRPC, driven by tritonclient.grpc (unmodified) and raw gRPC calls."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tidal.runtime.grpc import oip_v2_pb2
from tidal.runtime.grpc_server import start_grpc

INFER = "/inference.GRPCInferenceService/ModelInfer"


def direct(info: Any, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    return session.run(None, {info.input_name: x})[0]


@pytest.fixture
def serve_grpc(serve: Callable[..., Any]) -> Iterator[Callable[..., tuple[Any, str]]]:
    """A runtime served in-process (conftest's ``serve``) with gRPC on its event loop too."""
    started: list[tuple[Any, Any]] = []

    def start(config: dict[str, Any], **kwargs: Any) -> tuple[Any, str]:
        runtime = serve(config, **kwargs)
        future = asyncio.run_coroutine_threadsafe(
            start_grpc(runtime.server, "127.0.0.1", 0), runtime._loop
        )
        server, port = future.result(10)
        started.append((runtime, server))
        return runtime, f"127.0.0.1:{port}"

    yield start
    for runtime, server in started:
        asyncio.run_coroutine_threadsafe(server.stop(0), runtime._loop).result(10)


def infer(client: tgrpc.InferenceServerClient, model: str, x: np.ndarray, name: str = "input"):
    tensor = tgrpc.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor])


def typed_request(model: str, x: np.ndarray, name: str = "input") -> Any:
    """A ModelInferRequest with typed contents (tritonclient always sends raw contents)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def code_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_health_and_metadata_through_tritonclient(serve_grpc, models, model_entry) -> None:
    entry = model_entry(models["mlp"], "mlp", batching={"preferredBatchSizes": [4]})
    _, url = serve_grpc({"models": [entry]})
    client = tgrpc.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "tidal-runtime"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
    model = client.get_model_metadata("mlp", as_json=True)
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "16"]}]
    assert model["versions"] == ["1"] and model["platform"] == "onnxruntime_onnx"
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": ["16"]}]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": "mlp", "version": "1", "state": "READY"}]
    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    client.load_model("mlp")
    assert client.is_model_ready("mlp")


def test_raw_and_typed_contents_match_onnxruntime(serve_grpc, models, model_entry) -> None:
    config = {"models": [model_entry(models["mlp"], "mlp"), model_entry(models["conv"], "conv")]}
    _, url = serve_grpc(config)
    client = tgrpc.InferenceServerClient(url)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    result = infer(client, "mlp", x)
    np.testing.assert_allclose(result.as_numpy("output"), direct(models["mlp"], x), rtol=1e-5)
    assert result.get_response().model_version == "1"
    img = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(
        infer(client, "conv", img, "image").as_numpy(models["conv"].output_name),
        direct(models["conv"], img),
        rtol=1e-4,
        atol=1e-6,
    )
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = typed_request("mlp", x)
        request.id = "r-1"
        response = stub.ModelInfer(request)
    assert response.id == "r-1" and [o.name for o in response.outputs] == ["output"]
    out = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(response.outputs[0].shape)
    np.testing.assert_allclose(out, direct(models["mlp"], x), rtol=1e-5)


def test_grpc_and_http_requests_share_one_batch(serve_grpc, models, model_entry) -> None:
    entry = model_entry(models["mlp"], "mlp", batching={"maxQueueDelayMs": 500})
    runtime, url = serve_grpc({"models": [entry]})
    x = np.ones((1, 16), np.float32)
    results: dict[str, np.ndarray] = {}

    def over_grpc() -> None:
        results["grpc"] = infer(tgrpc.InferenceServerClient(url), "mlp", x).as_numpy("output")

    def over_http() -> None:
        tensor = thttp.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        client = thttp.InferenceServerClient(runtime.url)
        results["http"] = client.infer("mlp", [tensor]).as_numpy("output")

    threads = [threading.Thread(target=over_grpc), threading.Thread(target=over_http)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    np.testing.assert_array_equal(results["grpc"], results["http"])
    assert runtime.metric("tidal_backend_batches_total", model="mlp") == 1
    assert runtime.metric("tidal_backend_rows_total", model="mlp") == 2
    assert runtime.metric("tidal_requests_total", model="mlp", code="200") == 2


def test_bad_requests_are_invalid_argument_with_a_message(serve_grpc, models, model_entry) -> None:
    runtime, url = serve_grpc({"models": [model_entry(models["mlp"], "mlp")]})
    client = tgrpc.InferenceServerClient(url)

    def status(inputs: list[tgrpc.InferInput], **kwargs: Any) -> tuple[Any, str]:
        try:
            client.infer("mlp", inputs, **kwargs)
        except InferenceServerException as error:
            return error.status(), error.message()
        return "OK", ""

    def tensor(name: str, shape: list[int], datatype: str, dtype: Any) -> tgrpc.InferInput:
        value = tgrpc.InferInput(name, shape, datatype)
        value.set_data_from_numpy(np.ones(shape, dtype))
        return value

    cases = {
        "expected shape": [tensor("input", [2, 15], "FP32", np.float32)],
        "expected datatype FP32": [tensor("input", [2, 16], "FP64", np.float64)],
        "unknown: ['x']": [tensor("x", [2, 16], "FP32", np.float32)],
        "outside 1..8": [tensor("input", [9, 16], "FP32", np.float32)],
    }
    for needle, inputs in cases.items():
        code, message = status(inputs)
        assert code == "StatusCode.INVALID_ARGUMENT" and needle in message, (needle, message)
    good = [tensor("input", [1, 16], "FP32", np.float32)]
    code, message = status(good, outputs=[tgrpc.InferRequestedOutput("nope")])
    assert code == "StatusCode.INVALID_ARGUMENT" and "unknown output 'nope'" in message
    code, message = status(good, model_version="7")
    assert code == "StatusCode.NOT_FOUND" and "version" in message
    code, message = status(good, model_version="one")
    assert code == "StatusCode.INVALID_ARGUMENT" and "not a number" in message
    with pytest.raises(InferenceServerException) as raised:
        client.infer("no-such-model", good)
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert "no-such-model" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("no-such-model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"

    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(b"\0" * 63)
        code, message = code_of(lambda: stub.ModelInfer(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 64 bytes" in message
        typed = typed_request("mlp", np.ones((1, 16), np.float32))
        typed.inputs[0].contents.fp32_contents.append(1.0)
        code, message = code_of(lambda: stub.ModelInfer(typed))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "17" in message
        code, message = code_of(lambda: channel.unary_unary(INFER)(b"\xff\xff\xff"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in message
    assert runtime.metric("tidal_requests_total", model="mlp", code="400") >= 7
    assert runtime.metric("tidal_requests_total", model="mlp", code="500") == 0


def test_not_ready_is_unavailable_with_retry_after(serve_grpc, models, model_entry) -> None:
    config = {"models": [model_entry(models["mlp"], "mlp")], "faults": {"extraWarmupSeconds": 3}}
    _, url = serve_grpc(config, ready=False)
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert not stub.ServerReady(service_pb2.ServerReadyRequest()).ready
        call = stub.ModelInfer.with_call
        try:
            call(typed_request("mlp", np.ones((1, 16), np.float32)))
            raise AssertionError("answered while warming up")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert "warming up" in error.details()
            assert ("retry-after", "1") in tuple(error.trailing_metadata())


def test_a_model_that_fails_to_load_leaves_the_others_served(
    serve_grpc, models, model_entry, tmp_path
) -> None:
    garbage = tmp_path / "corrupt.onnx"
    garbage.write_bytes(b"this is not an onnx model")
    broken = {"name": "broken", "engines": [{"uri": garbage.as_uri()}]}
    _, url = serve_grpc({"models": [model_entry(models["mlp"], "mlp"), broken]}, ready=False)
    x = np.ones((1, 16), np.float32)
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        ready = service_pb2.ModelReadyRequest(name="mlp")
        deadline = time.monotonic() + 60
        while not stub.ModelReady(ready).ready:
            assert time.monotonic() < deadline, "mlp did not load beside a broken model"
            time.sleep(0.05)
        answer = stub.ModelInfer(typed_request("mlp", x))
        assert answer.model_name == "mlp" and answer.outputs[0].name == "output"
        # The broken one's load may still be under way when mlp is ready (a loaded machine):
        # UNAVAILABLE "warming up" until its failure is recorded, then the failure.
        while True:
            code, message = code_of(lambda: stub.ModelInfer(typed_request("broken", x)))
            assert code == grpc.StatusCode.UNAVAILABLE, (code, message)
            if "failed to load" in message or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert "'broken' failed to load" in message and "cannot load" in message, message
        assert not stub.ServerReady(service_pb2.ServerReadyRequest()).ready
        assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="broken")).ready


def test_statistics_count_requests_of_both_transports(serve_grpc, models, model_entry) -> None:
    runtime, url = serve_grpc({"models": [model_entry(models["mlp"], "mlp")]})
    client = tgrpc.InferenceServerClient(url)
    for _ in range(2):
        infer(client, "mlp", np.ones((3, 16), np.float32))
    with pytest.raises(InferenceServerException):
        infer(client, "mlp", np.ones((3, 15), np.float32))
    tensor = thttp.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    thttp.InferenceServerClient(runtime.url).infer("mlp", [tensor])
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"]
    assert [s["name"] for s in stats] == ["mlp"] and stats[0]["version"] == "1"
    assert stats[0]["inference_count"] == "7"  # rows: 3 + 3 + 1
    assert stats[0]["inference_stats"]["success"]["count"] == "3"
    assert stats[0]["inference_stats"]["fail"]["count"] == "1"
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert [s["name"] for s in everything] == ["mlp"]
    with pytest.raises(InferenceServerException) as raised:
        client.get_inference_statistics("no-such-model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"


def test_timeout_parameter_expires_a_queued_request(serve_grpc, models, model_entry) -> None:
    config = {"models": [model_entry(models["mlp"], "mlp")], "faults": {"serviceTimeMs": 300}}
    _, url = serve_grpc(config)
    x = np.ones((1, 16), np.float32)
    first = threading.Thread(target=lambda: infer(tgrpc.InferenceServerClient(url), "mlp", x))
    first.start()
    time.sleep(0.05)  # the first request holds the model's only execution slot for 300 ms
    tensor = tgrpc.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as raised:
        tgrpc.InferenceServerClient(url).infer("mlp", [tensor], timeout=50_000)  # µs
    first.join(10)
    assert raised.value.status() == "StatusCode.UNAVAILABLE"
    request = typed_request("mlp", x)
    request.parameters["timeout"].string_param = "soon"
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        code, message = code_of(lambda: stub.ModelInfer(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "timeout" in message


def _malformed(rng: random.Random, valid: bytes) -> bytes:
    """A request that is wrong in one of the ways a careless or hostile client gets it wrong."""
    choice = rng.randrange(12)
    request = service_pb2.ModelInferRequest()
    request.ParseFromString(valid)
    tensor = request.inputs[0]
    if choice == 0:  # flipped bytes
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice == 1:  # truncated
        return valid[: rng.randrange(len(valid))]
    if choice == 2:  # random garbage
        return rng.randbytes(rng.randint(0, 200))
    if choice == 3:
        tensor.shape[:] = [rng.choice([0, 1, 2**40, 2**62]) for _ in range(rng.randint(0, 70))]
    elif choice == 4:
        tensor.shape[1] = -rng.randint(1, 2**62)
    elif choice == 5:
        tensor.datatype = rng.choice(["", "FP8", "BYTES", "BF16", "STRING", "fp32", "INT4"])
    elif choice == 6:
        request.raw_input_contents.append(rng.randbytes(rng.randint(0, 80)))
    elif choice == 7:
        del request.raw_input_contents[:]
        tensor.contents.int64_contents.extend([rng.randint(-(2**63), 2**63 - 1)] * 16)
    elif choice == 8:
        tensor.contents.fp32_contents.append(1.0)  # both raw and typed contents
    elif choice == 9:
        request.inputs.add().CopyFrom(tensor)  # the same input twice
        request.raw_input_contents.append(request.raw_input_contents[0])
    elif choice == 10:
        request.outputs.add(name=rng.choice(["", "output", "x" * 300]))
        request.outputs.add(name="output")
    else:
        request.model_version = rng.choice(["0", "2", "latest", "-1", "\u00e9"])
    return request.SerializeToString()


def test_fuzzed_model_infer_requests_never_fail_internally(serve_grpc, models, model_entry) -> None:
    runtime, url = serve_grpc({"models": [model_entry(models["mlp"], "mlp")]})
    valid = service_pb2.ModelInferRequest(model_name="mlp")
    valid.inputs.add(name="input", datatype="FP32", shape=[2, 16])
    valid.raw_input_contents.append(np.ones((2, 16), "<f4").tobytes())
    blob = valid.SerializeToString()
    rng = random.Random(13)
    seen: dict[str, int] = {}
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(INFER)
        for _ in range(400):  # bounded: about 2 s on loopback
            code, message = code_of(lambda: call(_malformed(rng, blob), timeout=10))
            seen[code.name] = seen.get(code.name, 0) + 1
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), message
        assert code_of(lambda: call(blob, timeout=10))[0] == grpc.StatusCode.OK
    assert seen.get("INVALID_ARGUMENT", 0) > 200, seen
    assert tgrpc.InferenceServerClient(url).is_server_live()
    assert runtime.metric("tidal_requests_total", model="mlp", code="500") == 0


def _fields(message: Any) -> dict[str, tuple[int, int, bool]]:
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.fields}


# Fields of the protocol's own proto (kserve/open-inference-protocol,
# open_inference_grpc.proto) that Triton's copy lacks: a Triton client skips them (proto3).
UPSTREAM_ONLY = {"ModelMetadataResponse": {"properties": (6, 11, True)}}  # map<string,string>


def test_messages_are_wire_compatible_with_tritonclients() -> None:
    """Every field tidal's .proto declares has the protocol's number and type."""
    theirs = {**service_pb2.DESCRIPTOR.message_types_by_name}
    theirs.update(model_config_pb2.DESCRIPTOR.message_types_by_name)

    def compare(mine: Any, other: Any) -> None:
        want = {**_fields(other), **UPSTREAM_ONLY.get(mine.name, {})}
        for name, shape in _fields(mine).items():
            assert want.get(name) == shape, f"{mine.full_name}.{name}"
        nested = {n.name: n for n in other.nested_types}
        for inner in mine.nested_types:
            if inner.name not in nested and inner.GetOptions().map_entry:
                continue  # the entry type of an UPSTREAM_ONLY map, checked above
            compare(inner, nested[inner.name])

    for name, mine in oip_v2_pb2.DESCRIPTOR.message_types_by_name.items():
        compare(mine, theirs[name])
    their_types = model_config_pb2.DESCRIPTOR.enum_types_by_name["DataType"].values_by_name
    for value in oip_v2_pb2.DESCRIPTOR.enum_types_by_name["DataType"].values:
        assert their_types[value.name].number == value.number


def test_the_protos_service_is_served_where_a_generated_stub_calls_it(
    serve_grpc, models, model_entry
) -> None:
    """runtime/grpc/oip_v2.proto declares GRPCInferenceService like the protocol's own proto,
    with the same calls (same request and response types); a stub generated from it calls
    /tidal.oip.v2.GRPCInferenceService/<Method>, which the runtime answers as it answers the
    protocol's name. The stub is built from the descriptors, as protoc's plugin builds it."""
    service = oip_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        other = theirs.methods_by_name[method.name]
        assert (method.input_type.name, method.output_type.name) == (
            other.input_type.name,
            other.output_type.name,
        ), method.name
    _, address = serve_grpc({"models": [model_entry(models["mlp"], "mlp")]})
    channel = grpc.insecure_channel(address)

    def stub(name: str) -> Callable[[Any], Any]:
        method = service.methods_by_name[name]
        response_class = getattr(oip_v2_pb2, method.output_type.name)
        return channel.unary_unary(
            f"/{service.full_name}/{name}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_class.FromString,
        )

    assert stub("ServerReady")(oip_v2_pb2.ServerReadyRequest(), timeout=10).ready
    meta = stub("ModelMetadata")(oip_v2_pb2.ModelMetadataRequest(name="mlp"), timeout=10)
    assert meta.name == "mlp" and meta.properties["backend"] == "onnxruntime"
    request = oip_v2_pb2.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([0.5] * 16)
    answer = stub("ModelInfer")(request, timeout=30)
    assert [o.name for o in answer.outputs] == ["output"] and answer.raw_output_contents
    channel.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cli_serves_grpc_beside_http_and_refuses_a_taken_grpc_port(models) -> None:
    port, grpc_port = _free_port(), _free_port()
    config = {"models": [{"name": "mlp", "engines": [{"uri": models["mlp"].uri}]}]}
    env = {
        **os.environ,
        "TIDAL_RUNTIME_CONFIG_JSON": json.dumps({**config, "shutdownDrainSeconds": 0}),
        "TIDAL_HOST": "127.0.0.1",
        "TIDAL_PORT": str(port),
        "TIDAL_GRPC_PORT": str(grpc_port),
    }
    process = subprocess.Popen([sys.executable, "-m", "tidal.runtime"], env=env)
    try:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert infer(client, "mlp", np.ones((2, 16), np.float32)).as_numpy("output").shape == (
            2,
            4,
        )
        taken = subprocess.run(
            [sys.executable, "-m", "tidal.runtime", "--port", str(_free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 2 and "gRPC" in taken.stderr
        invalid = subprocess.run(
            [sys.executable, "-m", "tidal.runtime"],
            env={**env, "TIDAL_GRPC_PORT": "eighty"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert invalid.returncode == 2 and "TIDAL_GRPC_PORT" in invalid.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def test_a_grpc_answer_carries_the_version_the_configuration_names(
    serve_grpc, models, model_entry
) -> None:
    _, url = serve_grpc({"models": [model_entry(models["mlp"], "mlp", version="3")]})
    client = tgrpc.InferenceServerClient(url)
    x = np.ones((1, 16), np.float32)
    result = infer(client, "mlp", x)
    assert result.get_response().model_version == "3", result.get_response()
    assert client.get_model_metadata("mlp", as_json=True)["versions"] == ["3"]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [m["version"] for m in index] == ["3"], index
