"""A bounded, loopback-only fuzz of the runtime's and the gateway's HTTP APIs (issues 14, 22).

A seeded generator sends a few hundred malformed requests over raw sockets, to the runtime and
to a gateway in front of one (the public entry of a fleet, as strict as the runtime): mutated
OIP bodies (JSON and the binary extension), wrong Inference-Header-Content-Length and
binary_data_size values, BYTES length prefixes, random bytes, deep nesting, odd paths, methods
and headers, bodies shorter or longer than declared, broken chunked and gzip encodings, a
decompression bomb, clients that hang up mid-upload, stalled uploads, header values that are
not latin-1 — and checks that nothing is answered 5xx, that no request goes unanswered past the
read timeout, that every error is JSON, that client faults are not logged as errors, that the
process's memory stays bounded, and that the server still answers correctly after.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from aiohttp import web

from tidal.common.http import JsonErrorRunner
from tidal.gateway.config import GatewayConfig, ReplicaRef
from tidal.gateway.server import Gateway

SEED = int(os.environ.get("TIDAL_FUZZ_SEED", "20261203"))  # another seed explores further
CASES = int(os.environ.get("TIDAL_FUZZ_CASES", "420"))
MAX_BODY = 64 * 1024
STALL_S = 0.3  # the read timeout the fuzzed server runs with
ROUTES = [
    ("POST", "/v2/models/mlp/infer"),
    ("POST", "/v2/models/mlp/versions/1/infer"),
    ("POST", "/v2/models/words/infer"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/mlp/load"),
    ("POST", "/v2/repository/models/words/unload"),
    ("PUT", "/v2/tidal/placement"),
    ("GET", "/v2/models/mlp"),
    ("GET", "/v2/models/mlp/stats"),
    ("GET", "/v2/tidal/models"),
]
GATEWAY_ROUTES = [
    ("POST", "/v2/models/mlp/infer"),
    ("POST", "/v2/models/mlp/versions/1/infer"),
    ("POST", "/v2/models/words/infer"),
    ("POST", "/v2/repository/index"),
    ("PUT", "/v2/tidal/replicas"),
    ("GET", "/v2/models/mlp"),
    ("GET", "/v2/models/mlp/ready"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2"),
]
HANG = -1  # no answer before the client's patience ran out (the server held the connection)
PATIENCE_S = 10.0  # far above STALL_S (and a loaded machine): later than this is a hang


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def exchange(port: int, data: bytes, *, hang_up: bool = False) -> int | None:
    """Send raw bytes; the answer's status, or None when there is none (or we hang up)."""
    return exchange_for_error(port, data, hang_up=hang_up)[0]


