"""Runtime benchmark: the runtime over HTTP against the same ONNX Runtime session in-process.

Measures, in one run and on one generated MLP (same file, same session options: one intra-op
thread, so the direct baseline and the runtime's backend get the same compute):

* batch-1 latency, one client at a time: P50/P99 of the runtime (dynamic batching on with
  ``maxQueueDelayMs: 0``, and off) against ``session.run`` on one row;
* saturation: many concurrent clients sending one row each, dynamic batching on and off,
  against ``session.run`` on full batches (the direct batched throughput).

Prints the ratios and whether the issue's goals are met (throughput with batching >= 90 % of the
direct batched throughput; HTTP + batching overhead at batch 1 <= 1 ms at P50).  The runtime
runs as its own process (``python -m tidal.runtime``) on a loopback port; the load generator is
this process (aiohttp, binary tensors).  Bounded: about a minute on 2 cores.

    .venv/bin/python bench/runtime_bench.py [--seconds 5] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import onnxruntime as ort

from tidal.runtime.modelgen import ModelInfo, write_mlp

INPUTS, LAYERS, OUTPUTS = 256, 3, 16
MAX_BATCH = 32
# Hidden widths of the models: "tiny" computes next to nothing, so its runtime latency is the
# HTTP + batching overhead alone; "light" costs ~0.1 ms of CPU per row when batched (less than
# one HTTP request costs a Python server here); "heavy" ~0.5 ms per row (nearer a real model,
# where compute per row dominates the per-request overhead).
MODELS = {"tiny": 8, "light": 1536, "heavy": 3072}


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q)) if samples else float("nan")


def direct_session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure_direct(path: Path, batch: int, seconds: float) -> tuple[float, list[float]]:
    """(rows per second, per-call latencies) of session.run on ``batch`` rows."""
    session = direct_session(path)
    x = np.random.default_rng(0).standard_normal((batch, INPUTS)).astype(np.float32)
    for _ in range(5):
        session.run(None, {"input": x})
    latencies: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        session.run(None, {"input": x})
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return len(latencies) * batch / elapsed, latencies


def request_body() -> tuple[bytes, dict[str, str]]:
    x = np.random.default_rng(1).standard_normal((1, INPUTS)).astype(np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, INPUTS],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + x.tobytes(), headers


async def load(url: str, clients: int, seconds: float) -> tuple[float, list[float], int]:
    """(requests per second, latencies, errors) with ``clients`` concurrent closed loops."""
    body, headers = request_body()
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm the connections and the server's code paths.
        for _ in range(3):
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
        stop = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                        continue
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, latencies, errors


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_runtime(model: Path, port: int) -> subprocess.Popen[bytes]:
    def entry(name: str, enabled: bool) -> dict[str, object]:
        return {
            "name": name,
            "engines": [{"uri": model.resolve().as_uri()}],
            "maxBatchSize": MAX_BATCH,
            "batching": {"enabled": enabled, "maxQueueDelayMs": 0, "maxQueueSize": 4096},
            "warmup": {"batchSizes": [1, MAX_BATCH], "iterations": 3},
        }

    config = {
        "models": [entry("batched", True), entry("unbatched", False)],
        "onnxruntime": {"intraOpThreads": 1},
        "memory": {"engineCacheBudgetBytes": "1Gi"},
    }
    env = {
        **os.environ,
        "TIDAL_RUNTIME_CONFIG_JSON": json.dumps(config),
        "TIDAL_HOST": "127.0.0.1",
        "TIDAL_PORT": str(port),
        "TIDAL_LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen([sys.executable, "-m", "tidal.runtime"], env=env)
    deadline = time.monotonic() + 60
    import urllib.request

    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("runtime did not become ready")


def row(name: str, rate: float, latencies: list[float], unit: str = "rows/s") -> None:
    p50 = percentile(latencies, 50) * 1000
    p99 = percentile(latencies, 99) * 1000
    print(f"  {name:<44} {rate:>9.0f} {unit:<7} P50 {p50:7.3f} ms  P99 {p99:7.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tidal-bench-"))
    print(
        f"ONNX Runtime {ort.__version__}, 1 intra-op thread; {os.cpu_count()} cores; "
        f"{args.clients} clients at saturation, {args.seconds:g} s per measurement"
    )
    names = list(MODELS) if args.model == "all" else [args.model]
    for name in names:
        info = write_mlp(
            workdir / f"{name}.onnx",
            inputs=INPUTS,
            hidden=MODELS[name],
            outputs=OUTPUTS,
            layers=LAYERS,
            seed=0,
        )
        print(
            f"\n== {name} model: MLP {INPUTS}-{MODELS[name]}x{LAYERS}-{OUTPUTS}, "
            f"{info.size_bytes / 1e6:.1f} MB"
        )
        run_model(info, args.seconds, args.clients)
    return 0


def run_model(info: ModelInfo, seconds: float, clients: int) -> None:
    args = argparse.Namespace(seconds=seconds, clients=clients)
    # Other processes share this machine: the direct baseline is measured before and after the
    # runtime, and the better of the two is used, so load drifting over time cannot favour the
    # runtime.
    print("direct (in-process session.run), before the runtime:")
    direct1_rate, direct1 = measure_direct(info.path, 1, args.seconds / 2)
    row("batch 1", direct1_rate, direct1)
    directb_rate, directb = measure_direct(info.path, MAX_BATCH, args.seconds / 2)
    row(f"batch {MAX_BATCH}", directb_rate, directb)

    port = free_port()
    runtime = start_runtime(info.path, port)
    try:
        base = f"http://127.0.0.1:{port}/v2/models"
        print("runtime over HTTP (binary tensors, one row per request):")
        lat_on_rate, lat_on, e1 = asyncio.run(load(f"{base}/batched/infer", 1, args.seconds))
        row("1 client, batching on (delay 0)", lat_on_rate, lat_on, "req/s")
        lat_off_rate, lat_off, e2 = asyncio.run(load(f"{base}/unbatched/infer", 1, args.seconds))
        row("1 client, batching off", lat_off_rate, lat_off, "req/s")
        sat_on_rate, sat_on, e3 = asyncio.run(
            load(f"{base}/batched/infer", args.clients, args.seconds)
        )
        row(f"{args.clients} clients, batching on", sat_on_rate, sat_on)
        sat_off_rate, sat_off, e4 = asyncio.run(
            load(f"{base}/unbatched/infer", args.clients, args.seconds)
        )
        row(f"{args.clients} clients, batching off", sat_off_rate, sat_off)
    finally:
        runtime.send_signal(signal.SIGTERM)
        runtime.wait(30)
    print("direct (in-process session.run), after the runtime:")
    after1_rate, after1 = measure_direct(info.path, 1, args.seconds / 2)
    row("batch 1", after1_rate, after1)
    afterb_rate, afterb = measure_direct(info.path, MAX_BATCH, args.seconds / 2)
    row(f"batch {MAX_BATCH}", afterb_rate, afterb)
    if percentile(after1, 50) < percentile(direct1, 50):
        direct1 = after1
    directb_rate = max(directb_rate, afterb_rate)
    errors = e1 + e2 + e3 + e4
    overhead_on = (percentile(lat_on, 50) - percentile(direct1, 50)) * 1000
    overhead_off = (percentile(lat_off, 50) - percentile(direct1, 50)) * 1000
    ratio_on = sat_on_rate / directb_rate
    ratio_off = sat_off_rate / directb_rate
    print("ratios:")
    print(
        f"  saturation, batching on  / direct batch {MAX_BATCH}: {ratio_on:6.1%}  (goal >= 90%: "
        f"{'met' if ratio_on >= 0.9 else 'NOT met'})"
    )
    print(f"  saturation, batching off / direct batch {MAX_BATCH}: {ratio_off:6.1%}")
    print(f"  saturation, batching on / batching off: {sat_on_rate / sat_off_rate:5.2f}x")
    print(
        f"  batch-1 P50 overhead, batching on (delay 0): {overhead_on:6.3f} ms  (goal <= 1 ms: "
        f"{'met' if overhead_on <= 1.0 else 'NOT met'})"
    )
    print(f"  batch-1 P50 overhead, batching off:          {overhead_off:6.3f} ms")
    print(
        f"  batch-1 P50 runtime / direct: {percentile(lat_on, 50) / percentile(direct1, 50):5.2f}x"
    )
    print(f"  failed requests: {errors}")


if __name__ == "__main__":
    sys.exit(main())
