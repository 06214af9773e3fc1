"""Engine file naming and selection: which file of a model runs on this machine.

Naming scheme (one for all backends, documented in runtime/README.md)::

    <gpuArch>-trt<major>.<minor>[-vc]-<precision>.engine   TensorRT plan: sm90-trt11.4-fp16.engine
    <anything>[-<precision>].onnx                          ONNX model:    resnet50-fp16.onnx
    <gpuArch>-torch<major>.<minor>-<precision>.pt2         AOTInductor:   sm90-torch2.11-fp16.pt2

``gpuArch`` is ``sm<major><minor>`` (``sm90`` = Hopper) or ``ampere+`` for hardware-compatible
plans; ``-vc`` marks a plan built with ``VERSION_COMPATIBLE``.  A PyTorch AOTInductor package
(``.pt2``) is bound like a plan: to one GPU architecture (or ``cpu``) and to the torch
``major.minor`` that compiled it, with no version-compatible mode.  Fields given explicitly in the
configuration (``gpuArch``, ``precision``, ``trtVersion``, ``format``) override the file name.

Selection keeps the candidates this machine can run, then prefers the model's precision order
(configuration order when none is given), then an exact TensorRT version over a
version-compatible one.  Every rejected candidate carries its reason.

:func:`plan_cache_budget` is the device arithmetic of the engine cache: the configured budget,
capped by what the device really had free when the runtime started, less the reserves.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

EngineFormat = Literal["onnx", "plan", "pt2"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4")

_PLAN_NAME = re.compile(
    r"^(?P<arch>sm\d{2,3}|ampere\+|any)-trt(?P<ver>\d+\.\d+)(?P<vc>-vc)?-(?P<prec>[a-z0-9]+)"
    r"\.(?:engine|plan)$"
)
_PT2_NAME = re.compile(r"^(?P<arch>sm\d{2,3}|cpu)-torch(?P<ver>\d+\.\d+)-(?P<prec>[a-z0-9]+)\.pt2$")
_ONNX_PRECISION = re.compile(r"[-_.](?P<prec>[a-z0-9]+)\.onnx$")


class EngineNameError(ValueError):
    """A file name that does not follow the naming scheme and has no explicit fields."""


@dataclass(frozen=True)
class EngineDescriptor:
    """What an engine file is, from its name and/or explicit configuration."""

    uri: str
    format: EngineFormat
    precision: str
    gpu_arch: str | None = None
    trt_version: tuple[int, int] | None = None
    version_compatible: bool = False
    torch_version: tuple[int, int] | None = None


def engine_file_name(
    gpu_arch: str, trt_version: tuple[int, int], precision: str, version_compatible: bool = False
) -> str:
    """The canonical file name of a TensorRT plan (inverse of :func:`describe_engine`)."""
    vc = "-vc" if version_compatible else ""
    return f"{gpu_arch}-trt{trt_version[0]}.{trt_version[1]}{vc}-{precision}.engine"


def pt2_file_name(gpu_arch: str, torch_version: tuple[int, int], precision: str) -> str:
    """The canonical file name of an AOTInductor package: ``sm90-torch2.11-fp16.pt2``."""
    return f"{gpu_arch}-torch{torch_version[0]}.{torch_version[1]}-{precision}.pt2"


def parse_torch_version(text: str) -> tuple[int, int]:
    """``(2, 11)`` from ``'2.11'``, ``'2.11.0'`` or ``'2.11.0+cu130'``."""
    parts = text.strip().removeprefix("torch").split("+", 1)[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise EngineNameError(f"{text!r} is not a torch version like '2.11' or '2.11.0+cu130'")
    return int(parts[0]), int(parts[1])


def parse_trt_version(text: str) -> tuple[int, int]:
    parts = text.strip().removeprefix("trt").split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise EngineNameError(f"{text!r} is not a TensorRT version like '10.13' or '11.4.0'")
    return int(parts[0]), int(parts[1])


def describe_engine(
    uri: str,
    *,
    format: EngineFormat | None = None,
    precision: str | None = None,
    gpu_arch: str | None = None,
    trt_version: str | None = None,
    version_compatible: bool | None = None,
) -> EngineDescriptor:
    """Describe an engine from its URI's file name, explicit fields taking precedence."""
    name = uri.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    fmt: EngineFormat | None = format
    if fmt is None:
        if name.endswith(".onnx"):
            fmt = "onnx"
        elif name.endswith((".engine", ".plan")):
            fmt = "plan"
        elif name.endswith(".pt2"):
            fmt = "pt2"
        else:
            raise EngineNameError(
                f"{name!r}: cannot tell the engine format; name it *.onnx, *.engine or *.pt2, "
                "or set 'format'"
            )
    if fmt == "onnx":
        parsed = _ONNX_PRECISION.search(name)
        from_name = parsed.group("prec") if parsed and parsed.group("prec") in PRECISIONS else None
        return EngineDescriptor(
            uri=uri,
            format="onnx",
            precision=precision or from_name or "fp32",
            gpu_arch=gpu_arch,
            trt_version=None,
            version_compatible=False,
        )
    if fmt == "pt2":
        return _describe_pt2(uri, name, precision=precision, gpu_arch=gpu_arch)
    match = _PLAN_NAME.match(name)
    arch = gpu_arch or (match.group("arch") if match else None)
    ver_text = trt_version or (match.group("ver") if match else None)
    prec = precision or (match.group("prec") if match else None)
    if arch is None or ver_text is None or prec is None:
        raise EngineNameError(
            f"{name!r} does not follow '<gpuArch>-trt<major>.<minor>[-vc]-<precision>.engine' "
            "(e.g. sm90-trt11.4-fp16.engine); set gpuArch, trtVersion and precision explicitly"
        )
    vc = version_compatible if version_compatible is not None else bool(match and match["vc"])
    return EngineDescriptor(
        uri=uri,
        format="plan",
        precision=prec,
        gpu_arch=arch,
        trt_version=parse_trt_version(ver_text),
        version_compatible=vc,
    )