def exchange_for_error(
    port: int, data: bytes, *, hang_up: bool = False
) -> tuple[int | None, str | None]:
    """:func:`exchange`, with the error message of a 4xx or 5xx answer (checked to be JSON)."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may refuse early and close while we still send
        if hang_up:
            return None, None
        answer = b""
        while True:
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                lengths = [
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")[1:]
                    if line.lower().startswith(b"content-length:")
                ]
                if lengths and len(body) >= lengths[0]:
                    break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if not sep:
                    return HANG, None
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    if not answer.startswith(b"HTTP/1."):
        return None, None
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(answer.split(b" ", 2)[1])
    if status < 400:
        return status, None
    assert b"application/json" in head.lower(), f"error {status} is not JSON: {answer[:300]!r}"
    error = json.loads(body).get("error")
    assert isinstance(error, str) and error, answer[:300]
    return status, error


class Generator:
    """Malformed requests from one seed: each call returns (raw bytes, hang up?)."""

    def __init__(self, seed: int, routes: list[tuple[str, str]] = ROUTES) -> None:
        self.rng = random.Random(seed)
        self.routes = routes

    def json_value(self, depth: int = 0) -> Any:
        r = self.rng
        choice = r.randrange(9 if depth < 3 else 6)
        if choice == 0:
            return None, None
        if choice == 1:
            return r.choice([True, False])
        if choice == 2:
            return r.choice([0, -1, 1, 2**31, 2**64, -(2**70), 255, 256])
        if choice == 3:
            return r.choice([0.5, 1e39, -1e308, float("nan"), float("inf"), 1e-45])
        if choice == 4:
            return r.choice(["", "x", "1.5", "FP32", "\u00e9\u0000", "true"])
        if choice == 5:
            return []
        if choice == 6:
            return [self.json_value(depth + 1) for _ in range(r.randrange(4))]
        if choice == 7:
            return {r.choice(["name", "data", "shape", "x"]): self.json_value(depth + 1)}
        return [[1.0] * 16]

    def tensor(self) -> dict[str, Any]:
        r = self.rng
        tensor: dict[str, Any] = {
            "name": "input",
            "datatype": "FP32",
            "shape": [1, 16],
            "data": [0.5] * 16,
        }
        for _ in range(r.randrange(1, 4)):
            key = r.choice(["name", "datatype", "shape", "data", "parameters", "drop"])
            if key == "drop":
                tensor.pop(r.choice(list(tensor) or ["name"]), None)
            elif key == "datatype":
                tensor[key] = r.choice(["FP16", "INT8", "UINT64", "BOOL", "BYTES", "BF16", "FP8"])
            elif key == "shape":
                tensor[key] = r.choice(
                    [[1] * 65, [2**40, 2**40], [-1, 16], [16], [1, 16, 1], [0, 16], "x"]
                )
            elif key == "data":
                tensor[key] = r.choice(
                    [
                        [[0.5] * 8, [0.5] * 8],
                        [[0.5] * 4] * 4,
                        [None] * 16,
                        ["1"] * 16,
                        [1e39] * 16,
                        [True] * 16,
                        self.json_value(),
                    ]
                )
            else:
                tensor[key] = self.json_value()
        return tensor

    def infer_header(self) -> dict[str, Any]:
        r = self.rng
        header: dict[str, Any] = {"inputs": [self.tensor() for _ in range(r.randrange(1, 3))]}
        if r.random() < 0.4:
            header["parameters"] = r.choice(
                [
                    {"binary_data_output": r.choice(["yes", 1, None, True])},
                    {"timeout": r.choice([-1, "10", 1.5, 2**70, 10])},
                    self.json_value(),
                ]
            )
        if r.random() < 0.3:
            header["outputs"] = r.choice(
                [
                    [{"name": "output", "parameters": {"binary_data": "no"}}],
                    [{"name": "nope"}],
                    [{"name": "output", "parameters": {"classification": 3}}],
                    self.json_value(),
                ]
            )
        if r.random() < 0.2:
            header["id"] = self.json_value()
        return header

    def binary_infer(self) -> tuple[bytes, dict[str, str]]:
        r = self.rng
        datatype = r.choice(["FP32", "FP32", "BYTES", "INT64"])
        count = r.choice([16, 15, 17, 0])
        if datatype == "BYTES":
            raw = b"".join(
                struct.pack("<I", r.choice([1, 3, 2**31, 0])) + b"abc" for _ in range(count)
            )
        else:
            raw = r.randbytes(max(0, count * 4 + r.choice([0, 0, 1, -1])))
        size: Any = r.choice([len(raw), len(raw) + 1, len(raw) - 1, -4, True, "4", 2**62])
        tensor = {
            "name": "input",
            "datatype": datatype,
            "shape": [1, count],
            "parameters": {"binary_data_size": size},
        }
        header = json.dumps({"inputs": [tensor]}).encode()
        length: Any = r.choice(
            [len(header), len(header), len(header) + 3, -1, 2**63, "x", " 1", len(header) * 10]
        )
        return header + raw, {"Inference-Header-Content-Length": str(length)}

    def body(self, path: str) -> tuple[bytes, dict[str, str]]:
        r = self.rng
        kind = r.randrange(6)
        if kind == 0 and path.endswith("/infer"):
            return self.binary_infer()
        if kind <= 2 and path.endswith("/infer"):
            return json.dumps(self.infer_header()).encode(), {}
        if kind == 3:
            depth = r.choice([64, 65, 1000, 20000])
            return b"[" * depth + b"]" * depth, {}
        if kind == 4:
            return r.randbytes(r.randrange(0, 200)), {}
        return json.dumps(self.json_value()).encode(), {}

    def request(self) -> tuple[bytes, bool]:
        r = self.rng
        method, path = r.choice(self.routes)
        body, headers = self.body(path)
        mutation = r.randrange(14)
        hang_up = False
        if mutation == 0:
            method = r.choice(["DELETE", "PATCH", "OPTIONS", "GET", "PUT", "FOO"])
        elif mutation == 1:
            path = r.choice(
                [
                    "/v2/models/mlp/versions/2/infer",
                    "/v2/models/mlp/versions/-1/ready",
                    "/v2/models/mlp/versions/%FF/infer",
                    "/v2/models/../../etc/passwd",
                    "/v2/models/" + "a" * 6000,
                    "/v2/trace/setting",
                    "/v2/logging",
                    "/v2/models/%00/infer",
                    "//v2//models",
                    "/v2/models/mlp/infer?x=%zz",
                ]
            )
        elif mutation == 2:
            headers["Content-Length"] = str(len(body) + r.choice([1, 100, 10**12]))
        elif mutation == 3:
            headers["Content-Length"] = r.choice(["-1", "abc", "1e3", "0x10", "", " 5 "])
        elif mutation == 4:  # declares less than it sends: the rest reads as the next request
            headers["Content-Length"] = str(max(0, len(body) - r.randrange(1, 8)))
        elif mutation == 5:
            return self.chunked(method, path, body), False
        elif mutation == 6:
            headers["Content-Encoding"] = r.choice(["gzip", "deflate", "br", "zz"])
            if r.random() < 0.5:
                body = gzip.compress(body)[: r.randrange(1, 40)]  # truncated stream
        elif mutation == 7:  # a decompression bomb: small on the wire, far over maxRequestBytes
            headers["Content-Encoding"] = "gzip"
            body = gzip.compress(b"[" + b"0," * (4 * MAX_BODY) + b"0]")
        elif mutation == 8:
            headers[r.choice(["X-Big", "Content-Type", "Host"])] = "v" * r.choice([100, 9000])
        elif mutation == 9:
            hang_up = True
            headers["Content-Length"] = str(len(body) + 50)
        elif mutation == 10:
            headers["Content-Length"] = str(MAX_BODY * 4)  # refused before reading
            body = b""
        elif mutation == 11:  # UTF-8 on the wire: a value aiohttp decodes past latin-1
            headers[r.choice(["Content-Type", "Accept", "Inference-Header-Content-Length"])] = (
                r.choice(["application/json; x=\u2192", "\u4e2d", "1\u20ac"])
            )
        if "Content-Length" not in headers:
            headers["Content-Length"] = str(len(body))
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return head.encode() + b"\r\n" + body, hang_up

    def chunked(self, method: str, path: str, body: bytes) -> bytes:
        r = self.rng
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        size = r.choice([f"{len(body):x}", "zz", f"{len(body) + 5:x}", "-1", "1" * 20])
        tail = r.choice([b"\r\n0\r\n\r\n", b"", b"\r\n", b"\r\n5\r\nab"])
        return head.encode() + size.encode() + b"\r\n" + body + tail


def fuzz(
    port: int,
    routes: list[tuple[str, str]],
    *,
    broken: str | None = None,
    between: Callable[[int], None] | None = None,
) -> tuple[Counter[int | None], float, int]:
    """Send CASES seeded cases; (statuses, seconds, RSS growth after warm-up).

    ``broken``: a model that failed to load; its requests may be answered 503, naming the load
    error. ``between``: called with the case's index every 20 cases (the good models' check)."""
    generator = Generator(SEED, routes)
    statuses: Counter[int | None] = Counter()
    started = time.monotonic()
    baseline = 0
    for index in range(CASES):
        if index == 40:  # after warm-up: allocator pools, first-use imports, caches
            baseline = rss_bytes()
        data, hang_up = generator.request()
        status, error = exchange_for_error(port, data, hang_up=hang_up)
        statuses[status] += 1
        assert status != HANG, f"case {index}: no answer within {PATIENCE_S} s: {data[:300]!r}"
        request_line = data.split(b"\r\n", 1)[0]
        path = request_line.split(b" ")[1] if request_line.count(b" ") >= 2 else b""
        if status == 503 and broken is not None and path.split(b"/")[3:4] == [broken.encode()]:
            assert error is not None and f"{broken!r} failed to load" in error, (index, error)
        else:
            assert status is None or status < 500, (index, status, error, data[:300])
        if between is not None and index % 20 == 0:
            between(index)
    return statuses, time.monotonic() - started, rss_bytes() - baseline


def test_fuzzed_requests_get_no_5xx_and_leave_a_live_bounded_server(
    serve, models, model_entry, caplog
) -> None:
    caplog.set_level("INFO")
    rt = serve(
        {
            "models": [model_entry(models["mlp"], "mlp"), model_entry(models["mlp_b"], "words")],
            "maxRequestBytes": MAX_BODY,
        }
    )

    def short_timeout() -> None:
        rt.server.body_read_timeout_s = STALL_S

    rt.call(short_timeout)
    statuses, elapsed, growth = fuzz(rt.port, ROUTES)

    client = triton.InferenceServerClient(rt.url)
    assert client.is_server_live() and client.is_server_ready()
    x = np.ones((2, 16), np.float32)
    tensor = triton.InferInput("input", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    expected = triton.InferenceServerClient(rt.url).infer("mlp", [tensor]).as_numpy("output")
    assert expected is not None and expected.shape == (2, 4) and np.isfinite(expected).all()

    def settled() -> bool:
        return rt.metric("tidal_inflight_requests") == 0

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled()  # nothing leaked in flight
    text = rt.metrics_text()
    server_errors = [line for line in text.splitlines() if 'code="5' in line and "_total" in line]
    assert not server_errors, server_errors
    answered = sum(n for s, n in statuses.items() if s is not None)
    assert answered > CASES // 2, statuses  # most cases were answered, not dropped
    assert {400, 404, 408, 413} <= set(statuses), statuses  # the generator reached each refusal
    errors = [r for r in caplog.records if r.levelno >= 40]  # client faults are not logged loud
    assert not errors, [r.getMessage() for r in errors[:3]]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks[:3]]
    assert rt.metric("tidal_requests_total", model="mlp", code="499") > 0  # hang-ups counted
    assert rt.metric("tidal_requests_total", model="mlp", code="413") > 0  # early 413s too
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over {CASES} cases"
    assert elapsed < 60, f"{elapsed:.1f} s"
    print(f"fuzz: {CASES} cases in {elapsed:.1f} s, RSS +{growth / 2**20:.1f} MiB, {statuses}")


@pytest.fixture
def served_gateway() -> Iterator[Any]:
    """Serve a Gateway from a background thread's event loop (as the runtime fixture does)."""
    started: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, threading.Thread]] = []

    def start(config: dict[str, Any], replicas: list[ReplicaRef]) -> tuple[Gateway, int]:
        gateway = Gateway(GatewayConfig.model_validate(config), replicas)
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def run() -> None:
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            runner = JsonErrorRunner(gateway.build_app(), access_log=None, auto_decompress=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["port"] = runner.addresses[0][1]
            ready.set()
            await box["stop"].wait()
            await runner.cleanup()

        thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
        thread.start()
        assert ready.wait(30), "the gateway did not start"
        started.append((box["loop"], box["stop"], thread))
        return gateway, box["port"]

    yield start
    for loop, stop, thread in started:
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)


