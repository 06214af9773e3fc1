"""``python -m tidal.gateway`` as a process: configuration errors, serving, SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from gatewaytest import INFER_BODY, free_port, http, wait_for


def gateway_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidal.gateway", *args]


def test_an_invalid_configuration_exits_2_naming_the_field() -> None:
    env = {**os.environ, "TIDAL_GATEWAY_CONFIG_JSON": json.dumps({"maxLoadsTotal": 0})}
    done = subprocess.run(
        gateway_command("--check-config"), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "maxLoadsTotal: Input should be greater than 0" in done.stderr
    env["TIDAL_GATEWAY_CONFIG_JSON"] = json.dumps({"holdTimeout": 3})
    done = subprocess.run(
        gateway_command("--check-config"), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "holdTimeout: Extra inputs are not permitted" in done.stderr
    done = subprocess.run(
        gateway_command("--check-config", "--replica", "ftp://x"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "invalid --replica" in done.stderr
    done = subprocess.run(
        gateway_command("--check-config", "--grpc-port", "70000"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--grpc-port" in done.stderr, done.stderr


def test_the_gateway_process_serves_and_drains_on_sigterm(runtimes, runtime_config) -> None:
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",))))
    port, grpc_port = free_port(), free_port()
    config = {"shutdownDrainSeconds": 1.5, "replicaGrpcPort": a.grpc_port}
    env = {
        **os.environ,
        "TIDAL_HOST": "127.0.0.1",
        "TIDAL_PORT": str(port),
        "TIDAL_GRPC_PORT": str(grpc_port),
        "TIDAL_GATEWAY_CONFIG_JSON": json.dumps(config),
    }
    process = subprocess.Popen(gateway_command("--replica", a.url), env=env)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return http("GET", f"{url}/v2/health/ready")[0] == 200
            except OSError:
                return False

        wait_for(ready, 30, "gateway ready")
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        tensor = triton.InferInput("input", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        assert client.infer("m0", [tensor]).as_numpy("output").shape == (1, 4)
        # tritonclient's gRPC client, unmodified, through the gateway's gRPC port.
        grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        grpc_tensor = triton_grpc.InferInput("input", [1, 16], "FP32")
        grpc_tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        assert grpc_client.is_server_ready()
        assert grpc_client.infer("m0", [grpc_tensor]).as_numpy("output").shape == (1, 4)
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        wait_for(lambda: http("GET", f"{url}/v2/health/ready")[0] == 503, 5, "not ready")
        assert client.infer("m0", [tensor]).as_numpy("output").shape == (1, 4)  # still serving
        assert process.wait(20) == 0
        assert time.monotonic() - stopped >= 1.4
    finally:
        if process.poll() is None:
            process.kill()


GRACE_S = 30  # the pod's terminationGracePeriodSeconds the operator sets on the activator


def _activator_process(drain_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {
        "activator": True,
        "models": ["m0"],
        "holdTimeoutSeconds": 120,
        "shutdownDrainSeconds": drain_s,
    }
    env = {
        **os.environ,
        "TIDAL_HOST": "127.0.0.1",
        "TIDAL_PORT": str(port),
        "TIDAL_GATEWAY_CONFIG_JSON": json.dumps(config),
    }
    process = subprocess.Popen(gateway_command(), env=env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, f"the gateway exited with {process.returncode}"
        try:
            return http("GET", f"{url}/v2/health/ready")[0] == 200
        except OSError:
            return False

    wait_for(ready, 30, "activator ready")
    return process, url


def _hold(url: str, count: int) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        started = time.monotonic()
        answer = http("POST", f"{url}/v2/models/m0/infer", INFER_BODY)
        results[i] = (*answer, time.monotonic() - started)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    wait_for(lambda: http("GET", f"{url}/v2/tidal/held")[2]["held"] == count, 30, "all held")
    return threads, results


def test_sigterm_answers_every_held_request_within_the_grace_period(
    runtimes, runtime_config
) -> None:
    """A rolling update of the activator: held requests are answered within the pod's grace
    period (the hold is 120 s): 503 with Retry-After when no replica came, forwarded when one
    comes during the drain; the process then exits 0."""
    count = 10
    process, url = _activator_process(drain_s=2)
    try:
        threads, results = _hold(url, count)
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        for thread in threads:
            thread.join(GRACE_S)
        answered_s = time.monotonic() - stopped
        assert all(r is not None for r in results), f"unanswered {GRACE_S} s after SIGTERM"
        for status, headers, body, _ in results:
            assert status == 503 and "shutting down" in body["error"], (status, body)
            assert 1 <= int(headers["Retry-After"]) <= 30, headers
        assert process.wait(GRACE_S) == 0
        exited_s = time.monotonic() - stopped
        assert answered_s < GRACE_S and exited_s < GRACE_S, (answered_s, exited_s)
    finally:
        if process.poll() is None:
            process.kill()
    # A replica pushed during the drain takes every held request.
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    process, url = _activator_process(drain_s=20)
    try:
        threads, results = _hold(url, count)
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        wait_for(lambda: http("GET", f"{url}/v2/health/ready")[0] == 503, 10, "draining")
        replicas = {"replicas": [a.ref.model_dump()]}
        status, _, body = http("PUT", f"{url}/v2/tidal/replicas", replicas)
        assert status == 200, body
        for thread in threads:
            thread.join(GRACE_S)
        assert [r[0] if r else None for r in results] == [200] * count, results
        assert a.answered("m0") == count  # each once
        assert process.wait(GRACE_S) == 0
        assert time.monotonic() - stopped < GRACE_S
    finally:
        if process.poll() is None:
            process.kill()