def _describe_pt2(
    uri: str, name: str, *, precision: str | None, gpu_arch: str | None
) -> EngineDescriptor:
    match = _PT2_NAME.match(name)
    if match is None:
        raise EngineNameError(
            f"{name!r} does not follow '<gpuArch>-torch<major>.<minor>-<precision>.pt2' "
            "(e.g. sm90-torch2.11-fp16.pt2): an AOTInductor package is bound to the GPU "
            "architecture and the torch version that compiled it"
        )
    return EngineDescriptor(
        uri=uri,
        format="pt2",
        precision=precision or match["prec"],
        gpu_arch=gpu_arch or match["arch"],
        torch_version=parse_torch_version(match["ver"]),
    )


@dataclass(frozen=True)
class EngineTarget:
    """What this process can run: the backend's format, the GPU and the library version."""

    format: EngineFormat
    gpu_arch: str | None = None
    trt_version: tuple[int, int] | None = None
    precision_preference: tuple[str, ...] = ()
    torch_version: tuple[int, int] | None = None


@dataclass(frozen=True)
class Rejection:
    uri: str
    reason: str


@dataclass(frozen=True)
class EngineSelection:
    chosen: EngineDescriptor | None
    reason: str
    rejected: tuple[Rejection, ...] = ()


def _sm_number(arch: str) -> int | None:
    return int(arch[2:]) if arch.startswith("sm") and arch[2:].isdigit() else None