def test_fuzzed_requests_through_the_gateway_get_no_5xx_and_no_hang(
    serve, models, model_entry, served_gateway, caplog
) -> None:
    caplog.set_level("INFO")
    rt = serve(
        {
            "models": [model_entry(models["mlp"], "mlp"), model_entry(models["mlp_b"], "words")],
            "maxRequestBytes": MAX_BODY,
        }
    )
    rt.call(lambda: setattr(rt.server, "body_read_timeout_s", STALL_S))
    gateway, port = served_gateway(
        {
            "maxRequestBytes": MAX_BODY,
            "requestReadTimeoutSeconds": STALL_S,
            "holdTimeoutSeconds": 5,
        },
        [ReplicaRef(name="rt", url=f"http://{rt.url}")],
    )
    deadline = time.monotonic() + 30
    while not all(r.healthy for r in gateway.replicas.values()):
        assert time.monotonic() < deadline, [r.describe() for r in gateway.replicas.values()]
        time.sleep(0.02)

    statuses, elapsed, growth = fuzz(port, GATEWAY_ROUTES)

    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_server_live() and client.is_server_ready()
    tensor = triton.InferInput("input", [2, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 16), np.float32))
    answer = client.infer("mlp", [tensor]).as_numpy("output")
    assert answer is not None and answer.shape == (2, 4) and np.isfinite(answer).all()

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    counted = [
        line for line in text.splitlines() if line.startswith("tidal_gateway_requests_total")
    ]
    server_errors = [line for line in counted if 'code="5' in line]
    assert not server_errors, server_errors
    for code in ("400", "404", "405", "408", "413"):  # client mistakes are counted
        assert any(f'code="{code}"' in line for line in counted), (code, counted)
    answered = sum(n for s, n in statuses.items() if s is not None)
    assert answered > CASES // 2, statuses
    assert {400, 404, 405, 408, 413} <= set(statuses), statuses
    loud = [r for r in caplog.records if r.levelno > 20 or r.exc_info]  # at most INFO, no trace
    assert not loud, [(r.levelname, r.getMessage()) for r in loud[:3]]
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over {CASES} cases"
    assert elapsed < 60, f"{elapsed:.1f} s"
    print(f"gateway fuzz: {CASES} cases in {elapsed:.1f} s, {statuses}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served_main() -> Iterator[Callable[..., None]]:
    """Run a server's own ``serve(..., stop=...)``, as its process does, on a thread's loop."""
    started: list[tuple[dict[str, Any], threading.Thread]] = []

    def start(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]], port: int) -> None:
        box: dict[str, Any] = {}

        async def run() -> None:
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            await main(box["stop"])

        def thread_main() -> None:
            try:
                asyncio.run(run())
            except BaseException as exc:  # shown by the test
                box["error"] = exc

        thread = threading.Thread(target=thread_main, daemon=True)
        thread.start()
        started.append((box, thread))
        deadline = time.monotonic() + 60
        while True:
            assert thread.is_alive(), f"the server exited: {box.get('error')!r}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"nothing listens on {port} after 60 s"
            time.sleep(0.05)

    yield start
    for box, thread in started:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


