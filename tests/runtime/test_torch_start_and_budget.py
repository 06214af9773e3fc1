"""The GPU backend's CPU-side parts of issue 34: the CPU-ISA priming that removed ~30 s from a
GPU replica's start, the node-wide cold-load gate, and the engine cache's accounting of what a
backend holds beside its engines and of engines measured before.  No torch, no GPU (CI)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal.common.clock import CLOCK
from tidal.runtime.backends import DeviceMemory, TensorSpec
from tidal.runtime.backends.torch_aoti import (
    DirectPackage,
    NodeLoadGate,
    graphs_enabled,
    prime_cpu_isa,
)
from tidal.runtime.config import parse_config
from tidal.runtime.core.engines import EngineTarget
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.storage import EngineStore


class FakeIsaModule:
    """The shape of torch._inductor.cpu_vec_isa that prime_cpu_isa relies on."""

    def __init__(self) -> None:
        self.compiled: list[str] = []
        module = self

        class VecISA:
            def check_build(self, code: str) -> bool:
                module.compiled.append(code)  # the real one runs the compiler and a Python
                time.sleep(1)
                return True

        class Amx(VecISA):
            def __str__(self) -> str:
                return "avx512 amx_tile"

        self.VecISA = VecISA
        self.amx = Amx()

    def pick_vec_isa(self) -> Any:
        assert self.amx.check_build("amx probe")  # what VecAMX.__bool__ does
        return self.amx


def test_priming_the_cpu_isa_compiles_nothing_and_restores_the_probe() -> None:
    module = FakeIsaModule()
    original = module.VecISA.check_build
    started = time.perf_counter()
    assert prime_cpu_isa(module) == "avx512 amx_tile"
    assert time.perf_counter() - started < 0.5
    assert module.compiled == []
    assert module.VecISA.check_build is original  # later compiles (none here) probe as before


def test_priming_restores_the_probe_when_picking_fails() -> None:
    module = FakeIsaModule()
    original = module.VecISA.check_build

    def broken() -> Any:
        raise RuntimeError("no cpuinfo")

    module.pick_vec_isa = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="no cpuinfo"):
        prime_cpu_isa(module)
    assert module.VecISA.check_build is original


def test_the_node_gate_lets_one_load_at_a_time_across_file_descriptions(tmp_path: Path) -> None:
    gate = NodeLoadGate(tmp_path / "gate", slots=1, poll_s=0.001)
    other = NodeLoadGate(tmp_path / "gate", slots=1, poll_s=0.001)  # another process's view
    inside: list[int] = []
    most = [0]
    lock = threading.Lock()
    waits: list[float] = []

    def load(g: NodeLoadGate) -> None:
        with g.hold() as waited:
            with lock:
                inside.append(1)
                most[0] = max(most[0], len(inside))
            time.sleep(0.05)
            with lock:
                inside.pop()
        waits.append(waited)

    threads = [threading.Thread(target=load, args=(g,)) for g in (gate, other, gate)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 1
    assert len(waits) == 3 and max(waits) >= 0.09  # the last one waited for the other two


def test_the_node_gate_has_as_many_slots_as_configured(tmp_path: Path) -> None:
    gate = NodeLoadGate.from_env(
        {"TIDAL_NODE_LOAD_DIR": str(tmp_path / "g"), "TIDAL_NODE_LOAD_SLOTS": "2"}
    )
    assert gate is not None and gate.slots == 2
    with gate.hold() as first, gate.hold() as second:  # two at once: neither waits
        assert first < 0.05 and second < 0.05
    assert NodeLoadGate.from_env({}) is None
    with pytest.raises(ValueError, match="at least one slot"):
        NodeLoadGate(tmp_path / "g", slots=0)


def test_graphs_are_on_unless_turned_off() -> None:
    assert graphs_enabled({})
    assert not graphs_enabled({"TIDAL_TORCH_CUDA_GRAPHS": "0"})


class SizedEngine:
    platform = "test_sized"
    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)

    def __init__(self, backend: SizedBackend, name: str) -> None:
        self.size_bytes = backend.real_size
        self.backend = backend
        self.name = name

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        return {"y": inputs["x"]}

    def close(self) -> None:
        self.backend.alive.discard(self.name)


class SizedBackend:
    """Engines that take more than estimated (a torch engine: weights, then workspace and
    graphs); it records the device bytes really held while each load allocates."""

    name = "sized"

    def __init__(self, overhead: int = 0) -> None:
        self.overhead_bytes = overhead
        self.real_size = 300
        self.alive: set[str] = set()
        self.held_during_load: dict[str, list[int]] = {}

    def target(self, model: Any) -> EngineTarget:
        return EngineTarget("onnx")

    def estimate_bytes(self, path: Path, descriptor: Any) -> int:
        return 100  # the weights alone

    def load(self, path: Path, descriptor: Any, model: Any, available: int) -> SizedEngine:
        self.alive.add(model.name)
        held = self.real_size * len(self.alive) + self.overhead_bytes
        self.held_during_load.setdefault(model.name, []).append(held)
        return SizedEngine(self, model.name)

    def device_memory(self) -> DeviceMemory | None:
        return DeviceMemory(total_bytes=1 << 40, used_bytes=0)


def sized_cache(tmp_path: Path, backend: SizedBackend, budget: int) -> EngineCache:
    models = []
    for name in ("a", "b", "c"):
        path = tmp_path / name / "model.onnx"
        path.parent.mkdir()
        path.write_bytes(b"onnx")
        models.append(
            {
                "name": name,
                "engines": [{"uri": str(path)}],
                "preload": False,
                "warmup": {"batchSizes": [1], "iterations": 1},
            }
        )
    config = parse_config(
        {"models": models, "memory": {"engineCacheBudgetBytes": budget}, "maxConcurrentLoads": 1}
    )
    return EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)


def test_what_the_backend_holds_comes_out_of_the_engines_budget(tmp_path: Path) -> None:
    backend = SizedBackend(overhead=100)
    cache = sized_cache(tmp_path, backend, budget=1000)
    assert cache.overhead_bytes == 100
    assert cache.budget == 900

    async def run() -> None:
        for name in ("a", "b", "c"):  # 3 x 300 = 900: the third fits only without overhead
            await cache.ensure_loaded(name)

    asyncio.run(run())
    assert max(max(v) for v in backend.held_during_load.values()) <= 1000
    cache.close()


def test_an_engine_measured_before_is_reserved_at_its_real_size(tmp_path: Path) -> None:
    backend = SizedBackend()
    cache = sized_cache(tmp_path, backend, budget=700)

    async def run() -> None:
        for name in ("a", "b", "c", "a"):
            await cache.ensure_loaded(name)

    asyncio.run(run())
    # c's first load could only be reserved at its estimate (100): 900 held for a moment.
    assert backend.held_during_load["c"] == [900]
    # a's second load was reserved at the 300 it measured the first time: b went first.
    assert backend.held_during_load["a"] == [300, 600]
    assert cache.slot("b").state == "UNAVAILABLE"
    cache.close()


class FakeCppLoader:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def load_constants(self, *args: Any) -> None:
        self.calls.append(("load_constants", *args))

    def run(self, inputs: list[Any]) -> list[Any]:
        self.calls.append(("run", inputs))
        return [x * 2 for x in inputs]


def test_a_direct_package_passes_what_the_python_wrapper_would() -> None:
    loader = FakeCppLoader()
    package = DirectPackage(loader)
    constants = {"w": 1}
    package.load_constants(constants, check_full_update=True, user_managed=True)
    assert loader.calls == [("load_constants", constants, False, True, True)]
    assert package(3, 4) == [6, 8]
    assert package.loader.run([5]) == [10]
