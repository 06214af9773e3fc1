"""``python -m tidal.gateway`` as a process: configuration errors, serving, SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from gatewaytest import free_port, http, wait_for


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