def get_status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE_S)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def corrupt_model(tmp_path: Any, name: str) -> dict[str, Any]:
    """A preloaded model whose engine is not an engine (its sha256 matches): it never loads."""
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(b"this is not an onnx model")
    return {"name": name, "engines": [{"uri": path.as_uri()}]}


def valid_infer(model: str) -> bytes:
    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    ).encode()
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


# Malformed at the protocol level: aiohttp answers these itself, before any route runs.
PROTOCOL_FAULTS = [
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"GE\x01T /v2 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v2 HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHo st: x\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\n\x00: y\r\n\r\n",
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nExpect: bogus\r\n\r\n",
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nExpect: bogus\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
]


def check_protocol_faults(port: int) -> None:
    answers = {data[:40]: exchange_for_error(port, data) for data in PROTOCOL_FAULTS}
    refused = {k: v for k, v in answers.items() if v[0] is None or v[0] < 400 or v[0] >= 500}
    assert not refused, refused  # each answered with a 4xx (JSON: checked by the exchange)
    expect = answers[PROTOCOL_FAULTS[-3][:40]]
    assert expect[0] == 417 and "100-continue" in str(expect[1]), expect


def test_with_grpc_on_and_a_broken_model_every_error_is_json_and_the_good_models_serve(
    served_main, models, model_entry, tmp_path, caplog
) -> None:
    """As pods run: the runtime's own serve() with gRPC on, one preloaded model broken."""
    from tidal.runtime import grpc_server
    from tidal.runtime.config import parse_config

    caplog.set_level("INFO")
    config = parse_config(
        {
            "models": [
                model_entry(models["mlp"], "mlp"),
                model_entry(models["mlp_b"], "words"),
                corrupt_model(tmp_path, "broken"),
            ],
            "maxRequestBytes": MAX_BODY,
            "requestReadTimeoutSeconds": STALL_S,
            "headerReadTimeoutSeconds": 2,
            "shutdownDrainSeconds": 0,
        }
    )
    port, grpc_port = free_port(), free_port()
    served_main(
        lambda stop: grpc_server.serve(config, "127.0.0.1", port, grpc_port, stop=stop), port
    )
    deadline = time.monotonic() + 60
    for model in ("mlp", "words"):  # the runtime never turns ready: wait for these two
        while get_status(port, f"/v2/models/{model}/ready") != 200:
            assert time.monotonic() < deadline, f"{model} did not load beside a broken model"
            time.sleep(0.05)
    # ... and for the broken one to have failed (on a loaded machine its load may still be
    # under way when the others are ready: a 503 that says "loading", not "failed to load").
    ready_request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    while "'broken' failed to load" not in str(exchange_for_error(port, ready_request)[1]):
        assert time.monotonic() < deadline, (
            f"broken never reported failing: {exchange_for_error(port, ready_request)}"
        )
        time.sleep(0.05)

    check_protocol_faults(port)

    def good_models_serve(index: int) -> None:
        for model in ("mlp", "words"):
            status, error = exchange_for_error(port, valid_infer(model))
            assert status == 200, (index, model, status, error)
        status, error = exchange_for_error(port, valid_infer("broken"))
        assert status == 503 and error is not None, (index, status, error)
        assert "'broken' failed to load" in error and "cannot load" in error, (index, error)

    routes = [*ROUTES, ("POST", "/v2/models/broken/infer"), ("GET", "/v2/models/broken")]
    statuses, elapsed, _ = fuzz(port, routes, broken="broken", between=good_models_serve)
    good_models_serve(CASES)
    # Not ready, saying which model failed and why (the operator's Degraded quotes it).
    status, error = exchange_for_error(port, ready_request)
    assert status == 503 and "'broken' failed to load" in str(error), (status, error)
    loud = [
        r
        for r in caplog.records
        if r.exc_info or (r.levelno >= 40 and "preloading broken failed" not in r.getMessage())
    ]
    assert not loud, [(r.levelname, r.getMessage()) for r in loud[:3]]
    print(f"fuzz with gRPC on and a broken model: {CASES} cases in {elapsed:.1f} s, {statuses}")


