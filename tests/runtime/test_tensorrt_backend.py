"""The TensorRT backend's GPU-free parts, with TensorRT and CUDA replaced by recording fakes.

What runs for real here: the plan-header check, engine selection input, the weight-streaming
budget and its ordering (set before any execution context exists), device-byte accounting,
and the staging/copy sequence of one batch.  TensorRT itself and the CUDA calls are fakes: the
real ones need an NVIDIA GPU (see bench/gpu_check.py).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal.runtime.backends import cudamem as cm
from tidal.runtime.backends import tensorrt as trt_backend
from tidal.runtime.config import MemorySpec, ModelSpec, TensorRTSpec
from tidal.runtime.core.engines import describe_engine
from tidal.runtime.core.planfile import make_plan_header
from tidal.runtime.errors import EngineLoadError


class FakeTensorRT:
    """Just enough of the TensorRT Python API, recording the order of calls."""

    __version__ = "11.4.0.106"

    def __init__(self, streamable: int = 0, deserialize_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.streamable = streamable
        self.deserialize_fails = deserialize_fails
        fake = self

        class SeverityLevel(int):
            pass

        class ILogger:
            Severity = types.SimpleNamespace(WARNING=SeverityLevel(2))

            def __init__(self) -> None:
                pass

        class Engine:
            num_io_tensors = 2
            device_memory_size_v2 = 4096
            streamable_weights_size = fake.streamable
            weight_streaming_scratch_memory_size = 100 if fake.streamable else 0
            _contexts = 0

            def __setattr__(self, name: str, value: Any) -> None:
                if name == "weight_streaming_budget_v2":
                    assert self._contexts == 0, "budget set after an execution context exists"
                    fake.calls.append(f"budget={value}")
                object.__setattr__(self, name, value)

            def get_tensor_name(self, i: int) -> str:
                return ["x", "y"][i]

            def get_tensor_dtype(self, name: str) -> str:
                return "float32"

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                return (-1, 4)

            def get_tensor_mode(self, name: str) -> str:
                return "INPUT" if name == "x" else "OUTPUT"

            def get_tensor_profile_shape(self, name: str, profile: int) -> Any:
                return ((1, 4), (8, 4), (16, 4))

            def create_execution_context(self, strategy: str) -> Any:
                object.__setattr__(self, "_contexts", self._contexts + 1)
                fake.calls.append(f"context({strategy})")
                return Context()

        class Context:
            def __init__(self) -> None:
                self.shapes: dict[str, tuple[int, ...]] = {}

            def set_device_memory(self, ptr: int, size: int) -> None:
                fake.calls.append(f"device_memory({size})")

            def set_optimization_profile_async(self, index: int, stream: int) -> None:
                fake.calls.append(f"profile({index})")

            def set_tensor_address(self, name: str, ptr: int) -> None:
                fake.calls.append(f"address({name})")

            def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
                self.shapes[name] = tuple(shape)
                return True

            def execute_async_v3(self, stream: int) -> bool:
                fake.calls.append("execute")
                return True

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                return self.shapes["x"]

        class Runtime:
            engine_host_code_allowed = True

            def __init__(self, logger: Any) -> None:
                self.logger = logger

            def deserialize_cuda_engine(self, data: bytes) -> Any:
                fake.calls.append("deserialize")
                if fake.deserialize_fails:
                    self.logger.log(ILogger.Severity.WARNING, "Magic tag does not match")
                    return None
                assert self.engine_host_code_allowed is False
                return Engine()

        self.ILogger = ILogger
        self.Runtime = Runtime
        self.TensorIOMode = types.SimpleNamespace(INPUT="INPUT")
        self.ExecutionContextAllocationStrategy = types.SimpleNamespace(USER_MANAGED="USER_MANAGED")

    @staticmethod
    def nptype(dtype: str) -> Any:
        return np.float32


class FakeCuda:
    """Host memory standing in for device memory; copies are numpy copies."""

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.next = 4096

    def alloc(self, nbytes: int) -> int:
        ptr = self.next
        self.next += nbytes + 4096
        self.memory[ptr] = np.zeros(nbytes, np.uint8)
        return ptr

    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self.memory[dst][:nbytes] = self.memory[src][:nbytes]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda()

    class Allocator(cm.DeviceAllocator):
        def alloc_device(self, nbytes: int) -> cm.DeviceBuffer:
            self.device_bytes += nbytes
            return cm.DeviceBuffer(cuda.alloc(nbytes), nbytes)

        def free_device(self, buffer: cm.DeviceBuffer) -> None:
            self.device_bytes -= buffer.nbytes

        def alloc_pinned(self, nbytes: int) -> cm.PinnedBuffer:
            ptr = cuda.alloc(nbytes)
            self.pinned_bytes += nbytes
            return cm.PinnedBuffer(ptr, nbytes, cuda.memory[ptr])

        def free_pinned(self, buffer: cm.PinnedBuffer) -> None:
            self.pinned_bytes -= buffer.nbytes

    class Stream:
        handle = 7

        def synchronize(self) -> None:
            pass

        def destroy(self) -> None:
            pass

    monkeypatch.setattr(cm, "DeviceAllocator", Allocator)
    monkeypatch.setattr(cm, "Stream", Stream)
    monkeypatch.setattr(cm, "set_device", lambda device: None)
    monkeypatch.setattr(cm, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(cm, "mem_get_info", lambda: (100 * 2**30, 141 * 2**30))
    monkeypatch.setattr(cm, "copy_host_to_device", cuda.copy)
    monkeypatch.setattr(cm, "copy_device_to_host", cuda.copy)
    return cuda


def make_backend(
    monkeypatch: pytest.MonkeyPatch, fake: FakeTensorRT, budget: str | None = None
) -> trt_backend.TensorRTBackend:
    monkeypatch.setattr(trt_backend, "import_tensorrt", lambda: fake)
    return trt_backend.TensorRTBackend(
        TensorRTSpec(),
        MemorySpec(weightStreamingBudget=budget),  # type: ignore[call-arg]
    )


def plan(tmp_path: Path, version: tuple[int, int, int, int], size: int = 10_000) -> Path:
    path = tmp_path / "sm90-trt11.4-fp16.engine"
    path.write_bytes(make_plan_header(version) + bytes(size - 28))
    return path


MODEL = ModelSpec(
    name="m",
    engines=[{"uri": "file:///m/sm90-trt11.4-fp16.engine"}],  # type: ignore[list-item]
    maxBatchSize=16,
)  # type: ignore[call-arg]


def test_target_comes_from_the_device_and_the_library(monkeypatch, fake_cuda) -> None:
    backend = make_backend(monkeypatch, FakeTensorRT())
    target = backend.target(MODEL)
    assert (target.format, target.gpu_arch, target.trt_version) == ("plan", "sm90", (11, 4))
    memory = backend.device_memory()
    assert memory is not None and memory.used_bytes == 41 * 2**30


def test_budget_is_set_before_the_context_and_bytes_are_counted(
    monkeypatch, fake_cuda, tmp_path
) -> None:
    fake = FakeTensorRT(streamable=8_000)
    backend = make_backend(monkeypatch, fake, budget="50%")
    path = plan(tmp_path, (11, 4, 0, 106))
    engine = backend.load(path, describe_engine(path.as_uri()), MODEL, available_bytes=10**9)
    assert fake.calls[:3] == ["deserialize", "budget=4000", "context(USER_MANAGED)"]
    assert "device_memory(4096)" in fake.calls
    io_bytes = 2 * 16 * 4 * 4  # x and y at the profile's largest shape, float32
    assert backend.allocator.device_bytes == 4096 + io_bytes
    assert backend.allocator.pinned_bytes == io_bytes
    assert engine.size_bytes == (10_000 - 8_000 + 4_000) + 4096 + io_bytes
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(engine.infer({"x": x})["y"], np.zeros((3, 4), np.float32))
    engine.close()
    assert backend.allocator.device_bytes == 0 and backend.allocator.pinned_bytes == 0


@pytest.mark.parametrize(
    ("version", "message"),
    [((11, 2, 0, 0), "rebuild the engine"), ((10, 13, 0, 0), "TensorRT 10.13.0")],
)
def test_plans_of_another_version_are_refused_before_tensorrt_sees_them(
    monkeypatch, fake_cuda, tmp_path, version, message
) -> None:
    fake = FakeTensorRT()
    backend = make_backend(monkeypatch, fake)
    path = plan(tmp_path, version)
    with pytest.raises(EngineLoadError, match=message):
        backend.load(path, describe_engine(path.as_uri()), MODEL, available_bytes=10**9)
    assert fake.calls == []


def test_failed_deserialization_reports_tensorrt_messages(monkeypatch, fake_cuda, tmp_path) -> None:
    backend = make_backend(monkeypatch, FakeTensorRT(deserialize_fails=True))
    path = plan(tmp_path, (11, 4, 0, 106))
    with pytest.raises(EngineLoadError, match="Magic tag does not match"):
        backend.load(path, describe_engine(path.as_uri()), MODEL, available_bytes=10**9)


def test_an_engine_that_cannot_fit_is_refused(monkeypatch, fake_cuda, tmp_path) -> None:
    backend = make_backend(monkeypatch, FakeTensorRT(streamable=0))
    path = plan(tmp_path, (11, 4, 0, 106))
    with pytest.raises(EngineLoadError, match="no streamable weights"):
        backend.load(path, describe_engine(path.as_uri()), MODEL, available_bytes=5_000)


def test_a_machine_without_tensorrt_gets_an_installable_hint(monkeypatch) -> None:
    monkeypatch.setattr(trt_backend, "TENSORRT_MODULES", ("no_such_tensorrt_module",))
    with pytest.raises(EngineLoadError, match="tensorrt-lean-cu13-bindings"):
        trt_backend.import_tensorrt()
