"""Backends: turn an engine file into something that runs batches.

A :class:`Backend` loads (deserializes) engine files into :class:`Engine` objects; both are
blocking and are called from worker threads by the engine cache.  ``onnxruntime`` runs ONNX
models on CPU (or CUDA when its provider is present); ``tensorrt`` runs TensorRT plans with
cuda-python and is imported only when configured; ``torch`` runs PyTorch AOTInductor packages
(``.pt2``) on a CUDA GPU (the optional ``torch`` extra; see ``backends/torch_aoti.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..config import ModelSpec, RuntimeConfig
    from ..core.engines import EngineDescriptor, EngineTarget


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output; ``shape`` includes the batch dimension, -1 where dynamic."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DeviceMemory:
    total_bytes: int
    used_bytes: int


class Engine(Protocol):
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    size_bytes: int

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch; every input's first dimension is the batch size."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str

    def target(self, model: ModelSpec) -> EngineTarget: ...

    def estimate_bytes(self, path: Path, descriptor: EngineDescriptor) -> int:
        """Device bytes the engine will need, before loading it (for cache admission)."""
        ...

    def load(
        self, path: Path, descriptor: EngineDescriptor, model: ModelSpec, available_bytes: int
    ) -> Engine: ...

    def device_memory(self) -> DeviceMemory | None:
        """Whole-device memory figures, or None without a GPU."""
        ...


def warmup_inputs(engine: Engine, batch_size: int) -> dict[str, np.ndarray[Any, Any]]:
    """Zero inputs of ``batch_size`` rows; dynamic non-batch dimensions become 1."""
    from ..protocol import DATATYPES

    arrays = {}
    for spec in engine.inputs:
        dims = [batch_size] + [d if d > 0 else 1 for d in spec.shape[1:]]
        arrays[spec.name] = np.zeros(dims, dtype=DATATYPES[spec.datatype])
    return arrays


def make_backend(config: RuntimeConfig) -> Backend:
    backend: str = config.backend
    if backend == "torch":
        from .torch_aoti import TorchAOTIBackend

        # The caching allocator may hold no more than the configured budget: a byte the cache's
        # accounting misses cannot take this runtime past it (tests/gpu: the peak under churn).
        return TorchAOTIBackend(
            config.tensorrt.device,
            memory_limit_bytes=config.memory.engine_cache_budget_bytes,
        )
    if backend == "onnxruntime":
        from .onnx import OnnxRuntimeBackend

        return OnnxRuntimeBackend(config.onnxruntime)
    from .tensorrt import TensorRTBackend

    return TensorRTBackend(config.tensorrt, config.memory)
