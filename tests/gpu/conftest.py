"""GPU tests: they run only where torch sees a CUDA device (``make gpu-test`` on the device).

Every test module here carries ``pytestmark = [gpu, skipif(<no torch or no CUDA>)]``: without
torch or without a CUDA device each test is reported as skipped with that reason, never as
passed (CI has neither).  The packages come from
``$TIDAL_GPU_PACKAGES`` (a folder that ``bench/gpu_bench.py build`` filled; the device call
builds them once for the tests and the benchmark) or are compiled here on first use.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and torch (make gpu-test)")
    # bench/gpu_device_run.sh's timeout sends SIGUSR1 before it kills: print every stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_bench() -> ModuleType:
    return bench_module("gpu_bench")


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with mlp.path, big.path, the packages they name and <model>.ref.npz."""
    given = os.environ.get("TIDAL_GPU_PACKAGES")
    if given:
        return Path(given)
    folder = tmp_path_factory.mktemp("pt2")
    bench = gpu_bench()
    for model in ("mlp", "big"):
        bench.cmd_build(model, folder)
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that ``bench/torch_build_bench.py sources`` made and the torch builder filled
    (``published/``): ``$TIDAL_TORCH_BUILDS``, or made here (the small model, fp32 and bf16:
    about two minutes of compiling)."""
    given = os.environ.get("TIDAL_TORCH_BUILDS")
    if given:
        return Path(given)
    from tidal.runtime.builder.build import build
    from tidal.runtime.builder.spec import parse_build_spec

    folder = tmp_path_factory.mktemp("torch-builds")
    bench_module("torch_build_bench").cmd_sources(folder, quick=True)
    data = json.loads((folder / "small" / "spec.json").read_text())
    data["precisions"] = ["fp32", "bf16"]
    (folder / "small" / "spec.json").write_text(json.dumps(data))
    build(parse_build_spec(data), folder / "work-small")
    return folder
