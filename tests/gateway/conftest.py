"""Fixtures for gateway tests: generated models, runtime processes, a served gateway."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gatewaytest import RuntimeProcess, ServedGateway, wait_for

from tidal.gateway.config import ReplicaRef


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four small MLPs (16 inputs, 4 outputs) with different weights: m0..m3."""
    from tidal.runtime.modelgen import write_mlp

    root: Path = tmp_path_factory.mktemp("gateway-models")
    return {
        f"m{i}": write_mlp(root / f"m{i}.onnx", inputs=16, hidden=64, outputs=4, seed=10 + i)
        for i in range(4)
    }


@pytest.fixture
def runtime_config(model_files: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """A runtime configuration serving ``models`` (all of m0..m3 by default)."""

    def make(
        preload: tuple[str, ...] = (),
        models: tuple[str, ...] = ("m0", "m1", "m2", "m3"),
        **extra: Any,
    ) -> dict[str, Any]:
        entries = [
            {
                "name": name,
                "engines": [{"uri": model_files[name].uri, "sha256": model_files[name].sha256}],
                "maxBatchSize": 8,
                "preload": name in preload,
                "warmup": {"batchSizes": [1], "iterations": 1},
            }
            for name in models
        ]
        return {"models": entries, **extra}

    return make


@pytest.fixture
def runtimes() -> Iterator[Callable[..., list[RuntimeProcess]]]:
    """Start runtime processes (in parallel) and wait until each is ready."""
    started: list[RuntimeProcess] = []

    def start(*specs: tuple[str, dict[str, Any]]) -> list[RuntimeProcess]:
        batch = [RuntimeProcess(name, config) for name, config in specs]
        started.extend(batch)
        for runtime in batch:
            runtime.wait_ready()
        return batch

    yield start
    for runtime in started:
        runtime.stop()


@pytest.fixture
def gateway() -> Iterator[Callable[..., ServedGateway]]:
    started: list[ServedGateway] = []

    def start(
        replicas: list[RuntimeProcess] | list[ReplicaRef] = (),  # type: ignore[assignment]
        wait: bool = True,
        grpc: bool = False,
        **config: Any,
    ) -> ServedGateway:
        refs = [r.ref if isinstance(r, RuntimeProcess) else r for r in replicas]
        served = ServedGateway(config, refs, grpc=grpc)
        started.append(served)
        if wait and refs:
            wait_for(
                lambda: len([r for r in served.replicas().values() if r["healthy"]]) == len(refs),
                what="every replica healthy in the gateway",
            )
        return served

    yield start
    for served in started:
        served.stop()
