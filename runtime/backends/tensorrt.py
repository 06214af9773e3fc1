"""TensorRT backend: plans deserialized with the TensorRT 10/11 Python API, run with cuda-python.

Written against the documented API (``tensorrt`` or the lean runtime ``tensorrt_lean``), both
imported on first use.  What it does for each engine, in order:

1. check the plan header (magic tag, TensorRT version) before TensorRT sees the bytes;
2. deserialize with ``IRuntime.deserialize_cuda_engine`` (None on failure: the messages TensorRT
   logged become the error); host code in plans is refused unless ``allowHostCode``;
3. set ``weight_streaming_budget_v2`` from :func:`plan_weight_streaming` — before any execution
   context exists, as TensorRT requires;
4. create one execution context with user-managed device memory of ``device_memory_size_v2``
   bytes allocated through :class:`DeviceAllocator` (so device bytes are counted exactly);
5. allocate device I/O buffers and pinned host staging buffers for the largest shapes of
   optimization profile 0 at ``maxBatchSize``;
6. per batch: copy inputs into pinned buffers, H2D async, ``set_input_shape`` +
   ``set_tensor_address``, ``execute_async_v3``, D2H async into pinned buffers, synchronize.

What has and has not been executed is stated in runtime/README.md.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..config import MemorySpec, ModelSpec, TensorRTSpec
from ..core.engines import EngineDescriptor, EngineTarget
from ..core.planfile import (
    PLAN_HEADER_BYTES,
    PlanHeaderError,
    check_plan_compatibility,
    parse_plan_header,
)
from ..core.weightstreaming import (
    DoesNotFitError,
    EngineMemory,
    plan_weight_streaming,
)
from ..errors import BackendError, EngineLoadError
from ..protocol import datatype_of
from . import DeviceMemory, TensorSpec
from . import cudamem as cm

# The full TensorRT, then the lean runtime (PyPI's tensorrt-lean-cu13-bindings installs the
# module tensorrt_lean_bindings; older packagings name it tensorrt_lean).
TENSORRT_MODULES = ("tensorrt", "tensorrt_lean_bindings", "tensorrt_lean")


def import_tensorrt() -> Any:
    """The first TensorRT Python module of :data:`TENSORRT_MODULES` that imports."""
    errors = []
    for name in TENSORRT_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise EngineLoadError(
        "TensorRT is not installed: install 'tensorrt-lean-cu13-bindings' and "
        "'tensorrt-lean-cu13-libs' (lean runtime, version-compatible plans) or the full "
        "TensorRT (" + "; ".join(errors) + ")"
    )


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:4] if p.isdigit())


def _make_logger(trt: Any) -> tuple[Any, list[str]]:
    messages: list[str] = []

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.WARNING:
                messages.append(msg)

    return _Logger(), messages


class TensorRTEngine:
    platform = "tensorrt_plan"

    def __init__(
        self,
        trt: Any,
        engine: Any,
        allocator: cm.DeviceAllocator,
        max_batch: int,
        resident_weight_bytes: int,
    ) -> None:
        self._trt = trt
        self._engine = engine
        self._allocator = allocator
        self._lock = threading.Lock()
        self._stream = cm.Stream()
        self._buffers: list[Any] = []
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self._device: dict[str, cm.DeviceBuffer] = {}
        self._pinned: dict[str, cm.PinnedBuffer] = {}
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            self._dtypes[name] = dtype
            shape = tuple(int(d) for d in engine.get_tensor_shape(name))
            spec = TensorSpec(name, datatype_of(dtype), shape)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (inputs if is_input else outputs).append(spec)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        # Activation memory is user-managed so that every device byte goes through the allocator.
        strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
        self._context = engine.create_execution_context(strategy)
        if self._context is None:
            raise EngineLoadError("TensorRT could not create an execution context")
        activation = int(engine.device_memory_size_v2)
        self._activation = allocator.alloc_device(activation)
        self._context.set_device_memory(self._activation.ptr, activation)
        self._context.set_optimization_profile_async(0, self._stream.handle)
        for spec in (*self.inputs, *self.outputs):
            nbytes = self._max_bytes(spec, max_batch)
            self._device[spec.name] = allocator.alloc_device(nbytes)
            self._pinned[spec.name] = allocator.alloc_pinned(nbytes)
            self._context.set_tensor_address(spec.name, self._device[spec.name].ptr)
        self.size_bytes = (
            resident_weight_bytes + activation + sum(b.nbytes for b in self._device.values())
        )

    def _max_bytes(self, spec: TensorSpec, max_batch: int) -> int:
        if spec in self.inputs and -1 in spec.shape:
            _, _, largest = self._engine.get_tensor_profile_shape(spec.name, 0)
            dims = [int(d) for d in largest]
        else:
            dims = [d if d > 0 else max_batch for d in spec.shape]
            if self.inputs and -1 in spec.shape:
                # An output's dynamic dims follow the inputs'; bound them by the profile maximum.
                first = self.inputs[0]
                _, _, largest = self._engine.get_tensor_profile_shape(first.name, 0)
                dims = [d if d > 0 else int(largest[0]) for d in spec.shape]
        return int(np.prod(dims)) * self._dtypes[spec.name].itemsize

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        with self._lock:
            for spec in self.inputs:
                array = np.ascontiguousarray(inputs[spec.name], dtype=self._dtypes[spec.name])
                staging = self._pinned[spec.name].as_array(array.dtype, array.shape)
                np.copyto(staging, array)
                cm.copy_host_to_device(
                    self._device[spec.name].ptr,
                    self._pinned[spec.name].ptr,
                    array.nbytes,
                    self._stream,
                )
                if not self._context.set_input_shape(spec.name, array.shape):
                    raise BackendError(f"TensorRT refused shape {array.shape} for {spec.name}")
            if not self._context.execute_async_v3(self._stream.handle):
                raise BackendError("TensorRT execute_async_v3 failed")
            shapes = {}
            for spec in self.outputs:
                shape = tuple(int(d) for d in self._context.get_tensor_shape(spec.name))
                shapes[spec.name] = shape
                nbytes = int(np.prod(shape)) * self._dtypes[spec.name].itemsize
                cm.copy_device_to_host(
                    self._pinned[spec.name].ptr, self._device[spec.name].ptr, nbytes, self._stream
                )
            self._stream.synchronize()
            return {
                name: self._pinned[name].as_array(self._dtypes[name], shape).copy()
                for name, shape in shapes.items()
            }

    def close(self) -> None:
        with self._lock:
            del self._context
            for buffer in self._device.values():
                self._allocator.free_device(buffer)
            for pinned in self._pinned.values():
                self._allocator.free_pinned(pinned)
            self._allocator.free_device(self._activation)
            self._stream.destroy()
            del self._engine


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, spec: TensorRTSpec, memory: MemorySpec) -> None:
        self._spec = spec
        self._memory = memory
        self._trt = import_tensorrt()
        cm.set_device(spec.device)
        self.gpu_arch = cm.device_arch(spec.device)
        self.trt_version = version_tuple(self._trt.__version__)
        self.allocator = cm.DeviceAllocator()

    def target(self, model: ModelSpec) -> EngineTarget:
        return EngineTarget(
            format="plan",
            gpu_arch=self.gpu_arch,
            trt_version=(self.trt_version[0], self.trt_version[1]),
            precision_preference=tuple(model.precisions),
        )

    def estimate_bytes(self, path: Path, descriptor: EngineDescriptor) -> int:
        # The plan is mostly weights; activations are added once TensorRT reports them.
        return path.stat().st_size

    def load(
        self, path: Path, descriptor: EngineDescriptor, model: ModelSpec, available_bytes: int
    ) -> TensorRTEngine:
        data = path.read_bytes()
        try:
            header = parse_plan_header(data[:PLAN_HEADER_BYTES])
        except PlanHeaderError as exc:
            raise EngineLoadError(f"{descriptor.uri}: {exc}") from None
        compat = check_plan_compatibility(header, self.trt_version, descriptor.version_compatible)
        if not compat.compatible:
            raise EngineLoadError(f"{descriptor.uri}: {compat.reason}")
        trt = self._trt
        logger, messages = _make_logger(trt)
        runtime = trt.Runtime(logger)
        runtime.engine_host_code_allowed = self._spec.allow_host_code
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            detail = "; ".join(messages[-3:]) or "no message from TensorRT"
            raise EngineLoadError(f"TensorRT could not deserialize {descriptor.uri}: {detail}")
        memory = EngineMemory(
            total_weights=len(data),
            streamable_weights=int(getattr(engine, "streamable_weights_size", 0) or 0),
            activation=int(engine.device_memory_size_v2),
            scratch=int(getattr(engine, "weight_streaming_scratch_memory_size", 0) or 0),
        )
        try:
            plan = plan_weight_streaming(memory, self._memory.streaming_request(), available_bytes)
        except DoesNotFitError as exc:
            raise EngineLoadError(f"{descriptor.uri}: {exc}") from None
        resident = memory.total_weights
        if memory.streamable_weights > 0:
            # Must happen before the first execution context exists (TensorRT rejects it after).
            engine.weight_streaming_budget_v2 = plan.budget_bytes
            resident = memory.total_weights - memory.streamable_weights + plan.budget_bytes
        return TensorRTEngine(trt, engine, self.allocator, model.max_batch_size, resident)

    def device_memory(self) -> DeviceMemory | None:
        free, total = cm.mem_get_info()
        return DeviceMemory(total_bytes=total, used_bytes=total - free)
