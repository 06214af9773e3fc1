"""Engine file naming and selection: which file of a model runs on this machine.

Naming scheme (one for all backends, documented in runtime/README.md)::

    <gpuArch>-trt<major>.<minor>[-vc]-<precision>.engine   TensorRT plan: sm90-trt11.4-fp16.engine
    <anything>[-<precision>].onnx                          ONNX model:    resnet50-fp16.onnx

``gpuArch`` is ``sm<major><minor>`` (``sm90`` = Hopper) or ``ampere+`` for hardware-compatible
plans; ``-vc`` marks a plan built with ``VERSION_COMPATIBLE``.  Fields given explicitly in the
configuration (``gpuArch``, ``precision``, ``trtVersion``, ``format``) override the file name.

Selection keeps the candidates this machine can run, then prefers the model's precision order
(configuration order when none is given), then an exact TensorRT version over a
version-compatible one.  Every rejected candidate carries its reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

EngineFormat = Literal["onnx", "plan"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4")

_PLAN_NAME = re.compile(
    r"^(?P<arch>sm\d{2,3}|ampere\+|any)-trt(?P<ver>\d+\.\d+)(?P<vc>-vc)?-(?P<prec>[a-z0-9]+)"
    r"\.(?:engine|plan)$"
)
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


def engine_file_name(
    gpu_arch: str, trt_version: tuple[int, int], precision: str, version_compatible: bool = False
) -> str:
    """The canonical file name of a TensorRT plan (inverse of :func:`describe_engine`)."""
    vc = "-vc" if version_compatible else ""
    return f"{gpu_arch}-trt{trt_version[0]}.{trt_version[1]}{vc}-{precision}.engine"


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
        else:
            raise EngineNameError(
                f"{name!r}: cannot tell the engine format; name it *.onnx or *.engine, "
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


@dataclass(frozen=True)
class EngineTarget:
    """What this process can run: the backend's format, the GPU and the TensorRT version."""

    format: EngineFormat
    gpu_arch: str | None = None
    trt_version: tuple[int, int] | None = None
    precision_preference: tuple[str, ...] = ()


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
