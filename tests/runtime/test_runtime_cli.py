"""The process as a pod runs it: ``python -m tidal.runtime`` configured from the environment."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import numpy as np
import tritonclient.http as triton


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def test_serves_on_tidal_host_and_port_and_stops_on_sigterm(models: dict[str, Any]) -> None:
    host = "127.0.0.57"  # each sandbox pod has its own loopback address
    port = free_port(host)
    config = {"models": [{"name": "mlp", "engines": [{"uri": models["mlp"].uri}]}]}
    env = {
        **os.environ,
        "TIDAL_HOST": host,
        "TIDAL_PORT": str(port),
        "TIDAL_RUNTIME_CONFIG_JSON": json.dumps(config),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tidal.runtime"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # Closed here, in the test's own thread: left to the garbage collector, its gevent pool
    # was closed in whatever thread collected it, with no hub there (an unraisable exception
    # in CI's warnings summary).
    client = triton.InferenceServerClient(f"{host}:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass
            assert process.poll() is None, process.stdout and process.stdout.read()
            assert time.monotonic() < deadline, "runtime did not become ready"
            time.sleep(0.1)
        x = np.ones((2, 16), np.float32)
        tensor = triton.InferInput("input", [2, 16], "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("mlp", [tensor]).as_numpy("output").shape == (2, 4)
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            assert b"tidal_queue_depth" in response.read()
    finally:
        client.close()
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
    assert code == 0


def test_tensorrt_backend_without_tensorrt_exits_2_with_the_reason() -> None:
    config = {"backend": "tensorrt", "models": []}
    env = {**os.environ, "TIDAL_RUNTIME_CONFIG_JSON": json.dumps(config)}
    result = subprocess.run(
        [sys.executable, "-m", "tidal.runtime"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "tensorrt" in result.stderr.lower()


def test_modelgen_cli_prints_the_sha256(tmp_path: Any) -> None:
    out = tmp_path / "m.onnx"
    result = subprocess.run(
        [sys.executable, "-m", "tidal.runtime.modelgen", "mlp", str(out), "--hidden", "8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import hashlib

    digest, size, _path = result.stdout.split()
    assert digest == hashlib.sha256(out.read_bytes()).hexdigest()
    assert int(size) == out.stat().st_size


def test_sigterm_drains_not_ready_but_still_serving_then_exits(models: dict[str, Any]) -> None:
    host = "127.0.0.58"
    port = free_port(host)
    config = {
        "models": [{"name": "mlp", "engines": [{"uri": models["mlp"].uri}]}],
        "shutdownDrainSeconds": 2,
    }
    env = {
        **os.environ,
        "TIDAL_HOST": host,
        "TIDAL_PORT": str(port),
        "TIDAL_RUNTIME_CONFIG_JSON": json.dumps(config),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "tidal.runtime"], env=env, stdout=subprocess.DEVNULL
    )
    # Closed here, in the test's own thread: left to the garbage collector, its gevent pool
    # was closed in whatever thread collected it, with no hub there (an unraisable exception
    # in CI's warnings summary).
    client = triton.InferenceServerClient(f"{host}:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                if client.is_server_ready():
                    break
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        deadline = stopped + 5
        while client.is_server_ready():  # readiness fails at once…
            assert time.monotonic() < deadline
            time.sleep(0.05)
        tensor = triton.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        # …while requests are still answered during the drain window
        assert client.infer("mlp", [tensor]).as_numpy("output").shape == (1, 4)
        code = process.wait(30)
        assert code == 0
        assert time.monotonic() - stopped >= 1.5
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
