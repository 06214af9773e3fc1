"""The operator, the runtime and the gateway agree on what tidal.common.contract holds: how a
byte quantity reads, the default engine budget, the environment and ports of a runtime pod and
of a gateway pod, the memory keys of the runtime's configuration, the runtime's metric names the
operator reads and the runtime's /v2/tidal endpoints."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from tidal.common import contract
from tidal.gateway.config import GatewaySettings
from tidal.operator.core import api
from tidal.operator.core.resources import (
    Observed,
    desired_objects,
    engine_budget_bytes,
    pools_of,
    render_runtime_config,
)
from tidal.operator.core.signals import pool_signals_query
from tidal.operator.shell import podmetrics
from tidal.runtime.config import MemorySpec, RuntimeConfig, RuntimeSettings, load_config
from tidal.runtime.core.quantity import parse_bytes
from tidal.runtime.metrics import DEFINITIONS
from tidal.runtime.server import RuntimeServer

# Byte quantities: what both sides accept (with the bytes) and what both refuse.
QUANTITIES: list[tuple[str, int | None]] = [
    ("0", 0),
    ("4096", 4096),
    ("512Mi", 512 * 2**20),
    ("8Gi", 8 * 2**30),
    ("1G", 10**9),
    ("1.5G", 1_500_000_000),
    ("1.5Gi", 3 * 2**29),
    ("2k", 2000),
    ("1Pi", 2**50),
    ("7Ei", 7 * 2**60),
    ("9Ei", None),  # not below 2^63
    ("1.0001k", None),  # a fraction of a byte
    ("1.5", None),
    ("1500m", None),
    ("20GiB", None),
    (" 20Gi", None),
    ("20 Gi", None),
    ("-1", None),
    ("20Xi", None),
    ("Gi", None),
    ("", None),
]


def _operator_bytes(text: str) -> int | None:
    """What the operator's byte fields make of ``text`` (None: refused)."""
    try:
        TypeAdapter(api.ByteQuantity).validate_python(text)
    except ValidationError:
        return None
    return api.quantity_bytes(text)


def _runtime_bytes(text: str) -> int | None:
    """What the runtime's configuration makes of ``text`` (None: refused)."""
    try:
        return parse_bytes(text)
    except ValueError:
        return None


def _service(spec: dict[str, Any]) -> api.InferenceService:
    """A one-model InferenceService with ``spec`` added."""
    return api.parse_inference_service(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "svc", "namespace": "ns"},
            "spec": {
                "models": [{"name": "m", "engines": [{"uri": "file:///m/model.onnx"}]}],
                **spec,
            },
        }
    )


def test_operator_and_runtime_agree_on_the_contract() -> None:
    # One reading of a byte quantity, on both sides.
    for text, expected in QUANTITIES:
        assert _operator_bytes(text) == expected, text
        assert _runtime_bytes(text) == expected, text
        if expected is not None:
            assert contract.parse_byte_quantity(text) == expected
        else:
            with pytest.raises(ValueError):
                contract.parse_byte_quantity(text)

    # One default engine budget: the runtime's, and what the operator plans with.
    assert contract.DEFAULT_ENGINE_CACHE_BUDGET_BYTES == 8 * 2**30
    assert MemorySpec().engine_cache_budget_bytes == contract.DEFAULT_ENGINE_CACHE_BUDGET_BYTES
    assert engine_budget_bytes(api.Memory()) == contract.DEFAULT_ENGINE_CACHE_BUDGET_BYTES

    # The runtime reads the configuration and memory budgets the operator writes, byte for byte.
    isvc = _service({"memory": {"engineCacheBudget": "1.5Gi", "reserve": "512Mi"}})
    written = render_runtime_config(pools_of(isvc)[0])
    config = load_config(env={contract.ENV_RUNTIME_CONFIG_JSON: json.dumps(written)})
    assert config.memory.engine_cache_budget_bytes == 3 * 2**29
    assert config.memory.reserve_bytes == 512 * 2**20

    # The environment the operator gives a runtime pod: the contract's names, none settable by
    # users, and the ports the runtime listens on by default.
    (deployment,) = [
        o
        for o in desired_objects(isvc, Observed())
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-primary")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, Any] = {e["name"]: e for e in container["env"]}
    assert set(env) == set(contract.RUNTIME_ENV_NAMES)
    assert api.RESERVED_ENV_NAMES == contract.RUNTIME_ENV_NAMES
    assert env[contract.ENV_PORT]["value"] == str(contract.RUNTIME_HTTP_PORT)
    assert env[contract.ENV_GRPC_PORT]["value"] == str(contract.RUNTIME_GRPC_PORT)
    ports = {p["containerPort"] for p in container["ports"]}
    assert {contract.RUNTIME_HTTP_PORT, contract.RUNTIME_GRPC_PORT} <= ports


def test_the_processes_read_the_contracts_environment() -> None:
    # What the settings loader reads for each process: the contract's names, nothing else.
    assert RuntimeSettings.environment_names() == {
        contract.ENV_HOST,
        contract.ENV_PORT,
        contract.ENV_GRPC_PORT,
        contract.ENV_LOG_LEVEL,
    }
    assert RuntimeSettings.environment_names() < set(contract.RUNTIME_ENV_NAMES)
    assert GatewaySettings.environment_names() | {
        contract.ENV_GATEWAY_CONFIG_JSON,
        contract.ENV_POD_NAME,  # the gateway's name in its answers and metrics
    } == set(contract.GATEWAY_ENV_NAMES)
    # The gateway pod the operator writes sets only variables the gateway reads.
    isvc = _service({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}})
    (gateway,) = [
        o
        for o in desired_objects(isvc, Observed())
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-gateway")
    ]
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    assert names <= set(contract.GATEWAY_ENV_NAMES), names
    assert contract.ENV_GATEWAY_CONFIG_JSON in names, names


def _base_name(sample: str) -> str:
    """A series name less the suffix Prometheus gives a counter's or a histogram's samples."""
    return re.sub(r"_(total|sum|count|bucket)$", "", sample)


def test_the_operator_reads_the_metrics_the_runtime_registers() -> None:
    registered = {name for _, _, name, _, _, _ in DEFINITIONS}
    assert set(contract.RUNTIME_METRIC_NAMES) <= registered
    assert len(set(contract.RUNTIME_METRIC_NAMES)) == len(contract.RUNTIME_METRIC_NAMES)
    # Every runtime series the operator's PromQL and its pod scrape read is a contract name.
    queried = {_base_name(n) for n in re.findall(r"tidal_[a-z_]+", pool_signals_query())}
    scraped = {_base_name(n) for n in podmetrics._WANTED_FAMILIES}
    for side, names in (("PromQL", queried), ("pod scrape", scraped)):
        assert len(names) >= 8 and names <= set(contract.RUNTIME_METRIC_NAMES), (side, names)


def test_the_runtime_serves_the_contracts_endpoints() -> None:
    server = RuntimeServer(RuntimeConfig())
    routes = {
        (route.method, route.resource.canonical)
        for route in server.build_app().router.routes()
        if route.resource is not None
    }
    for method, path in (
        ("GET", contract.PATH_MODELS),
        ("GET", contract.PATH_ACTIVITY),
        ("PUT", contract.PATH_PLACEMENT),
        ("GET", contract.PATH_TIER),
        ("PUT", contract.PATH_TIER),
    ):
        assert (method, path) in routes, (method, path, sorted(routes))
    assert len(set(contract.TIDAL_PATHS)) == 6
