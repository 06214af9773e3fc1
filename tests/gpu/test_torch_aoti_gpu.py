"""The torch (AOTInductor) backend on a real CUDA GPU, through the runtime's engine cache."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal.common.clock import CLOCK
from tidal.runtime.backends.torch_aoti import why_no_cuda
from tidal.runtime.config import parse_config
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.errors import EngineLoadError
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.storage import EngineStore, sha256_file

WHY_NO_GPU = why_no_cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NO_GPU is not None, reason=str(WHY_NO_GPU))]
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
# What an eviction may leave behind on the device: torch's per-stream cuBLAS workspaces (tens
# of MiB each), against the 1 GiB of weights that must come back.
SLACK = 128 * MiB


@pytest.fixture(scope="module")
def torch() -> Any:
    import torch

    return torch


@pytest.fixture(scope="module")
def backend() -> Any:
    from tidal.runtime.backends.torch_aoti import TorchAOTIBackend

    return TorchAOTIBackend(0)


def make_cache(backend: Any, models: dict[str, Path], budget: int, max_batch: int) -> EngineCache:
    config = parse_config(
        {
            "models": [
                {
                    "name": name,
                    "engines": [{"uri": str(path), "sha256": sha256_file(path)}],
                    "maxBatchSize": max_batch,
                    "preload": False,
                }
                for name, path in models.items()
            ],
            "memory": {"engineCacheBudgetBytes": budget},
            "maxConcurrentLoads": 1,
        }
    )
    return EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)


async def load(cache: EngineCache, name: str) -> Any:
    engine, _ = await cache.acquire(name)
    cache.release(name)
    return engine


def package(folder: Path, model: str) -> Path:
    return folder / (folder / f"{model}.path").read_text().strip()


def free_bytes(torch: Any) -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def test_engine_output_matches_the_eager_model(backend: Any, packages: Path) -> None:
    cache = make_cache(backend, {"mlp": package(packages, "mlp")}, 8 << 30, 64)
    ref = np.load(packages / "mlp.ref.npz")
    engine = asyncio.run(load(cache, "mlp"))
    out = engine.infer({"x": ref["x"]})["y"]
    assert engine.platform == "pytorch_aoti"
    assert out.shape == ref["y"].shape and out.dtype == ref["y"].dtype
    np.testing.assert_allclose(out.astype(np.float32), ref["y"].astype(np.float32), atol=2e-2)
    cache.close()


def test_each_engine_runs_on_its_own_stream(backend: Any, packages: Path) -> None:
    path = package(packages, "mlp")
    cache = make_cache(backend, {"a": path, "b": path}, 8 << 30, 64)

    async def both() -> tuple[Any, Any]:
        return await load(cache, "a"), await load(cache, "b")

    a, b = asyncio.run(both())
    assert a.stream_handle() != 0 and b.stream_handle() != 0
    assert a.stream_handle() != b.stream_handle()
    cache.close()


def test_load_phases_are_timed_in_the_metric(backend: Any, packages: Path) -> None:
    cache = make_cache(backend, {"mlp": package(packages, "mlp")}, 8 << 30, 64)
    asyncio.run(load(cache, "mlp"))
    phases = {
        s.labels["phase"]
        for f in cache.metrics.registry.collect()
        if f.name == "tidal_engine_load_seconds"
        for s in f.samples
        if s.name.endswith("_count") and s.value > 0
    }
    assert phases == {"fetch", "deserialize", "stage", "h2d", "profile", "graphs", "warmup"}
    cache.close()


def test_graphs_replay_what_the_eager_path_computes(
    backend: Any, packages: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = package(packages, "mlp")
    cache = make_cache(backend, {"graphs": path, "eager": path}, 8 << 30, 64)
    graphs = asyncio.run(load(cache, "graphs"))
    monkeypatch.setenv("TIDAL_TORCH_CUDA_GRAPHS", "0")
    eager = asyncio.run(load(cache, "eager"))
    assert graphs.graph_error is None
    assert graphs.graph_batch_sizes == list(range(1, 65))
    assert eager.graph_batch_sizes == []
    rng = np.random.default_rng(3)
    for rows in (1, 3, 64):
        x = rng.standard_normal((rows, 512)).astype(np.float16)
        np.testing.assert_array_equal(graphs.infer({"x": x})["y"], eager.infer({"x": x})["y"])
    cache.close()


START_SCRIPT = """
import asyncio, json, sys, time
started = time.perf_counter()
from tidal.runtime.backends.torch_aoti import TorchAOTIBackend
from tidal.common.clock import CLOCK
from tidal.runtime.config import parse_config
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.storage import EngineStore
backend = TorchAOTIBackend(0)
config = parse_config({"models": [{"name": "mlp", "engines": [{"uri": sys.argv[1]}],
                                   "maxBatchSize": 64, "preload": False}]})
