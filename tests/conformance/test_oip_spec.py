"""API fuzzing against the Open Inference Protocol's own OpenAPI document (issue 22, section 5).

schemathesis generates requests from ``open_inference_rest.yaml`` (vendored verbatim; see
README.md here for its source, licence and the small patch applied below) — valid ones and
invalid ones, for every operation — and sends them to a real ``tidal-runtime`` process and to a
real ``tidal-gateway`` process in front of it. Every answer must be below 500; an answer the
document describes must have its content type and match its schema; an invalid request must be
refused with a 4xx. The run is bounded and deterministic: a fixed number of examples per
operation and mode, derandomized (the same requests every run), no example database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
)

SPEC = Path(__file__).with_name("open_inference_rest.yaml")
MODEL = "mlp"
EXAMPLES = int(os.environ.get("TIDAL_OIP_EXAMPLES", "25"))  # per operation and mode
POSITIVE_CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
NEGATIVE_CHECKS = [not_a_server_error, negative_data_rejection]
VALID_INFER = {
    "id": "conformance",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 16], "data": [0.5] * 32}],
    "outputs": [{"name": "output"}],
}


def patched_spec() -> dict[str, Any]:
    """The upstream document with its defects mended (README.md lists them), nothing else."""
    text = SPEC.read_text()
    text = text.replace("${MODEL_NAME}", "{MODEL_NAME}").replace(
        "${MODEL_VERSION}", "{MODEL_VERSION}"
    )
    spec: dict[str, Any] = yaml.safe_load(text)
    paths = spec["paths"]
    paths["/v2"] = paths.pop("/v2/")
    for item in paths.values():
        for parameter in item.get("parameters", []):
            if parameter["name"] == "MODEL_NAME":
                parameter["schema"] = {"type": "string", "enum": [MODEL, "no-such-model"]}
            elif parameter["name"] == "MODEL_VERSION":
                parameter["schema"] = {"type": "string", "enum": ["1", "7"]}
    return spec


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"{what} exited with {process.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{what} not ready within 60 s"
        time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A runtime process serving one model, with gRPC on as pods run it (its HTTP errors
    were plain text only then), and a gateway process in front of it."""
    from tidal.runtime.modelgen import write_mlp

    info = write_mlp(tmp_path_factory.mktemp("oip") / "mlp.onnx", 16, 32, 4, seed=1)
    runtime_port, gateway_port = free_port(), free_port()
    config = {
        "shutdownDrainSeconds": 0,
        "models": [{"name": MODEL, "engines": [{"uri": info.uri, "sha256": info.sha256}]}],
    }
    env = {**os.environ, "TIDAL_LOG_LEVEL": "WARNING", "TIDAL_GRPC_PORT": "0"}
    runtime = subprocess.Popen(
        [sys.executable, "-m", "tidal.runtime", "--host", "127.0.0.1"],
        env={
            **env,
            "TIDAL_RUNTIME_CONFIG_JSON": json.dumps(config),
            "TIDAL_PORT": str(runtime_port),
            "TIDAL_GRPC_PORT": str(free_port()),
        },
    )
    urls = {"runtime": f"http://127.0.0.1:{runtime_port}"}
    processes = [runtime]
    try:
        wait_ready(urls["runtime"], runtime, "tidal-runtime")
        command = [sys.executable, "-m", "tidal.gateway", "--host", "127.0.0.1"]
        gateway = subprocess.Popen(
            [*command, "--port", str(gateway_port), "--replica", urls["runtime"]],
            env={**env, "TIDAL_GATEWAY_CONFIG_JSON": json.dumps({"shutdownDrainSeconds": 0})},
        )
        processes.append(gateway)
        urls["gateway"] = f"http://127.0.0.1:{gateway_port}"
        wait_ready(urls["gateway"], gateway, "tidal-gateway")
        yield urls
    finally:
        for process in reversed(processes):
            stop(process)


def fuzz_operation(
    operation: Any, base_url: str, mode: Any, checks: list[Any], seen: Counter[str]
) -> None:
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure shows its own case
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=30)
        seen[f"{mode.value} {operation.method.upper()} {response.status_code}"] += 1
        case.validate_response(response, checks=checks)

    run()


@pytest.mark.parametrize("target", ["runtime", "gateway"])
def test_the_upstream_spec_finds_no_5xx_and_no_nonconforming_answer(
    servers: dict[str, str], target: str
) -> None:
    base_url = servers[target]
    schema = schemathesis.openapi.from_dict(patched_spec())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 6, [o.label for o in operations]  # the spec's six operations
    started = time.monotonic()
    seen: Counter[str] = Counter()
    for operation in operations:
        fuzz_operation(operation, base_url, GenerationMode.POSITIVE, POSITIVE_CHECKS, seen)
        if operation.method.upper() == "POST":  # only the infer body can be made invalid
            fuzz_operation(operation, base_url, GenerationMode.NEGATIVE, NEGATIVE_CHECKS, seen)
    # The run reached answers of every kind: served, refused as invalid, unknown model.
    assert {"positive GET 200", "positive POST 400", "negative POST 400"} <= set(seen), seen
    assert any(key.endswith(" 404") for key in seen), seen
    # A request the spec calls valid and the model can run: 200, checked against the schema.
    infer = next(o for o in operations if o.path.endswith("/infer"))
    case = infer.Case(path_parameters={"MODEL_NAME": MODEL, "MODEL_VERSION": "1"}, body=VALID_INFER)
    response = case.call(base_url=base_url, timeout=30)
    assert response.status_code == 200, response.text
    case.validate_response(response, checks=POSITIVE_CHECKS)
    assert [o["name"] for o in response.json()["outputs"]] == ["output"]
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"{target}: {elapsed:.1f} s"
    print(f"OIP spec fuzzing of the {target}: {sum(seen.values())} requests in {elapsed:.1f} s")
    print(dict(sorted(seen.items())))