HEADER_TIMEOUT_S = 1.0  # the header read timeout of the slow-header tests
SLOW_CASES = 24
RESPONSE = "wait for the answer"  # a step of slow_client
Step = bytes | float | str


def slow_client(port: int, steps: list[Step], trickle: bytes = b"") -> tuple[bytes, bool, float]:
    """Send ``steps`` (bytes, RESPONSE, or seconds to wait), then ``trickle`` one byte every 50 ms,
    cycled, reading what comes, until the server closes the connection or PATIENCE_S passes.
    Returns (what was received, closed by the server, seconds from the last step to the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S) as sock:
        received, position = b"", 0
        for step in steps:
            if step == RESPONSE:
                while not answers(received, complete=False):
                    chunk = sock.recv(65536)
                    assert chunk, f"closed before answering: {received[:300]!r}"
                    received += chunk
            elif isinstance(step, float):
                time.sleep(step)
            elif isinstance(step, bytes):
                sock.sendall(step)
        started = time.monotonic()
        sock.settimeout(0.05)
        while time.monotonic() - started < 3 * PATIENCE_S:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                chunk = None
            except ConnectionResetError:
                return received, True, time.monotonic() - started
            if chunk == b"":
                return received, True, time.monotonic() - started
            if chunk:
                received += chunk
            elif trickle:
                try:
                    sock.sendall(trickle[position % len(trickle) : position % len(trickle) + 1])
                except OSError:  # closed by the server meanwhile: read what it said
                    trickle = b""
                position += 1
        return received, False, time.monotonic() - started


def answers(received: bytes, *, complete: bool = True) -> list[tuple[int, dict[str, Any]]]:
    """The (status, JSON body) of each response in ``received``, in order (``complete``: and
    nothing else; else the complete responses so far)."""
    out = []
    while received.startswith(b"HTTP/1."):
        head, sep, rest = received.partition(b"\r\n\r\n")
        if not complete and (not sep or b"content-length" not in head.lower()):
            break
        lengths = [
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        ]
        assert lengths, received[:300]
        if not complete and len(rest) < lengths[0]:
            break
        body, received = rest[: lengths[0]], rest[lengths[0] :]
        status = int(head.split(b" ", 2)[1])
        assert b"application/json" in head.lower(), f"not JSON: {head[:300]!r}"
        out.append((status, json.loads(body)))
    assert not complete or not received, f"not HTTP: {received[:300]!r}"
    return out


def slow_header_cases(seed: int) -> list[tuple[str, list[Step], bytes]]:
    """Clients that never finish a header block (each must be closed, told 408 when it sent
    anything), and slow ones the limit must leave alone: an idle kept-alive connection, a body
    trickling in after a complete header block. (name, steps, trickled bytes)."""
    rng = random.Random(seed)
    body = valid_infer("mlp").partition(b"\r\n\r\n")[2]
    head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n\r\n"
    ).encode()
    closing = head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    step, pause = -(-len(body) // 8), HEADER_TIMEOUT_S / 4
    cases: list[tuple[str, list[Step], bytes]] = [
        ("silent", [], b""),
        ("idle keep-alive", [head + body, 2.5 * HEADER_TIMEOUT_S, closing + body], b""),
        (
            "slow body",  # eight pieces over twice the header limit, then kept alive, idle
            [
                head,
                *[b for i in range(8) for b in (body[i * step : (i + 1) * step], pause)],
                RESPONSE,
                2.5 * HEADER_TIMEOUT_S,
                closing + body,
            ],
            b"",
        ),
    ]
    while len(cases) < SLOW_CASES:
        cut = head[: rng.randrange(1, len(head) - 1)]
        kind = rng.choice(["stall", "trickle line", "trickle lines", "after a request"])
        if kind == "stall":
            cases.append((f"stall at {len(cut)}", [cut], b""))
        elif kind == "trickle line":  # a header value that never ends
            cases.append((kind, [head[: head.index(b"\r\n") + 2] + b"X-Slow: "], b"a"))
        elif kind == "trickle lines":  # header lines that never end
            cases.append((kind, [head.rpartition(b"\r\n\r\n")[0] + b"\r\n"], b"X-Slow: a\r\n"))
        else:  # answered, then the next request stalls (RESPONSE: wait for the answer)
            cases.append((f"{kind}, stall at {len(cut)}", [head + body, RESPONSE, cut], b""))
    return cases


def check_slow_headers(port: int) -> None:
    """Run the slow-header cases at once and check what each got; the server must stay fit."""
    cases = slow_header_cases(SEED)
    results: dict[int, Any] = {}

    def run(index: int) -> None:
        _, steps, trickle = cases[index]
        try:
            results[index] = slow_client(port, steps, trickle)
        except BaseException as exc:  # reported below, with the case
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5 * PATIENCE_S)
    for index, (name, _, _) in enumerate(cases):
        result = results.get(index)
        assert isinstance(result, tuple), (name, result)
        received, closed, elapsed = result
        assert closed, f"{name}: still open {elapsed:.1f} s after its last step: {received[:200]!r}"
        got = answers(received)
        statuses = [status for status, _ in got]
        if name == "silent":  # never asked anything: closed without an answer
            assert got == [] and elapsed >= HEADER_TIMEOUT_S / 2, (name, got, elapsed)
        elif name in ("idle keep-alive", "slow body"):  # slow, not stuck: served
            assert statuses == [200, 200], (name, got)
        else:
            assert statuses[-1] == 408 and set(statuses[:-1]) <= {200}, (name, got)
            assert "header" in got[-1][1]["error"], (name, got)
            assert elapsed >= HEADER_TIMEOUT_S / 2, (name, elapsed)
    # Still serving, and every held connection was let go.
    status, error = exchange_for_error(port, valid_infer("mlp"))
    assert status == 200, (status, error)


def test_slow_header_blocks_are_closed_and_errors_are_json_in_the_runtime(
    served_main, models, model_entry
) -> None:
    from tidal.runtime.config import parse_config
    from tidal.runtime.server import serve

    config = parse_config(
        {
            "models": [model_entry(models["mlp"], "mlp")],
            "headerReadTimeoutSeconds": HEADER_TIMEOUT_S,
            "shutdownDrainSeconds": 0,
        }
    )
    port = free_port()
    served_main(lambda stop: serve(config, "127.0.0.1", port, stop=stop), port)
    deadline = time.monotonic() + 60
    while get_status(port, "/v2/health/ready") != 200:
        assert time.monotonic() < deadline, "the runtime did not turn ready"
        time.sleep(0.05)
    check_protocol_faults(port)
    check_slow_headers(port)


def test_slow_header_blocks_are_closed_and_errors_are_json_in_the_gateway(
    serve, served_main, models, model_entry
) -> None:
    from tidal.gateway.server import serve as serve_gateway

    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    config = GatewayConfig.model_validate(
        {"headerReadTimeoutSeconds": HEADER_TIMEOUT_S, "shutdownDrainSeconds": 0}
    )
    port = free_port()
    replicas = [ReplicaRef(name="rt", url=f"http://{rt.url}")]
    served_main(lambda stop: serve_gateway(config, "127.0.0.1", port, replicas, stop), port)
    deadline = time.monotonic() + 60
    while get_status(port, "/v2/health/ready") != 200:
        assert time.monotonic() < deadline, "the gateway did not turn ready"
        time.sleep(0.05)
    check_protocol_faults(port)
    check_slow_headers(port)