cache = EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)
asyncio.run(cache.ensure_loaded("mlp"))
print(json.dumps({"loader": backend.package_loader, "seconds": time.perf_counter() - started,
                  "inductor": "torch._inductor" in sys.modules,
                  "overhead": backend.overhead_bytes}))
"""


def test_a_fresh_process_loads_without_torch_inductor_or_isa_probes(packages: Path) -> None:
    """Before issue 34 every process imported torch._inductor (6 s on the H100) and its first
    load ran inductor's CPU-ISA probes (compiler and Python subprocesses, 34 s)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", START_SCRIPT, str(package(packages, "mlp"))],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loader"] == "torch._C._aoti"
    assert result["inductor"] is False
    assert result["overhead"] > 0  # the stream slots' cuBLAS workspaces, counted
    assert result["seconds"] < 15, result


def test_device_memory_peak_stays_within_the_budget_under_churn_and_concurrency(
    torch: Any, packages: Path
) -> None:
    """Zipf churn over six 1 GiB models, four requests at a time (batch 1-8, each on its own
    thread), the allocator capped at the budget as the runtime sets it (make_backend): the
    device's peak above the start, sampled every 0.5 ms, plus what the backend held before the
    start, stays within the budget, and no request fails."""
    import importlib.util

    from tidal.runtime.backends.torch_aoti import TorchAOTIBackend, read_tidal_section

    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = package(packages, "big")
    budget = int(read_tidal_section(path).manifest.weights_bytes * 3.3)
    backend = TorchAOTIBackend(0, memory_limit_bytes=budget)
    try:
        result = bench.churn(bench.Device(torch), backend, path, budget, 60, 60.0, 4)
    finally:
        backend.limit_device_memory(None)
        backend.close()
    assert result["failed"] == 0
    assert len(result["cold"]) >= 5 and result["evictions"] >= 3  # it churned
    assert result["samples"] >= 100
    peak = result["peak_above_start"] + result["overhead"]
    assert peak <= budget, (peak / 2**30, budget / 2**30, result["allocator_peak_reserved"])


def test_eviction_gives_device_memory_back(torch: Any, backend: Any, packages: Path) -> None:
    path = package(packages, "big")
    from tidal.runtime.backends.torch_aoti import read_tidal_section

    weights = read_tidal_section(path).manifest.weights_bytes
    cache = make_cache(backend, {"a": path, "b": path}, int(weights * 1.5), 8)
    before = free_bytes(torch)
    asyncio.run(load(cache, "a"))
    with_a = free_bytes(torch)
    assert before - with_a >= weights  # the weights really are on the device
    asyncio.run(load(cache, "b"))  # does not fit beside a: a is evicted
    assert cache.slot("a").state == "UNAVAILABLE" and cache.slot("b").state == "READY"
    with_b = free_bytes(torch)
    assert abs(with_b - with_a) < SLACK, (before, with_a, with_b)  # a's went back, b's was taken
    asyncio.run(cache.unload("b"))
    after = free_bytes(torch)
    assert abs(after - before) < SLACK, (before, with_a, with_b, after)
    cache.close()


def test_a_load_over_the_budget_is_refused_with_a_reason(backend: Any, packages: Path) -> None:
    path = package(packages, "big")
    cache = make_cache(backend, {"big": path}, 256 * MiB, 8)
    with pytest.raises(EngineLoadError, match="too-large"):
        asyncio.run(load(cache, "big"))
    cache.close()


def test_a_load_beyond_free_device_memory_is_refused_not_oom(
    torch: Any, backend: Any, packages: Path
) -> None:
    path = package(packages, "big")
    cache = make_cache(backend, {"big": path}, 8 << 30, 8)
    hog = torch.empty(free_bytes(torch) - 512 * MiB, dtype=torch.uint8, device="cuda")
    try:
        with pytest.raises(EngineLoadError, match="free"):
            asyncio.run(load(cache, "big"))
        assert cache.slot("big").state == "UNAVAILABLE"
    finally:
        del hog
        torch.cuda.empty_cache()
    asyncio.run(load(cache, "big"))  # and loads once the memory is back
    cache.close()


def test_the_budget_is_capped_by_free_device_memory(torch: Any, backend: Any) -> None:
    free = free_bytes(torch)
    cache = make_cache(backend, {}, 1 << 50, 8)
    assert cache.budget <= free
    assert cache.budget_plan.reason.startswith("device-free")
    cache.close()


def test_a_package_for_another_gpu_is_rejected_by_name(
    backend: Any, packages: Path, tmp_path: Path
) -> None:
    other = tmp_path / "sm80-torch2.11-fp16.pt2"
    shutil.copy(package(packages, "mlp"), other)
    cache = make_cache(backend, {"mlp": other}, 8 << 30, 64)
    with pytest.raises(EngineLoadError, match="compiled for sm80 but this runtime runs on sm9"):
        asyncio.run(load(cache, "mlp"))
    cache.close()
