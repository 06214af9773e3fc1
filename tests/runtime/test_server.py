"""The runtime over HTTP, driven by tritonclient[http] (an independent OIP client) and urllib."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tidal.runtime.backends import DeviceMemory, TensorSpec
from tidal.runtime.core.engines import EngineTarget
from tidal.runtime.modelgen import write_mlp
from tidal.runtime.protocol import DATATYPES


def direct(info: Any, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    return session.run(None, {info.input_name: x})[0]


def infer(
    client: triton.InferenceServerClient,
    model: str,
    x: np.ndarray,
    name: str = "input",
    binary: bool = True,
) -> np.ndarray:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    out = client.infer(model, [tensor])
    return out.as_numpy(out.get_response()["outputs"][0]["name"])


def post(
    url: str,
    body: bytes | None,
    headers: dict[str, str] | None = None,
    *,
    timeout: float = 10.0,
    method: str = "POST",
) -> tuple[int, dict[str, Any], Any]:
    request = urllib.request.Request(
        f"http://{url}", data=body, headers=headers or {}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"{}")


def test_tritonclient_round_trip_matches_onnxruntime(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp"), model_entry(models["conv"], "conv")]})
    client = triton.InferenceServerClient(rt.url)
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert client.get_model_config("mlp")["max_batch_size"] == 8
    assert client.is_model_ready("mlp")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(infer(client, "mlp", x), direct(models["mlp"], x), rtol=1e-5)
    np.testing.assert_allclose(
        infer(client, "mlp", x, binary=False), direct(models["mlp"], x), rtol=1e-5
    )
    img = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(
        infer(client, "conv", img, "image"), direct(models["conv"], img), rtol=1e-4, atol=1e-6
    )


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(
    serve, models, model_entry
) -> None:
    entry = model_entry(models["mlp"], "mlp", batching={"maxQueueDelayMs": 50})
    rt = serve({"models": [entry]})
    client = triton.InferenceServerClient(rt.url, concurrency=16)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(16)]
    pending = []
    for x in xs:
        tensor = triton.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        pending.append(client.async_infer("mlp", [tensor]))
    for x, handle in zip(xs, pending, strict=True):
        np.testing.assert_allclose(
            handle.get_result().as_numpy("output"), direct(models["mlp"], x), rtol=1e-5
        )
    batches = rt.metric("tidal_batch_size_count", model="mlp")
    rows = rt.metric("tidal_batch_size_sum", model="mlp")
    assert rows == 16
    assert batches < 16  # merged: fewer batches than requests
    assert rt.metric("tidal_queue_depth", model="mlp") == 0
    assert rt.metric("tidal_inflight_requests") == 0


class GateEngine:
    """An engine that runs only while the test holds its gate open (doubles its input)."""

    platform = "test_gate"
    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)
    size_bytes = 100

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[int] = []

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.wait(60)
        self.batches.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


class GateBackend:
    name = "gate"

    def __init__(self) -> None:
        self.engine = GateEngine()

    def target(self, model: Any) -> EngineTarget:
        return EngineTarget("onnx")

    def estimate_bytes(self, path: Path, descriptor: Any) -> int:
        return 100

    def load(self, path: Path, descriptor: Any, model: Any, available_bytes: int) -> GateEngine:
        return self.engine

    def device_memory(self) -> DeviceMemory | None:
        return None


def gate_request(value: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [value, value]}]}
    ).encode()


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


@contextlib.contextmanager
def one_request_at_the_gate(rt: Any, backend: GateBackend) -> Iterator[None]:
    """One request executing (held at the closed gate) while the body runs; it then gets 200."""
    backend.engine.gate.clear()
    first: list[int] = []
    blocker = threading.Thread(
        target=lambda: first.append(
            post(f"{rt.url}/v2/models/gate/infer", gate_request(1), timeout=120)[0]
        )
    )
    blocker.start()
    wait_for(lambda: rt.metric("tidal_inflight_requests") == 1)
    try:
        yield
    finally:
        backend.engine.gate.set()
        blocker.join(10)
    assert first == [200]


def test_queue_depth_is_exact_and_a_full_queue_answers_503(serve, models, model_entry) -> None:
    backend = GateBackend()
    entry = model_entry(models["mlp"], "gate", batching={"enabled": False, "maxQueueSize": 5})
    rt = serve({"models": [entry]}, backend)
    backend.engine.gate.clear()
    results: list[tuple[int, Any]] = []

    def send(i: int) -> None:
        # Held at the gate while the test polls /metrics: on a loaded machine that can take
        # longer than post()'s usual 10 s socket timeout, which made this test flaky.
        try:
            status, _, body = post(f"{rt.url}/v2/models/gate/infer", gate_request(i), timeout=120)
        except OSError as exc:
            status, body = -1, repr(exc)
        results.append((status, body))

    # The first request must be executing (out of the queue) before the other five arrive:
    # sent together, all six can land in one event-loop turn, before the batch loop takes the
    # first, and the sixth then finds five queued and gets a 503 (seen in CI).
    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    threads[0].start()
    wait_for(lambda: rt.call(lambda: rt.server.batchers["gate"]._executing) == 1)
    for thread in threads[1:]:
        thread.start()
    wait_for(lambda: rt.metric("tidal_inflight_requests") == 6)
    wait_for(lambda: rt.metric("tidal_queue_depth", model="gate") == 5)  # one is executing
    assert rt.call(lambda: len(rt.server.batchers["gate"].queue)) == 5
    status, headers, body = post(f"{rt.url}/v2/models/gate/infer", gate_request(9))
    assert status == 503 and "queue is full" in body["error"]
    assert int(headers["Retry-After"]) >= 1
    backend.engine.gate.set()
    for thread in threads:
        thread.join(10)
    assert sorted(status for status, _ in results) == [200] * 6, results
    assert rt.metric("tidal_queue_depth", model="gate") == 0
    assert rt.metric("tidal_inflight_requests") == 0
    assert rt.metric("tidal_requests_total", model="gate", code="503") == 1


def test_requests_that_wait_past_their_timeout_get_503(serve, models, model_entry) -> None:
    backend = GateBackend()
    entry = model_entry(models["mlp"], "gate", batching={"enabled": False, "timeoutMs": 100})
    rt = serve({"models": [entry]}, backend)
    with one_request_at_the_gate(rt, backend):
        status, _, body = post(f"{rt.url}/v2/models/gate/infer", gate_request(2))
        assert status == 503 and "timed out" in body["error"]


def test_bad_requests_are_refused_cleanly_and_the_server_lives_on(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")], "maxRequestBytes": 4096})
    url = f"{rt.url}/v2/models/mlp/infer"

    def body(name: str = "input", datatype: str = "FP32", shape: list[int] | None = None) -> bytes:
        shape = shape or [1, 16]
        return json.dumps(
            {
                "inputs": [
                    {
                        "name": name,
                        "datatype": datatype,
                        "shape": shape,
                        "data": [0] * int(np.prod(shape)),
                    }
                ]
            }
        ).encode()

    cases = [
        (url, body(name="wrong"), 400, "missing: ['input']"),
        (url, body(datatype="FP64"), 400, "expected datatype FP32, got FP64"),
        (url, body(shape=[1, 15]), 400, "expected shape [-1, 16]"),
        (url, body(shape=[9, 16]), 400, "outside 1..8"),
        (url, b"{not json", 400, "not valid JSON"),
        (url, b"\xff\xfe", 400, "not valid JSON"),
        (url, b"x" * 5000, 413, "maxRequestBytes"),
        (f"{rt.url}/v2/models/nope/infer", body(), 404, "unknown model"),
    ]
    for target, payload, status, message in cases:
        got, _, answer = post(target, payload)
        assert (got, message in answer["error"]) == (status, True), (got, answer)
    client = triton.InferenceServerClient(rt.url)
    with pytest.raises(InferenceServerException, match="unknown output"):
        tensor = triton.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
        client.infer("mlp", [tensor], outputs=[triton.InferRequestedOutput("nope")])
    assert client.is_server_live()
    assert rt.metric("tidal_requests_total", model="mlp", code="400") >= 5


def test_budget_evicts_least_recently_used_and_reloads_on_demand(
    serve, tmp_path, model_entry
) -> None:
    infos = [
        write_mlp(tmp_path / f"m{i}.onnx", inputs=16, hidden=128, outputs=4, seed=i)
        for i in range(3)
    ]
    size = infos[0].size_bytes
    entries = [model_entry(info, f"m{i}", preload=False) for i, info in enumerate(infos)]
    rt = serve({"models": entries, "memory": {"engineCacheBudgetBytes": int(size * 2.5)}})
    client = triton.InferenceServerClient(rt.url)
    x = np.ones((1, 16), np.float32)
    for name in ("m0", "m1", "m2"):  # m2 does not fit next to m0 and m1: m0 goes
        infer(client, name, x)
    states = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert states == {"m0": "UNAVAILABLE", "m1": "READY", "m2": "READY"}
    assert rt.metric("tidal_engine_cache_evictions_total", model="m0") == 1
    assert rt.metric("tidal_engine_cache_bytes", tier="gpu") <= size * 2.5
    infer(client, "m1", x)  # m1 is now the most recent: m2 goes when m0 returns
    np.testing.assert_allclose(infer(client, "m0", x), direct(infos[0], x), rtol=1e-5)
    states = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert states == {"m0": "READY", "m1": "READY", "m2": "UNAVAILABLE"}
    assert rt.metric("tidal_engine_cache_misses_total", model="m0") == 2
    assert rt.metric("tidal_engine_cache_hits_total", model="m1") == 1
    assert (
        rt.metric("tidal_request_duration_seconds_count", model="m0", cache="cold", code="200") == 2
    )
    assert rt.metric("tidal_cold_start_seconds_count", model="m0") == 2
    assert rt.metric("tidal_engine_load_seconds_count", model="m0", phase="warmup") == 2


def test_a_request_that_waits_for_a_load_observes_its_transfer_wait(
    serve, models, model_entry
) -> None:
    # faults.extraTransferSeconds stands in for a slow host->device path: the cold request
    # waits it out and says so; the preloaded model's load had nobody waiting (no sample).
    rt = serve(
        {
            "models": [
                model_entry(models["mlp"], "hot"),
                model_entry(models["mlp_b"], "cold", preload=False),
            ],
            "faults": {"extraTransferSeconds": 0.3},
        }
    )
    client = triton.InferenceServerClient(rt.url)
    x = np.ones((1, 16), np.float32)
    infer(client, "cold", x)
    infer(client, "hot", x)
    text = rt.metrics_text()
    assert rt.metric("tidal_transfer_wait_seconds_count", model="cold") == 1, text
    assert rt.metric("tidal_transfer_wait_seconds_sum", model="cold") >= 0.3, text
    assert rt.metric("tidal_transfer_wait_seconds_count", model="hot") == 0, text
    assert rt.metric("tidal_engine_load_seconds_count", model="cold", phase="h2d") == 1, text
    infer(client, "cold", x)  # now resident: a hot request waits on no transfer
    assert rt.metric("tidal_transfer_wait_seconds_count", model="cold") == 1


def test_a_backend_without_device_transfer_observes_no_transfer_wait(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "cold", preload=False)]})
    infer(triton.InferenceServerClient(rt.url), "cold", np.ones((1, 16), np.float32))
    text = rt.metrics_text()
    assert rt.metric("tidal_cold_start_seconds_count", model="cold") == 1, text
    assert "tidal_transfer_wait_seconds_count{" not in text, text


def test_corrupt_engine_gives_a_clear_error_and_keeps_the_cache_consistent(
    serve, models, model_entry, tmp_path
) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not an onnx model")
    wrong_sha = model_entry(models["mlp_b"], "tampered", preload=False)
    wrong_sha["engines"][0]["sha256"] = "0" * 64
    entries = [
        model_entry(models["mlp"], "good"),
        wrong_sha,
        {"name": "garbage", "engines": [{"uri": garbage.as_uri()}], "preload": False},
    ]
    rt = serve({"models": entries})
    before = rt.metric("tidal_engine_cache_bytes", tier="gpu")
    x = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    ).encode()
    status, _, body = post(f"{rt.url}/v2/models/tampered/infer", x)
    assert status == 500 and "sha256" in body["error"] and "expected 0000" in body["error"]
    status, _, body = post(f"{rt.url}/v2/models/garbage/infer", x)
    assert status == 500 and "cannot load" in body["error"]
    assert rt.metric("tidal_engine_cache_bytes", tier="gpu") == before
    client = triton.InferenceServerClient(rt.url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["tampered"]["state"] == "UNAVAILABLE" and "sha256" in index["tampered"]["reason"]
    assert post(f"{rt.url}/v2/models/good/infer", x)[0] == 200


def test_repository_extension_loads_and_unloads(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp", preload=False)]})
    client = triton.InferenceServerClient(rt.url)
    assert client.get_model_repository_index() == [
        {"name": "mlp", "version": "1", "state": "UNAVAILABLE"}
    ]
    client.load_model("mlp")
    assert client.is_model_ready("mlp")
    assert rt.metric("tidal_model_ready", model="mlp") == 1
    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.load_model("other")


def test_http_engines_are_downloaded_and_verified(serve, models, model_entry, tmp_path) -> None:
    import http.server
    import socketserver

    directory = str(models["mlp"].path.parent)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Quiet) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_address[1]
        entry = model_entry(models["mlp"], "remote")
        entry["engines"][0]["uri"] = f"http://127.0.0.1:{port}/mlp.onnx"
        rt = serve({"models": [entry], "cacheDir": str(tmp_path / "cache")})
        httpd.shutdown()
    x = np.ones((2, 16), np.float32)
    client = triton.InferenceServerClient(rt.url)
    np.testing.assert_allclose(infer(client, "remote", x), direct(models["mlp"], x), rtol=1e-5)
    assert rt.metric("tidal_engine_cache_bytes", tier="host") == models["mlp"].size_bytes


def test_fault_injection_adds_latency_and_errors(serve, models, model_entry) -> None:
    rt = serve(
        {
            "models": [model_entry(models["mlp"], "mlp")],
            "faults": {"addedLatencyMs": 150, "errorRate": 0.5, "seed": 7},
        }
    )
    client = triton.InferenceServerClient(rt.url)
    codes = []
    for _ in range(10):
        started = time.monotonic()
        try:
            infer(client, "mlp", np.ones((1, 16), np.float32))
            codes.append(200)
            assert time.monotonic() - started >= 0.15
        except InferenceServerException as error:
            assert "injected fault" in str(error)
            codes.append(500)
    assert 0 < codes.count(500) < 10
    assert rt.metric("tidal_requests_total", model="mlp", code="500") == codes.count(500)


def test_ready_only_after_every_preloaded_model_is_warm(serve, models, model_entry) -> None:
    config = {
        "models": [
            model_entry(models["mlp"], "mlp"),
            model_entry(models["conv"], "conv", preload=False),
        ],
        "faults": {"extraWarmupSeconds": 0.5},
    }
    rt = serve(config, ready=False)
    client = triton.InferenceServerClient(rt.url)
    assert client.is_server_live()
    assert not client.is_server_ready()
    with pytest.raises(InferenceServerException, match="warming up"):
        infer(client, "mlp", np.ones((1, 16), np.float32))
    rt.wait_ready()
    assert client.is_server_ready()
    assert not client.is_model_ready("conv")  # not preloaded: loads on its first request
    assert rt.metric("tidal_startup_seconds") >= 0.5


def corrupt_engine(tmp_path: Path) -> dict[str, Any]:
    """A preloaded model whose engine file is garbage (its sha256 matches: the load fails)."""
    import hashlib

    garbage = tmp_path / "corrupt.onnx"
    garbage.write_bytes(b"this is not an onnx model")
    sha = hashlib.sha256(garbage.read_bytes()).hexdigest()
    return {"name": "broken", "engines": [{"uri": garbage.as_uri(), "sha256": sha}]}


def get(url: str) -> tuple[int, dict[str, Any], Any]:
    return post(url, None, method="GET")


def test_a_preloaded_model_that_fails_to_load_leaves_the_others_served(
    serve, models, model_entry, tmp_path
) -> None:
    entries = [
        model_entry(models["mlp"], "mlp"),
        corrupt_engine(tmp_path),
        model_entry(models["mlp_b"], "words"),
    ]
    rt = serve({"models": entries}, ready=False)
    x = np.ones((2, 16), np.float32)
    # The broken model is retried in the background forever: the others are served meanwhile.
    wait_for(lambda: get(f"{rt.url}/v2/models/words/ready")[0] == 200, timeout=60)
    # ... and the broken one's first load has failed (not still under way, as on a loaded machine)
    wait_for(
        lambda: "failed to load" in str(get(f"{rt.url}/v2/models/broken/ready")[2]), timeout=60
    )
    client = triton.InferenceServerClient(rt.url)
    np.testing.assert_allclose(infer(client, "mlp", x), direct(models["mlp"], x), rtol=1e-5)
    np.testing.assert_allclose(infer(client, "words", x), direct(models["mlp_b"], x), rtol=1e-5)
    assert client.is_model_ready("mlp") and not client.is_model_ready("broken")

    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    ).encode()
    status, headers, answer = post(f"{rt.url}/v2/models/broken/infer", body)
    assert status == 503 and int(headers["Retry-After"]) >= 1, (status, headers, answer)
    assert "'broken' failed to load" in answer["error"], answer
    assert "warming up" not in answer["error"] and "cannot load" in answer["error"], answer
    status, _, answer = get(f"{rt.url}/v2/models/broken/ready")
    assert status == 400 and answer["ready"] is False, (status, answer)
    assert "'broken' failed to load" in answer["error"] and "cannot load" in answer["error"]
    # The pod stays not Ready, saying which model failed and why: the operator's Degraded
    # (EngineLoadFailed) quotes this error.
    status, _, answer = get(f"{rt.url}/v2/health/ready")
    assert status == 503 and answer["ready"] is False, (status, answer)
    assert "model 'broken' failed to load" in answer["error"], answer
    assert "cannot load" in answer["error"] and "2 of 3" in answer["error"], answer
    assert not client.is_server_ready()
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["broken"]["state"] == "UNAVAILABLE"
    assert "cannot load" in index["broken"]["reason"], index
    assert rt.metric("tidal_requests_total", model="mlp", code="200") >= 1


def test_every_contract_metric_is_exposed(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    infer(triton.InferenceServerClient(rt.url), "mlp", np.ones((1, 16), np.float32))
    text = rt.metrics_text()
    for name in [
        "tidal_queue_depth",
        "tidal_inflight_requests",
        "tidal_request_duration_seconds_bucket",
        "tidal_engine_load_seconds_bucket",
        "tidal_engine_cache_hits_total",
        "tidal_engine_cache_misses_total",
        "tidal_engine_cache_evictions_total",
        "tidal_engine_cache_bytes",
        "tidal_gpu_memory_bytes",
        "tidal_batch_size_bucket",
        "tidal_requests_total",
        "tidal_cold_start_seconds",
        "tidal_transfer_wait_seconds",
        "tidal_model_ready",
    ]:
        assert name in text, name
    assert 'le="0.001"' in text and 'le="10.0"' in text


def raw_http(port: int, data: bytes, *, close_after: float | None = None) -> bytes:
    """Send raw bytes; return what the server answers (or b"" when we hang up first)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if close_after is not None:
            time.sleep(close_after)
            return b""
        answer = b""
        while not complete(answer):  # aiohttp may keep reading (lingering) before it closes
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
        return answer


def complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def status_and_json(answer: bytes) -> tuple[int, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_statistics_extension_answers_tritonclient(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp"), model_entry(models["conv"], "c")]})
    client = triton.InferenceServerClient(rt.url)
    for rows in (1, 2, 2):
        infer(client, "mlp", np.ones((rows, 16), np.float32))
    post(f"{rt.url}/v2/models/mlp/infer", b"{}")  # a failure
    assert "statistics" in client.get_server_metadata()["extensions"]
    (stats,) = client.get_inference_statistics("mlp")["model_stats"]
    assert (stats["name"], stats["version"]) == ("mlp", "1")
    assert (stats["inference_count"], stats["execution_count"]) == (5, 3)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3 and inference["success"]["ns"] > 0
    assert inference["fail"]["count"] == 1
    assert inference["queue"]["count"] == 3 and inference["compute_infer"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1),
        (2, 2),
    ]
    assert stats["last_inference"] > 1.7e12  # ms since the epoch
    assert client.get_inference_statistics("mlp", "1")["model_stats"][0]["inference_count"] == 5
    every = client.get_inference_statistics()["model_stats"]
    assert sorted(s["name"] for s in every) == ["c", "mlp"]
    with pytest.raises(InferenceServerException, match="no version '2'"):
        client.get_inference_statistics("mlp", "2")


def test_model_versions_in_paths_are_checked(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    client = triton.InferenceServerClient(rt.url)
    x = triton.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    result = client.infer("mlp", [x], model_version="1", request_id="abc")
    assert result.get_response()["model_version"] == "1"
    assert result.get_response()["id"] == "abc"
    assert client.is_model_ready("mlp", "1")
    assert client.get_model_metadata("mlp", "1")["versions"] == ["1"]
    for version, status, message in [("2", 404, "no version '2'"), ("x1", 400, "not a number")]:
        for path in ("", "/ready", "/config", "/infer"):
            method = "POST" if path == "/infer" else "GET"
            got, _, body = post(
                f"{rt.url}/v2/models/mlp/versions/{version}{path}", b"{}", method=method
            )
            assert (got, message in body["error"]) == (status, True), (path, got, body)
    got, _, body = post(f"{rt.url}/v2/models/nope/versions/1/infer", b"{}")
    assert got == 404 and "unknown model" in body["error"]


def test_every_answer_carries_the_version_the_configuration_names(
    serve, models, model_entry
) -> None:
    # the operator names a ModelBuild's version; the answers say which version served them
    rt = serve({"models": [model_entry(models["mlp"], "mlp", version="3")]})
    client = triton.InferenceServerClient(rt.url)
    x = triton.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    for version in ("", "3"):
        response = client.infer("mlp", [x], model_version=version).get_response()
        assert response["model_version"] == "3", (version, response)
    assert client.get_model_metadata("mlp")["versions"] == ["3"]
    stats = client.get_inference_statistics()["model_stats"]
    assert [s["version"] for s in stats] == ["3"], stats
    index = client.get_model_repository_index()
    assert [(m["name"], m["version"]) for m in index] == [("mlp", "3")], index
    got, _, body = post(f"{rt.url}/v2/models/mlp/versions/1/infer", b"{}")
    assert got == 404 and "no version '1'; versions: ['3']" in body["error"], (got, body)


def test_a_request_timeout_parameter_gives_503_when_it_waits_too_long(
    serve, models, model_entry
) -> None:
    backend = GateBackend()
    rt = serve(
        {"models": [model_entry(models["mlp"], "gate", batching={"enabled": False})]}, backend
    )
    client = triton.InferenceServerClient(rt.url)
    tensor = triton.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    with one_request_at_the_gate(rt, backend):
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="timed out after 100 ms") as raised:
            client.infer("gate", [tensor], timeout=100_000)  # microseconds, as in Triton
        assert raised.value.status() == "503"
        assert time.monotonic() - started < 5
    bad = {**json.loads(gate_request(1)), "parameters": {"timeout": "soon"}}
    status, _, body = post(f"{rt.url}/v2/models/gate/infer", json.dumps(bad).encode())
    assert status == 400 and "'timeout' must be a non-negative integer" in body["error"]


def test_a_client_gone_mid_upload_counts_499_and_logs_no_error(
    serve, models, model_entry, caplog
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    with caplog.at_level("DEBUG", logger="tidal.runtime"):
        raw_http(rt.port, head + b'{"inputs": [', close_after=0.1)
        wait_for(lambda: rt.metric("tidal_requests_total", model="mlp", code="499") == 1)
    assert rt.metric("tidal_requests_total", model="mlp", code="500") == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert any("mid-upload" in r.getMessage() for r in caplog.records)
    stats = triton.InferenceServerClient(rt.url).get_inference_statistics("mlp")
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 0


def test_a_stalled_body_times_out_and_an_oversized_one_is_refused_before_reading(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")], "maxRequestBytes": 4096})

    def set_timeout() -> None:
        rt.server.body_read_timeout_s = 0.3

    rt.call(set_timeout)
    for path in ("/v2/models/mlp/infer", "/v2/repository/index", "/v2/repository/models/mlp/load"):
        started = time.monotonic()
        answer = raw_http(
            rt.port, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        status, body = status_and_json(answer)
        assert status == 408 and "did not arrive within 0.3 s" in body["error"], path
        assert time.monotonic() - started < 5
        # headers only: the declared length alone is refused, nothing is waited for
        answer = raw_http(
            rt.port,
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n".encode(),
        )
        status, body = status_and_json(answer)
        assert status == 413 and "exceeds maxRequestBytes 4096" in body["error"], path
    assert rt.metric("tidal_requests_total", model="mlp", code="408") == 1
    assert rt.metric("tidal_requests_total", model="mlp", code="413") == 1  # refused early too


def test_unknown_routes_and_methods_answer_json(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    status, _, body = post(f"{rt.url}/v2/trace/setting", None, method="GET")
    assert status == 404 and body["error"] == "no endpoint GET /v2/trace/setting"
    status, headers, body = post(f"{rt.url}/v2/health/live", b"", method="PUT")
    assert status == 405 and "PUT is not allowed" in body["error"] and "GET" in headers["Allow"]
    with pytest.raises(InferenceServerException, match="no endpoint"):
        triton.InferenceServerClient(rt.url).get_trace_settings()


def test_repository_bodies_are_checked(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp", preload=False)]})
    index = f"{rt.url}/v2/repository/index"
    load = f"{rt.url}/v2/repository/models/mlp/load"
    unload = f"{rt.url}/v2/repository/models/mlp/unload"
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = [
        (index, b"\xff\xfe\x00", "not valid JSON"),
        (index, deep, "nested too deeply"),
        (index, b'{"ready": "yes"}', "'ready' must be true or false"),
        (index, b'{"readyy": true}', "unknown fields ['readyy']"),
        (load, b'{"parameters": {"config": "{}"}}', "not supported"),
        (load, b"[1]", "must be a JSON object"),
        (unload, b'{"parameters": {"unload_dependents": "no"}}', "true or false"),
        (load, b'{"parameters": []}', "'parameters' must be a JSON object"),
        (load, b'{"parameters": 0}', "'parameters' must be a JSON object"),
        (unload, b'{"parameters": ""}', "'parameters' may only hold"),
    ]
    for url, payload, message in cases:
        status, _, answer = post(url, payload)
        assert (status, message in answer["error"]) == (400, True), (url, payload[:20], answer)
    assert post(index, b'{"ready": true}')[2] == []
    assert post(load, b"")[0] == 200 and post(unload, b"{}")[0] == 200


def test_infer_refuses_deep_json_many_dimensions_and_unsupported_datatypes(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    url = f"{rt.url}/v2/models/mlp/infer"

    def tensor(datatype: str, shape: list[int], data: Any) -> bytes:
        return json.dumps(
            {"inputs": [{"name": "input", "datatype": datatype, "shape": shape, "data": data}]}
        ).encode()

    cases = [
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (tensor("FP32", [1] * 65, [1.0]), "at most 64"),
        (tensor("BYTES", [1, 16], ["a"] * 16), "expected datatype FP32, got BYTES"),
        (tensor("FP32", [1, 16], [1e39] * 16), "outside FP32's range"),
    ]
    if "BF16" in DATATYPES:
        cases.append((tensor("BF16", [1, 16], [1.0] * 16), "expected datatype FP32, got BF16"))
    for payload, message in cases:
        status, _, answer = post(url, payload)
        assert (status, message in answer["error"]) == (400, True), (payload[:30], answer)
    assert rt.metric("tidal_requests_total", model="mlp", code="500") == 0


def test_non_finite_outputs_reach_tritonclient_as_in_triton(serve, models, model_entry) -> None:
    backend = GateBackend()
    rt = serve({"models": [model_entry(models["mlp"], "gate")]}, backend)
    client = triton.InferenceServerClient(rt.url)
    x = np.array([[np.nan, np.inf]], np.float32)
    for binary in (False, True):
        tensor = triton.InferInput("x", [1, 2], "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = triton.InferRequestedOutput("y", binary_data=binary)
        y = client.infer("gate", [tensor], outputs=[wanted]).as_numpy("y")
        assert np.isnan(y[0, 0]) and y[0, 1] == np.inf


def test_strict_json_mode_writes_non_finite_outputs_as_strings(serve, models, model_entry) -> None:
    rt = serve(
        {"models": [model_entry(models["mlp"], "gate")], "nonFiniteJson": "strings"},
        GateBackend(),
    )
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 1.0]}],
        "outputs": [],  # every output, as over gRPC
    }
    status, _, answer = post(f"{rt.url}/v2/models/gate/infer", json.dumps(body).encode())
    assert status == 200, answer
    assert [o["name"] for o in answer["outputs"]] == ["y"]
    body["inputs"][0]["data"] = ["NaN", 1.0]  # not a number: refused, strings are outputs only
    assert post(f"{rt.url}/v2/models/gate/infer", json.dumps(body).encode())[0] == 400
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [NaN, -1e999]}]}'
    status, _, answer = post(f"{rt.url}/v2/models/gate/infer", raw)
    assert status == 200 and answer["outputs"][0]["data"] == ["NaN", "-Infinity"], answer


def test_model_ready_names_the_model_and_metadata_has_properties(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp", maxBatchSize=4)]})
    status, _, body = post(f"{rt.url}/v2/models/mlp/ready", None, method="GET")
    assert (status, body) == (200, {"name": "mlp", "ready": True})
    status, _, body = post(f"{rt.url}/v2/models/mlp", None, method="GET")
    assert body["properties"] == {"backend": "onnxruntime", "max_batch_size": "4"}, body
