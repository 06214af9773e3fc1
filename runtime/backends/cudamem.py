"""Device memory, pinned host staging buffers and streams through cuda-python 13.

Imports nothing but numpy and ctypes at module level: ``cuda.bindings`` is loaded on first use,
so this module imports on machines without CUDA and ``bench/gpu_check.py`` can use it on a GPU
machine without the rest of the runtime's dependencies.

Host-to-device copies go through page-locked (pinned) staging buffers: on the H200 we measured
pinned copies at ~55 GB/s and ordinary (pageable) memory at ~6 GB/s (shared/FACTS.md).
:class:`DeviceAllocator` counts every byte it hands out so that the engine cache's accounting
is exact rather than inferred from cudaMemGetInfo.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np


class CudaError(RuntimeError):
    pass


def cudart() -> Any:
    """The cuda-python runtime module (``from cuda.bindings import runtime``)."""
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise CudaError(
            "cuda-python 13 is not installed (pip install 'cuda-python>=13'): " + str(exc)
        ) from None
    return runtime


def check(result: Any, what: str) -> Any:
    """Unwrap cuda-python's ``(err, *values)`` convention; raise on an error code."""
    rt = cudart()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise CudaError(f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def handle(obj: Any) -> int:
    """The integer value of a CUDA handle or pointer (what TensorRT's Python API takes)."""
    if isinstance(obj, int):
        return obj
    try:
        return int(obj)
    except TypeError:
        return int(obj.getPtr())


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current device."""
    free, total = check(cudart().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free), int(total)


def device_arch(device: int = 0) -> str:
    """``sm<major><minor>`` of ``device``, e.g. ``sm90`` for an H100/H200."""
    rt = cudart()
    major = check(
        rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute(major)",
    )
    minor = check(
        rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, device),
        "cudaDeviceGetAttribute(minor)",
    )
    return f"sm{int(major)}{int(minor)}"


def set_device(device: int) -> None:
    check(cudart().cudaSetDevice(device), f"cudaSetDevice({device})")


@dataclass
class DeviceBuffer:
    ptr: int
    nbytes: int


@dataclass
class PinnedBuffer:
    """Page-locked host memory with a numpy byte view over it."""

    ptr: int
    nbytes: int
    view: np.ndarray[Any, Any]

    def as_array(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        count = int(np.prod(shape)) if shape else 1
        need = count * np.dtype(dtype).itemsize
        if need > self.nbytes:
            raise CudaError(f"pinned buffer of {self.nbytes}B is too small for {need}B")
        return self.view[:need].view(dtype).reshape(shape)


class DeviceAllocator:
    """Allocates device and pinned memory and counts every byte it holds."""

    def __init__(self) -> None:
        self.device_bytes = 0
        self.pinned_bytes = 0
        self._device: dict[int, int] = {}
        self._pinned: dict[int, int] = {}

    def alloc_device(self, nbytes: int) -> DeviceBuffer:
        ptr = handle(check(cudart().cudaMalloc(max(1, nbytes)), f"cudaMalloc({nbytes})"))
        self._device[ptr] = nbytes
        self.device_bytes += nbytes
        return DeviceBuffer(ptr, nbytes)

    def free_device(self, buffer: DeviceBuffer) -> None:
        if buffer.ptr in self._device:
            check(cudart().cudaFree(buffer.ptr), "cudaFree")
            self.device_bytes -= self._device.pop(buffer.ptr)

    def alloc_pinned(self, nbytes: int) -> PinnedBuffer:
        ptr = handle(check(cudart().cudaMallocHost(max(1, nbytes)), f"cudaMallocHost({nbytes})"))
        raw = (ctypes.c_uint8 * max(1, nbytes)).from_address(ptr)
        view = np.frombuffer(memoryview(raw), dtype=np.uint8, count=nbytes)
        self._pinned[ptr] = nbytes
        self.pinned_bytes += nbytes
        return PinnedBuffer(ptr, nbytes, view)

    def free_pinned(self, buffer: PinnedBuffer) -> None:
        if buffer.ptr in self._pinned:
            check(cudart().cudaFreeHost(buffer.ptr), "cudaFreeHost")
            self.pinned_bytes -= self._pinned.pop(buffer.ptr)

    def close(self) -> None:
        rt = cudart()
        for ptr in list(self._device):
            rt.cudaFree(ptr)
        for ptr in list(self._pinned):
            rt.cudaFreeHost(ptr)
        self._device.clear()
        self._pinned.clear()
        self.device_bytes = 0
        self.pinned_bytes = 0


class Stream:
    def __init__(self) -> None:
        rt = cudart()
        self._raw = check(
            rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags"
        )
        self.handle = handle(self._raw)

    def synchronize(self) -> None:
        check(cudart().cudaStreamSynchronize(self._raw), "cudaStreamSynchronize")

    def destroy(self) -> None:
        cudart().cudaStreamDestroy(self._raw)


def copy_host_to_device(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    rt = cudart()
    check(
        rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream._raw),
        "cudaMemcpyAsync(H2D)",
    )


def copy_device_to_host(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    rt = cudart()
    check(
        rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream._raw),
        "cudaMemcpyAsync(D2H)",
    )
