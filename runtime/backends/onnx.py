"""ONNX Runtime backend: CPU everywhere, CUDA when its execution provider is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..config import ModelSpec, OnnxRuntimeSpec
from ..core.engines import EngineDescriptor, EngineTarget
from ..errors import EngineLoadError, InvalidRequest
from . import DeviceMemory, TensorSpec

_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    # ONNX strings are UTF-8 text; BYTES elements arrive as bytes and leave as bytes.
    "tensor(string)": "BYTES",
}


def _spec(arg: Any) -> TensorSpec:
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
    datatype = _ORT_TYPES.get(arg.type)
    if datatype is None:
        raise EngineLoadError(f"tensor {arg.name!r} has unsupported type {arg.type}")
    return TensorSpec(arg.name, datatype, dims)


def _to_text(name: str, value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """BYTES elements as the str ONNX Runtime wants (ONNX strings are UTF-8)."""
    try:
        texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.flat]
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"input {name!r}: the model takes ONNX strings, which are UTF-8; element is not: {exc}"
        ) from None
    return np.array(texts, dtype=object).reshape(value.shape)


def _to_bytes(value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in value.flat]
    return np.array(out, dtype=object).reshape(value.shape)


class OnnxEngine:
    platform = "onnxruntime_onnx"

    def __init__(self, session: ort.InferenceSession, size_bytes: int) -> None:
        self._session = session
        self.inputs = tuple(_spec(a) for a in session.get_inputs())
        self.outputs = tuple(_spec(a) for a in session.get_outputs())
        self._output_names = [o.name for o in self.outputs]
        self._text_inputs = {t.name for t in self.inputs if t.datatype == "BYTES"}
        self._text_outputs = {t.name for t in self.outputs if t.datatype == "BYTES"}
        self.size_bytes = size_bytes

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        if self._text_inputs:
            inputs = {
                name: _to_text(name, value) if name in self._text_inputs else value
                for name, value in inputs.items()
            }
        results = dict(
            zip(self._output_names, self._session.run(self._output_names, inputs), strict=True)
        )
        for name in self._text_outputs:
            results[name] = _to_bytes(results[name])
        return results

    def close(self) -> None:
        # ONNX Runtime frees the session's memory when the last reference goes.
        del self._session


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, spec: OnnxRuntimeSpec) -> None:
        self._spec = spec
        available = ort.get_available_providers()
        if spec.providers is not None:
            missing = [p for p in spec.providers if p not in available]
            if missing:
                raise EngineLoadError(f"ONNX Runtime providers {missing} are not available")
            self.providers = list(spec.providers)
        elif "CUDAExecutionProvider" in available:
            self.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        else:
            self.providers = ["CPUExecutionProvider"]

    def target(self, model: ModelSpec) -> EngineTarget:
        return EngineTarget(format="onnx", precision_preference=tuple(model.precisions))

    def estimate_bytes(self, path: Path, descriptor: EngineDescriptor) -> int:
        # The weights dominate an ONNX session's footprint; the file size is their size.
        return path.stat().st_size

    def load(
        self, path: Path, descriptor: EngineDescriptor, model: ModelSpec, available_bytes: int
    ) -> OnnxEngine:
        options = ort.SessionOptions()
        if self._spec.intra_op_threads:
            options.intra_op_num_threads = self._spec.intra_op_threads
        options.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(path), options, providers=self.providers)
        except Exception as exc:  # ORT raises its own exception types for bad models
            raise EngineLoadError(f"ONNX Runtime cannot load {descriptor.uri}: {exc}") from None
        return OnnxEngine(session, path.stat().st_size)

    def device_memory(self) -> DeviceMemory | None:
        return None
