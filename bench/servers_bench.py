"""Side-by-side: tidal against KServe's ModelServer, Seldon's MLServer and direct ONNX Runtime.

The same three generated ONNX models (``tidal.runtime.modelgen``), the same client load, one run:

* ``light``  MLP 64-64x2-8: next to no compute, so a server's own per-request cost is measured;
* ``heavy``  convnet (32 channels, 16x16 images): ~0.2 ms of compute per row, batch or not;
* ``batch``  MLP 256-1024x3-16: weight-bound, ~1.6 ms at batch 1 but ~0.26 ms per row at 32,
  so a server that batches concurrent requests wins on it.

Servers, each one process serving all three models, each with ONNX Runtime on one intra-op
thread (CPU execution provider) and no per-request logging:

* ``tidal``     ``python -m tidal.runtime`` (HTTP and gRPC; dynamic batching on,
  ``maxQueueDelayMs: 0``, ``maxBatchSize: 32``);
* ``kserve``    ``kserve.ModelServer`` with a custom ``kserve.Model`` calling ``session.run``
  (KServe's own ONNX path is Triton; its Python server serves custom models), REST and gRPC;
* ``mlserver``  ``mlserver start`` with a custom ``MLModel`` runtime calling ``session.run``
  (``mlserver-onnx`` is not on the package index here), ``parallel_workers: 0`` (inference in
  the server process: with one core, worker processes only add IPC), REST and gRPC;
* ``direct``    ``session.run`` in-process, batch 1 and batch 32: the ceiling.

Load, from this process: closed loops (C clients each sending one row, waiting for the answer,
sending again) at a few concurrencies, then an open-loop Poisson sweep at fixed fractions of
tidal's closed-loop saturation on that model and transport (the same absolute rates for every
server; latency counted from the scheduled send time, so a server that falls behind is charged
for the queue it builds; at most 512 requests outstanding, the rest counted as dropped; HTTP
over a pool of as many keep-alive connections as the largest closed loop, gRPC over one
channel).
HTTP requests are OIP v2 JSON (every server speaks it; tidal's binary extension is measured as
an extra row); gRPC requests carry ``raw_input_contents``, serialised once.

CPU sets: the server runs under ``taskset -c 0``, this load generator pins itself to core 1
(``os.sched_setaffinity``), so the client never takes the server's core; the direct call runs
on core 0 with no server up.  On a machine with other load (CI) the figures move: the load
average is printed before and after.

    .venv/bin/python bench/servers_bench.py [--quick] [--servers tidal,kserve,mlserver]
        [--json results.json]

kserve and mlserver pin conflicting versions of fastapi/starlette, and neither belongs in the
project's virtualenv: each lives in its own (``--kserve-python``, ``--mlserver-python``, default
``bench/.venv-kserve`` and ``bench/.venv-mlserver``; created with ``--setup``).  A full run
takes about 8 minutes, ``--quick`` under 2, ``--smoke`` (tidal only, light model, a second per
point) about 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import onnxruntime as ort

from tidal.runtime.modelgen import ModelInfo, write_convnet, write_mlp

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = "0", 1
MAX_BATCH = 32
MAX_OUTSTANDING = 512  # open loop: requests in flight beyond this are dropped, not queued
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
SERVERS = ("tidal", "kserve", "mlserver")


def make_models(workdir: Path) -> dict[str, ModelInfo]:
    return {
        "light": write_mlp(workdir / "light.onnx", inputs=64, hidden=64, outputs=8, layers=2),
        "heavy": write_convnet(workdir / "heavy.onnx", channels=32, size=16, classes=10),
        "batch": write_mlp(workdir / "batch.onnx", inputs=256, hidden=1024, outputs=16, layers=3),
    }


@dataclass(frozen=True)
class Plan:
    seconds: float
    concurrencies: tuple[int, ...]
    rate_fractions: tuple[float, ...]
    models: tuple[str, ...]


FULL = Plan(3.0, (1, 8, 64), (0.3, 0.6, 0.9), ("light", "heavy", "batch"))
QUICK = Plan(1.0, (1, 64), (0.6,), ("light", "heavy", "batch"))
SMOKE = Plan(0.5, (1, 8), (0.5,), ("light",))


@dataclass
class Point:
    """One measurement: a server, a transport, a model and a load."""

    server: str
    transport: str
    model: str
    load: str  # "closed C" or "poisson R/s"
    throughput: float  # answered requests (= rows) per second
    p50_ms: float
    p99_ms: float
    errors: int = 0
    dropped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q)) * 1000 if samples else float("nan")


def row_input(info: ModelInfo) -> np.ndarray[Any, Any]:
    shape = [1, *info.input_shape[1:]]
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


# -- requests ---------------------------------------------------------------------------------


def json_body(info: ModelInfo) -> bytes:
    x = row_input(info)
    tensor = {"name": info.input_name, "shape": list(x.shape), "datatype": "FP32"}
    return json.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]}).encode()


def binary_body(info: ModelInfo) -> tuple[bytes, dict[str, str]]:
    x = row_input(info)
    tensor = {"name": info.input_name, "shape": list(x.shape), "datatype": "FP32"}
    header = json.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": info.output_name, "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + x.tobytes(), headers


def grpc_body(name: str, info: ModelInfo) -> bytes:
    from tidal.runtime.grpc import oip_v2_pb2 as pb

    x = row_input(info)
    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name=info.input_name, datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return bytes(request.SerializeToString())


Send = Callable[[], Awaitable[bool]]  # one request; True when answered successfully


@contextlib.asynccontextmanager
async def http_sender(url: str, body: bytes, headers: dict[str, str], connections: int) -> Any:
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send() -> bool:
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        yield send


@contextlib.asynccontextmanager
async def grpc_sender(target: str, body: bytes) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(INFER_PATH)

        async def send() -> bool:
            try:
                await call(body, timeout=30)
            except grpc.aio.AioRpcError:
                return False
            return True

        yield send


# -- load -------------------------------------------------------------------------------------


async def closed_loop(send: Send, clients: int, seconds: float) -> tuple[float, list[float], int]:
    for _ in range(3):
        await send()
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            ok = await send()
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(latencies) / (time.perf_counter() - started), latencies, errors


async def poisson(send: Send, rate: float, seconds: float) -> tuple[float, list[float], int, int]:
    """Open loop: arrivals at ``rate``/s (exponential gaps, seeded); latency from schedule.

    The first fifth of the window warms up (connections, the server's queue) and is not counted.
    """
    rng = random.Random(7)
    latencies: list[float] = []
    errors = dropped = 0
    outstanding: set[asyncio.Task[None]] = set()
    started = time.perf_counter()
    counted_from = started + seconds / 5
    end = started + seconds + seconds / 5

    async def one(scheduled: float) -> None:
        nonlocal errors
        ok = await send()
        if scheduled < counted_from:
            return
        if ok:
            latencies.append(time.perf_counter() - scheduled)
        else:
            errors += 1

    arrival = started
    while True:
        arrival += rng.expovariate(rate)
        if arrival >= end:
            break
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(outstanding) >= MAX_OUTSTANDING:
            dropped += arrival >= counted_from
            continue
        task = asyncio.create_task(one(arrival))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
    if outstanding:
        await asyncio.wait(outstanding, timeout=30)
    elapsed = max(time.perf_counter(), end) - counted_from
    return len(latencies) / elapsed, latencies, errors, dropped


# -- servers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


KSERVE_SERVER = """
import logging, sys
import onnxruntime as ort
import kserve
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

class OnnxModel(Model):
    def __init__(self, name, path):
        super().__init__(name)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name
        self.ready = True

    async def predict(self, payload, headers=None, response_headers=None):
        x = payload.inputs[0].as_numpy()
        y = self.session.run(None, {self.input: x})[0]
        out = InferOutput(name=self.output, shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(
            model_name=self.name, infer_outputs=[out], response_id=payload.id or ""
        )

if __name__ == "__main__":
    http_port, grpc_port = int(sys.argv[1]), int(sys.argv[2])
    models = [OnnxModel(arg.split("=")[0], arg.split("=")[1]) for arg in sys.argv[3:]]
    server = ModelServer(http_port=http_port, grpc_port=grpc_port, workers=1,
                         enable_latency_logging=False, enable_docs_url=False)
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("uvicorn.access", "kserve", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start(models)
"""

MLSERVER_RUNTIME = """
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = self.settings.parameters.uri
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = self.session.run(None, {self.input: x})[0]
        return InferenceResponse(
            model_name=self.name, id=payload.id,
            outputs=[NumpyCodec.encode_output(self.output, y)],
        )
"""


@dataclass
class Server:
    name: str
    http: int
    grpc: int
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT if self.name == "mlserver" else signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_server(
    name: str, models: dict[str, ModelInfo], workdir: Path, args: argparse.Namespace
) -> Server:
    http, grpc_port = free_port(), free_port()
    log = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pin = ["taskset", "-c", SERVER_CPU]
    if name == "tidal":

        def entry(model: str, info: ModelInfo) -> dict[str, Any]:
            return {
                "name": model,
                "engines": [{"uri": info.uri}],
                "maxBatchSize": MAX_BATCH,
                "batching": {"maxQueueDelayMs": 0, "maxQueueSize": 4096},
                "warmup": {"batchSizes": [1, MAX_BATCH], "iterations": 3},
            }

        config = {
            "models": [entry(m, info) for m, info in models.items()],
            "onnxruntime": {"intraOpThreads": 1, "providers": ["CPUExecutionProvider"]},
            "memory": {"engineCacheBudgetBytes": "2Gi"},
            "shutdownDrainSeconds": 0,
        }
        env.update(
            TIDAL_RUNTIME_CONFIG_JSON=json.dumps(config),
            TIDAL_HOST="127.0.0.1",
            TIDAL_PORT=str(http),
            TIDAL_GRPC_PORT=str(grpc_port),
            TIDAL_LOG_LEVEL="WARNING",
        )
        command = [*pin, sys.executable, "-m", "tidal.runtime"]
    elif name == "kserve":
        script = workdir / "kserve_onnx.py"
        script.write_text(KSERVE_SERVER)
        pairs = [f"{m}={info.path}" for m, info in models.items()]
        command = [*pin, args.kserve_python, str(script), str(http), str(grpc_port), *pairs]
    else:
        repo = workdir / "mlserver"
        repo.mkdir(exist_ok=True)
        (repo / "onnx_runtime.py").write_text(MLSERVER_RUNTIME)
        settings = {
            "http_port": http,
            "grpc_port": grpc_port,
            "metrics_port": free_port(),
            "host": "127.0.0.1",
            "parallel_workers": 0,
            "debug": False,
            "load_models_at_startup": True,
        }
        (repo / "settings.json").write_text(json.dumps(settings))
        for model, info in models.items():
            (repo / model).mkdir(exist_ok=True)
            model_settings = {
                "name": model,
                "implementation": "onnx_runtime.OnnxRuntime",
                "parameters": {"uri": str(info.path)},
            }
            (repo / model / "model-settings.json").write_text(json.dumps(model_settings))
        mlserver = str(Path(args.mlserver_python).parent / "mlserver")
        command = [*pin, mlserver, "start", str(repo)]
        env["PYTHONPATH"] = str(repo)
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir
        )
    server = Server(name, http, grpc_port, process, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if all(ready(http, m) for m in models):
            return server
        time.sleep(0.25)
    server.stop()
    raise SystemExit(f"{name} did not become ready:\n{log.read_text()[-3000:]}")


def ready(port: int, model: str) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/v2/models/{model}/ready", timeout=1
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# -- the run ----------------------------------------------------------------------------------


def measure_direct(info: ModelInfo, batch: int, seconds: float) -> Point:
    os.sched_setaffinity(0, {int(SERVER_CPU)})
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(info.path), options, providers=["CPUExecutionProvider"])
        x = np.repeat(row_input(info), batch, axis=0)
        for _ in range(5):
            session.run(None, {info.input_name: x})
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            t0 = time.perf_counter()
            session.run(None, {info.input_name: x})
            latencies.append(time.perf_counter() - t0)
        rate = len(latencies) * batch / (time.perf_counter() - started)
    finally:
        os.sched_setaffinity(0, {CLIENT_CPU})
    return Point(
        "direct", "in-process", "", f"batch {batch}", rate, percentile(latencies, 50),
        percentile(latencies, 99),
    )  # fmt: skip


def transports(server: Server, model: str, info: ModelInfo) -> Iterator[tuple[str, Any]]:
    url = f"http://127.0.0.1:{server.http}/v2/models/{model}/infer"
    headers = {"Content-Type": "application/json"}
    body = json_body(info)
    yield "http-json", lambda c: http_sender(url, body, headers, c)
    if server.name == "tidal":
        binary, binary_headers = binary_body(info)
        yield "http-binary", lambda c: http_sender(url, binary, binary_headers, c)
    raw = grpc_body(model, info)
    yield "grpc", lambda c: grpc_sender(f"127.0.0.1:{server.grpc}", raw)


def print_point(point: Point) -> None:
    tail = ""
    if "server_cpu" in point.extra:
        tail += (
            f"  server CPU {point.extra['server_cpu']:.2f}, "
            f"{point.extra['server_us_per_request']:.0f} us/request"
        )
    if point.errors or point.dropped:
        tail += f"  errors {point.errors} dropped {point.dropped}"
    print(
        f"  {point.server:<9} {point.transport:<11} {point.model:<6} {point.load:<15} "
        f"{point.throughput:>8.0f}/s  P50 {point.p50_ms:8.3f} ms  P99 {point.p99_ms:8.3f} ms"
        f"{tail}",
        flush=True,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_server(
    server: Server, models: dict[str, ModelInfo], plan: Plan, rates: dict[tuple[str, str], float]
) -> list[Point]:
    points: list[Point] = []
    for model in plan.models:
        for transport, opener in transports(server, model, models[model]):
            saturation = 0.0
            # One client session per transport, kept across its loads: at most as many HTTP
            # connections as the largest closed loop uses (an open loop that opened one per
            # outstanding request would measure connection set-up, not serving); requests
            # waiting for a connection are charged that wait. gRPC multiplexes one channel.
            async with opener(max(plan.concurrencies)) as send:
                for clients in plan.concurrencies:
                    cpu = cpu_seconds(server.process.pid)
                    began = time.perf_counter()
                    rate, latencies, errors = await closed_loop(send, clients, plan.seconds)
                    # The server's CPU per answered request (its main process; the warm-up
                    # requests are included): on one core, whether the server is the limit.
                    busy = (cpu_seconds(server.process.pid) - cpu) / (time.perf_counter() - began)
                    point = Point(
                        server.name, transport, model, f"closed {clients}", rate,
                        percentile(latencies, 50), percentile(latencies, 99), errors,
                        extra={"server_cpu": busy, "server_us_per_request": busy / rate * 1e6
                               if rate else float("nan")},
                    )  # fmt: skip
                    points.append(point)
                    print_point(point)
                    saturation = max(saturation, rate)
                key = (model, "grpc" if transport == "grpc" else "http")
                if server.name == "tidal" and transport != "http-binary":
                    rates[key] = saturation
                for fraction in plan.rate_fractions:
                    target = fraction * rates.get(key, saturation)
                    rate, latencies, errors, dropped = await poisson(send, target, plan.seconds)
                    point = Point(
                        server.name, transport, model, f"poisson {target:.0f}/s", rate,
                        percentile(latencies, 50), percentile(latencies, 99), errors, dropped,
                        {"offered": target, "fraction_of_tidal": fraction},
                    )  # fmt: skip
                    points.append(point)
                    print_point(point)
    return points


def _find(points: list[Point], server: str, transport: str, model: str, load: str) -> Point | None:
    return next(
        (
            p for p in points
            if (p.server, p.transport, p.model, p.load) == (server, transport, model, load)
        ),
        None,
    )  # fmt: skip


def _row_key(point: Point) -> str:
    fraction = point.extra.get("fraction_of_tidal")
    return point.load if fraction is None else f"Poisson {fraction:.0%} of tidal's max"


def table(points: list[Point], plan: Plan) -> list[str]:
    """A markdown table per model: each server's throughput, P50/P99 and its throughput as a
    multiple of tidal's on the same transport family and load (Poisson rates are fractions of
    tidal's closed-loop maximum on that family: the same offered rate for every server)."""
    lines = []
    columns = [("tidal", "http-json"), ("tidal", "http-binary"), ("kserve", "http-json")]
    columns += [("mlserver", "http-json"), ("tidal", "grpc"), ("kserve", "grpc")]
    columns += [("mlserver", "grpc")]
    present = [c for c in columns if any((p.server, p.transport) == c for p in points)]
    for model in plan.models:
        mine = [p for p in points if p.model == model]
        rows = list(dict.fromkeys(_row_key(p) for p in mine if p.server == "tidal"))
        cell = {(p.server, p.transport, _row_key(p)): p for p in mine}
        lines.append(f"\n{model}: requests/s (P50 / P99 ms, x tidal on the same transport)")
        lines.append("| load | " + " | ".join(f"{s} {t}" for s, t in present) + " |")
        lines.append("|---" * (len(present) + 1) + "|")
        for row in rows:
            cells = []
            for server, transport in present:
                point = cell.get((server, transport, row))
                if point is None:
                    cells.append("")
                    continue
                base = cell.get(("tidal", "grpc" if transport == "grpc" else "http-json", row))
                notes = [f"{point.p50_ms:.1f} / {point.p99_ms:.1f}"]
                if base is not None and server != "tidal" and base.throughput:
                    notes.append(f"{point.throughput / base.throughput:.2f}x")
                if point.dropped:
                    notes.append(f"{point.dropped} dropped")
                if point.errors:
                    notes.append(f"{point.errors} errors")
                cells.append(f"{point.throughput:.0f} ({', '.join(notes)})")
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def summarize(points: list[Point], plan: Plan) -> list[str]:
    """The goal lines: saturation ratios at equal concurrency, P99 there, batch-1 overhead."""
    lines = []
    top = f"closed {max(plan.concurrencies)}"
    for model in plan.models:
        lines.append(f"{model} (saturation = {top} clients):")
        for family, transport in (("http", "http-json"), ("grpc", "grpc")):
            ours = _find(points, "tidal", transport, model, top)
            if ours is None:
                continue
            others = [
                (s, b)
                for s in ("kserve", "mlserver")
                if (b := _find(points, s, transport, model, top)) is not None
            ]
            parts = [f"tidal {ours.throughput:.0f}/s P99 {ours.p99_ms:.1f} ms"]
            parts += [f"{s} {b.throughput:.0f}/s P99 {b.p99_ms:.1f} ms" for s, b in others]
            lines.append(f"  {family}: " + "; ".join(parts))
            if others:
                rival, best = max(others, key=lambda sb: sb[1].throughput)
                ratio = ours.throughput / best.throughput
                p99_ok = ours.p99_ms <= best.p99_ms
                met = ratio >= 1.5 and p99_ok
                lines.append(
                    f"    tidal / best other ({rival}): {ratio:.2f}x at P99 "
                    f"{'<=' if p99_ok else '>'} theirs; goal >= 1.5x at <= P99: "
                    f"{'met' if met else 'NOT met'}"
                )
        direct = _find(points, "direct", "in-process", model, f"batch {MAX_BATCH}")
        direct1 = _find(points, "direct", "in-process", model, "batch 1")
        fastest = max(
            (
                p for t in ("http-json", "http-binary", "grpc")
                if (p := _find(points, "tidal", t, model, top)) is not None
            ),
            key=lambda p: p.throughput,
            default=None,
        )  # fmt: skip
        if direct and fastest:
            lines.append(
                f"  tidal at saturation ({fastest.transport}) / direct batch {MAX_BATCH}: "
                f"{fastest.throughput / direct.throughput:.1%}"
                + ("  (goal >= 90 %)" if model == "heavy" else "")
            )
        if direct1:
            for transport, goal in (("http-json", 1.0), ("http-binary", 1.0), ("grpc", 0.5)):
                one = _find(points, "tidal", transport, model, "closed 1")
                if one is not None:
                    overhead = one.p50_ms - direct1.p50_ms
                    lines.append(
                        f"  batch-1 P50 overhead over direct, {transport}: {overhead:.3f} ms "
                        f"(goal <= {goal} ms: {'met' if overhead <= goal else 'NOT met'})"
                    )
    return lines + table(points, plan)


def setup_venvs(args: argparse.Namespace) -> None:
    uv = ROOT / ".venv" / "bin" / "uv"
    for name, packages in (
        ("kserve", ["kserve==0.21.0"]),
        ("mlserver", ["mlserver==1.7.1"]),
    ):
        python = Path(getattr(args, f"{name}_python"))
        venv = python.parent.parent
        if not python.exists():
            subprocess.run(
                [str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True
            )
        subprocess.run(
            [str(uv), "pip", "install", "-q", "--python", str(python), *packages,
             "onnxruntime", "numpy"],
            check=True,
        )  # fmt: skip


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, 1 s each (< 2 min)")
    parser.add_argument("--smoke", action="store_true", help="tidal only, light model (~15 s)")
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=None, help="per point")
    parser.add_argument("--models", help="comma-separated subset of light,heavy,batch")
    parser.add_argument("--json", help="write every point here")
    parser.add_argument("--setup", action="store_true", help="create the servers' virtualenvs")
    parser.add_argument("--kserve-python", default=str(ROOT / "bench/.venv-kserve/bin/python"))
    parser.add_argument("--mlserver-python", default=str(ROOT / "bench/.venv-mlserver/bin/python"))
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.seconds or args.models:
        chosen = tuple(args.models.split(",")) if args.models else plan.models
        seconds = args.seconds or plan.seconds
        plan = Plan(seconds, plan.concurrencies, plan.rate_fractions, chosen)
    servers = ["tidal"] if args.smoke else [s for s in args.servers.split(",") if s]
    if servers[0] != "tidal":
        parser.error("tidal must come first: the Poisson rates are fractions of its saturation")
    if args.setup:
        setup_venvs(args)
    cpus = os.sched_getaffinity(0)
    if {int(SERVER_CPU), CLIENT_CPU} - cpus:
        raise SystemExit(f"needs CPUs {SERVER_CPU} and {CLIENT_CPU}; this process has {cpus}")
    os.sched_setaffinity(0, {CLIENT_CPU})
    workdir = Path(tempfile.mkdtemp(prefix="tidal-servers-bench-"))
    models = make_models(workdir)
    started = time.monotonic()
    print(
        f"ONNX Runtime {ort.__version__} (1 intra-op thread everywhere); {os.cpu_count()} cores: "
        f"servers on CPU {SERVER_CPU} (taskset), load generator on CPU {CLIENT_CPU}; "
        f"{plan.seconds:g} s per point; load average {load_average()}",
        flush=True,
    )
    points: list[Point] = []
    print("direct ONNX Runtime, in-process on CPU 0 (no server running):")
    for model in plan.models:
        for batch in (1, MAX_BATCH):
            point = measure_direct(models[model], batch, plan.seconds)
            point.model = model
            points.append(point)
            print_point(point)
    rates: dict[tuple[str, str], float] = {}
    for name in servers:
        print(f"{name}:", flush=True)
        server = start_server(name, {m: models[m] for m in plan.models}, workdir, args)
        try:
            points += asyncio.run(run_server(server, models, plan, rates))
        finally:
            server.stop()
    print("summary:")
    for line in summarize(points, plan):
        print(line)
    print(f"load average {load_average()}; {time.monotonic() - started:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