def _runs_on(engine: EngineDescriptor, target: EngineTarget) -> str | None:
    """None when the engine can run on the target, else why not."""
    if engine.format != target.format:
        return f"format {engine.format} but the backend runs {target.format}"
    if engine.format == "onnx":
        return None
    if engine.format == "pt2":
        return _pt2_runs_on(engine, target)
    if engine.gpu_arch not in (None, "any") and target.gpu_arch is not None:
        if engine.gpu_arch == "ampere+":
            sm = _sm_number(target.gpu_arch)
            if sm is None or sm < 80:
                return f"hardware-compatible (ampere+) plan but the GPU is {target.gpu_arch}"
        elif engine.gpu_arch != target.gpu_arch:
            return f"built for {engine.gpu_arch} but the GPU is {target.gpu_arch}"
    if (
        target.trt_version is not None
        and engine.trt_version is not None
        and engine.trt_version != target.trt_version
    ):
        newer_same_major = (
            engine.trt_version[0] == target.trt_version[0]
            and engine.trt_version <= target.trt_version
        )
        if not (engine.version_compatible and newer_same_major):
            built = ".".join(map(str, engine.trt_version))
            running = ".".join(map(str, target.trt_version))
            return f"built by TensorRT {built} but this runtime is TensorRT {running}"
    return None


def _pt2_runs_on(engine: EngineDescriptor, target: EngineTarget) -> str | None:
    """AOTInductor packages hold kernels for one architecture and link one torch's ABI."""
    if target.gpu_arch is not None and engine.gpu_arch != target.gpu_arch:
        return f"compiled for {engine.gpu_arch} but this runtime runs on {target.gpu_arch}"
    if (
        target.torch_version is not None
        and engine.torch_version is not None
        and engine.torch_version != target.torch_version
    ):
        built = ".".join(map(str, engine.torch_version))
        running = ".".join(map(str, target.torch_version))
        return f"compiled by torch {built} but this runtime is torch {running} (recompile)"
    return None


def select_engine(engines: Sequence[EngineDescriptor], target: EngineTarget) -> EngineSelection:
    """Pick the engine to load for ``target``, or explain why none fits."""
    usable: list[tuple[tuple[int, int, int], EngineDescriptor]] = []
    rejected: list[Rejection] = []
    for position, engine in enumerate(engines):
        why_not = _runs_on(engine, target)
        if why_not is not None:
            rejected.append(Rejection(engine.uri, why_not))
            continue
        if target.precision_preference:
            if engine.precision not in target.precision_preference:
                rejected.append(
                    Rejection(
                        engine.uri,
                        f"precision {engine.precision} not in {list(target.precision_preference)}",
                    )
                )
                continue
            rank = target.precision_preference.index(engine.precision)
        else:
            rank = 0
        inexact = int(engine.trt_version is not None and engine.trt_version != target.trt_version)
        usable.append(((rank, inexact, position), engine))
    if not usable:
        detail = "; ".join(f"{r.uri}: {r.reason}" for r in rejected) or "no engines configured"
        return EngineSelection(None, f"no engine fits: {detail}", tuple(rejected))
    usable.sort(key=lambda item: item[0])
    (rank, inexact, _), best = usable[0]
    why = "precision-preference" if target.precision_preference else "configuration-order"
    if inexact:
        why += ":version-compatible"
    return EngineSelection(best, f"selected:{why}:{best.precision}", tuple(rejected))


@dataclass(frozen=True)
class CacheBudget:
    """Device bytes the engine cache may fill, and how that figure was reached."""

    bytes: int
    reason: str


def plan_cache_budget(
    configured_bytes: int, reserve_bytes: int, device_free_bytes: int | None
) -> CacheBudget:
    """The cache budget: the configured bytes, capped by the device's free memory, less reserves.

    ``device_free_bytes`` is what ``cudaMemGetInfo`` reported once the backend had created its
    context (None without a GPU).  ``reserve_bytes`` (I/O buffers, workspaces of other
    processes, fragmentation) is never given to engines, whichever bound applies.  Each engine's
    own activation workspace is part of its measured size, not of the reserve.
    """
    configured = configured_bytes - reserve_bytes
    if device_free_bytes is None:
        return CacheBudget(max(0, configured), "configured")
    device = device_free_bytes - reserve_bytes
    if device < configured:
        return CacheBudget(
            max(0, device),
            f"device-free:{device_free_bytes}B free less {reserve_bytes}B reserve is below the "
            f"configured {configured_bytes}B",
        )
    return CacheBudget(max(0, configured), "configured")
