"""GPU check of the runtime's cuda-python paths, for one run on an NVIDIA machine.

Self-contained: needs numpy and cuda-python 13 (``cuda.bindings``) only, and imports the
runtime's own :mod:`tidal.runtime.backends.cudamem` from this checkout (no pydantic, aiohttp or
onnxruntime needed).  Each section runs on its own, so one failure does not hide the rest.
Prints a human summary and, last, one JSON line with every figure.

    python3 bench/gpu_check.py [--sizes-mib 64,1024] [--repeats 5]

Sections:
1. device: architecture (sm<major><minor>, the engine naming scheme's gpuArch), memory;
2. allocator accounting: DeviceAllocator's byte count against cudaMemGetInfo's change;
3. copy bandwidth: pinned staging buffer vs pageable (numpy) memory, host->device and back,
   timed with CUDA events on one non-blocking stream;
4. stream ordering: H2D then D2H on one stream, synchronize, compare bytes;
5. TensorRT: which module imports and its version; the plan-header check against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tidal.runtime.backends import cudamem as cm  # noqa: E402

MIB = 1 << 20


def section(name: str, results: dict[str, Any], func: Any, *args: Any) -> None:
    print(f"\n== {name}")
    try:
        results[name] = func(*args)
        results[name]["ok"] = True
    except Exception as exc:
        traceback.print_exc()
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"FAILED: {exc}")


def device_info() -> dict[str, Any]:
    cm.set_device(0)
    free, total = cm.mem_get_info()
    arch = cm.device_arch(0)
    print(f"arch {arch}; memory free {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")
    return {"arch": arch, "free_bytes": free, "total_bytes": total}


def allocator_accounting() -> dict[str, Any]:
    allocator = cm.DeviceAllocator()
    free_before, _ = cm.mem_get_info()
    sizes = [256 * MIB, 512 * MIB, 1000 * MIB + 12345]
    buffers = [allocator.alloc_device(n) for n in sizes]
    free_during, _ = cm.mem_get_info()
    counted = allocator.device_bytes
    observed = free_before - free_during
    for buffer in buffers:
        allocator.free_device(buffer)
    free_after, _ = cm.mem_get_info()
    pinned = allocator.alloc_pinned(64 * MIB)
    pinned_counted = allocator.pinned_bytes
    allocator.free_pinned(pinned)
    print(
        f"allocator counted {counted} B; cudaMemGetInfo saw {observed} B "
        f"(ratio {observed / counted:.4f}, granularity rounds up); after free: "
        f"{allocator.device_bytes} B counted, {free_before - free_after} B still used; "
        f"pinned counted {pinned_counted} B then {allocator.pinned_bytes} B"
    )
    assert counted == sum(sizes)
    assert allocator.device_bytes == 0 and allocator.pinned_bytes == 0
    assert observed >= counted
    return {
        "counted_bytes": counted,
        "observed_bytes": observed,
        "leaked_after_free_bytes": free_before - free_after,
    }


def _time_copies(
    dst: int, src: int, nbytes: int, kind: str, stream: cm.Stream, repeats: int
) -> float:
    """Best-of-``repeats`` GB/s of one copy, timed with CUDA events on ``stream``."""
    rt = cm.cudart()
    start = cm.check(rt.cudaEventCreate(), "cudaEventCreate")
    stop = cm.check(rt.cudaEventCreate(), "cudaEventCreate")
    copy = cm.copy_host_to_device if kind == "h2d" else cm.copy_device_to_host
    best = float("inf")
    copy(dst, src, nbytes, stream)  # warm-up
    stream.synchronize()
    for _ in range(repeats):
        cm.check(rt.cudaEventRecord(start, stream._raw), "cudaEventRecord")
        copy(dst, src, nbytes, stream)
        cm.check(rt.cudaEventRecord(stop, stream._raw), "cudaEventRecord")
        stream.synchronize()
        ms = cm.check(rt.cudaEventElapsedTime(start, stop), "cudaEventElapsedTime")
        best = min(best, float(ms) / 1000.0)
    rt.cudaEventDestroy(start)
    rt.cudaEventDestroy(stop)
    return nbytes / best / 1e9


def copy_bandwidth(sizes_mib: list[int], repeats: int) -> dict[str, Any]:
    allocator = cm.DeviceAllocator()
    stream = cm.Stream()
    rows = []
    try:
        for mib in sizes_mib:
            nbytes = mib * MIB
            device = allocator.alloc_device(nbytes)
            pinned = allocator.alloc_pinned(nbytes)
            pageable = np.ones(nbytes, dtype=np.uint8)  # touched, so the pages exist
            pinned.view[:] = 1
            t0 = time.perf_counter()
            row = {
                "size_mib": mib,
                "h2d_pinned_gbps": _time_copies(
                    device.ptr, pinned.ptr, nbytes, "h2d", stream, repeats
                ),
                "h2d_pageable_gbps": _time_copies(
                    device.ptr, pageable.ctypes.data, nbytes, "h2d", stream, repeats
                ),
                "d2h_pinned_gbps": _time_copies(
                    pinned.ptr, device.ptr, nbytes, "d2h", stream, repeats
                ),
                "d2h_pageable_gbps": _time_copies(
                    pageable.ctypes.data, device.ptr, nbytes, "d2h", stream, repeats
                ),
            }
            row["h2d_pinned_over_pageable"] = row["h2d_pinned_gbps"] / row["h2d_pageable_gbps"]
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(
                f"{mib:>6} MiB  H2D pinned {row['h2d_pinned_gbps']:6.1f} GB/s  pageable "
                f"{row['h2d_pageable_gbps']:6.1f} GB/s  ({row['h2d_pinned_over_pageable']:.1f}x)  "
                f"D2H pinned {row['d2h_pinned_gbps']:6.1f}  pageable "
                f"{row['d2h_pageable_gbps']:6.1f}"
            )
            allocator.free_device(device)
            allocator.free_pinned(pinned)
            del pageable
    finally:
        stream.destroy()
        allocator.close()
    return {"rows": rows}


def stream_ordering() -> dict[str, Any]:
    allocator = cm.DeviceAllocator()
    stream = cm.Stream()
    try:
        nbytes = 32 * MIB
        src = allocator.alloc_pinned(nbytes)
        dst = allocator.alloc_pinned(nbytes)
        device = allocator.alloc_device(nbytes)
        pattern = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        src.view[:] = pattern
        dst.view[:] = 0
        cm.copy_host_to_device(device.ptr, src.ptr, nbytes, stream)
        cm.copy_device_to_host(dst.ptr, device.ptr, nbytes, stream)
        stream.synchronize()
        equal = bool(np.array_equal(dst.view, pattern))
        typed = dst.as_array(np.dtype(np.float32), (nbytes // 4,))
        print(f"round trip of {nbytes} B through one stream: {'identical' if equal else 'DIFFERS'}")
        assert equal and typed.shape == (nbytes // 4,)
        return {"identical": equal}
    finally:
        stream.destroy()
        allocator.close()


def tensorrt_check() -> dict[str, Any]:
    from tidal.runtime.core.planfile import (
        check_plan_compatibility,
        make_plan_header,
        parse_plan_header,
    )

    module = None
    for name in ("tensorrt", "tensorrt_lean_bindings", "tensorrt_lean"):
        try:
            module = __import__(name)
            break
        except ImportError:
            continue
    if module is None:
        print("TensorRT: not installed here (tensorrt / tensorrt_lean); plan-header check only")
        version: tuple[int, ...] = (11, 4, 0, 0)
        found = None
    else:
        found = f"{module.__name__} {module.__version__}"
        version = tuple(int(p) for p in module.__version__.split(".")[:4] if p.isdigit())
        print(f"TensorRT: {found}")
        logger = module.Logger(module.Logger.WARNING)
        runtime = module.Runtime(logger)
        print(f"  IRuntime created; engine_host_code_allowed={runtime.engine_host_code_allowed}")
        bogus = runtime.deserialize_cuda_engine(b"not a plan" * 10)
        print(f"  deserialize_cuda_engine(garbage) -> {bogus!r} (None expected)")
    header = parse_plan_header(make_plan_header((*version[:3], 0)))  # type: ignore[arg-type]
    same = check_plan_compatibility(header, version, version_compatible=False)
    older = parse_plan_header(make_plan_header((version[0], max(0, version[1] - 1), 0, 0)))
    vc = check_plan_compatibility(older, version, version_compatible=True)
    print(f"  plan header: {same.reason}; older version-compatible: {vc.reason}")
    return {"module": found, "same_version": same.compatible, "older_vc": vc.compatible}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mib", default="64,1024")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    results: dict[str, Any] = {}
    section("device", results, device_info)
    section("allocator_accounting", results, allocator_accounting)
    section("copy_bandwidth", results, copy_bandwidth, sizes, args.repeats)
    section("stream_ordering", results, stream_ordering)
    section("tensorrt", results, tensorrt_check)
    ok = all(r.get("ok") for r in results.values())
    print(f"\nsummary: {'all sections passed' if ok else 'SOME SECTIONS FAILED'}")
    print(json.dumps(results, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
