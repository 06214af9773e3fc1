"""Where engines go and when they are rebuilt: the naming scheme, the build key, the manifest.

Naming scheme (relative to the build's output)::

    <model>/<version>/<target>/<precision>/<model>-<precision>.onnx        (onnxruntime)
    <model>/<version>/<target>/<precision>/<target>-torch<M.m>-<precision>.pt2  (torch)
    <model>/<version>/<target>/<precision>/<gpuArch>-trt<M.m>-<precision>.engine  (tensorrt)
    <model>/<version>/<target>/<precision>/manifest.json

The file name follows the runtime's own scheme (``<anything>-<precision>.onnx``;
``<gpuArch>-torch<major>.<minor>-<precision>.pt2``, the GPU and torch a package is bound to;
``<gpuArch>-trt<major>.<minor>-<precision>.engine``, the GPU and TensorRT a plan is bound to),
so an engine listed by URI is understood without overrides. The manifest is written last: an
engine without one is an interrupted build, one with ``published: false`` was refused by the
accuracy gate (and its model file is not written).

Build key: the sha256 of everything that decides an engine's bytes and its verdict (source,
calibration and validation digests, the settings, the gate, the builder's and the libraries'
versions), in canonical JSON. An existing manifest with the same key is reused as it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..core.engines import (
    engine_file_name as plan_file_name,
)
from ..core.engines import (
    parse_torch_version,
    parse_trt_version,
    pt2_file_name,
)
from .gate import AccuracyMetrics, GateVerdict
from .spec import BuildSpec, GateSpec, ShapeProfile

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "tidal.dev/engine-manifest/v1"
# Bumped whenever the builder changes how it makes an engine from the same inputs.
BUILDER_VERSION = "1"
# How the torch builder makes each precision (part of the build key: a new scheme, a new key).
# The package's inputs and outputs keep the source's dtypes whatever the precision, so one model
# configuration serves any of its packages.
TORCH_SCHEMES: dict[str, str] = {
    "fp32": "the exported program as it is",
    "fp16": "parameters and buffers cast to float16; inputs cast in, outputs cast back",
    "bf16": "parameters and buffers cast to bfloat16; inputs cast in, outputs cast back",
    # Not offered by the spec yet (see spec.BACKEND_PRECISIONS).
    "fp8": "linear layers whose in and out features are multiples of 16 as float8_e4m3fn "
    "matrix products (torch._scaled_mm: per-tensor weight scale, per-call per-tensor activation "
    "scale), everything else bfloat16; inputs cast in, outputs cast back",
}
# How the TensorRT builder makes each precision's network (part of the build key): always a
# strongly typed network (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``), whose types come
# from the ONNX model it parses, and no precision flag (deprecated in TensorRT 10, removed in
# 11). ``onnx``: which ONNX model is parsed; ``cleared``: builder flags cleared (TF32 is on by
# default: cleared for fp32 so that the plan does the reference's arithmetic).
TENSORRT_NETWORKS: dict[str, dict[str, Any]] = {
    "fp32": {"onnx": "the source", "cleared": ["TF32"]},
    "fp16": {"onnx": "the source cast to float16 (lowprec.cast_model)", "cleared": []},
    "bf16": {"onnx": "the source cast to bfloat16 (lowprec.cast_model)", "cleared": []},
    "int8": {
        "onnx": "the Q/DQ model of ONNX Runtime's quantize_static, symmetric INT8, bias in FP32, "
        "gated under ONNX Runtime first (tensorrt.tensorrt_quantization)",
        "cleared": [],
    },
}
# Where a TensorRT build records the GPU it ran on (its plans run on that architecture only).
GPU_LIBRARY = "gpu"


@dataclass(frozen=True)
class ServedModel:
    """What a runtime backend asks of a model configuration at load (the builders evaluate
    engines through the runtime's own backends)."""

    name: str
    max_batch_size: int
    precisions: tuple[str, ...]


def artifact_prefix(spec: BuildSpec, precision: str) -> str:
    return f"{spec.model}/{spec.version}/{spec.target}/{precision}"


def engine_file_name(
    spec: BuildSpec, precision: str, libraries: Mapping[str, str] | None = None
) -> str:
    """The engine's file name; a torch package's names the torch it was built with (from
    ``libraries``, the build's :func:`key_inputs` material)."""
    if spec.backend == "torch":
        torch_version = (libraries or {}).get("torch")
        if torch_version is None:
            raise ValueError("a torch package's name needs the torch version (libraries)")
        return pt2_file_name(spec.target, parse_torch_version(torch_version), precision)
    if spec.backend == "tensorrt":
        found = libraries or {}
        if "tensorrt" not in found or GPU_LIBRARY not in found:
            raise ValueError("a TensorRT plan's name needs the TensorRT version and the GPU")
        return plan_file_name(found[GPU_LIBRARY], parse_trt_version(found["tensorrt"]), precision)
    return f"{spec.model}-{precision}.onnx"


def key_inputs(
    spec: BuildSpec,
    precision: str,
    *,
    source_sha256: str,
    calibration_sha256: str | None,
    validation_sha256: str,
    libraries: dict[str, str],
) -> dict[str, Any]:
    """What the build key covers, as plain data (recorded in the manifest, so that a conflict
    can say what changed)."""
    inputs: dict[str, Any] = {
        "builder": BUILDER_VERSION,
        "libraries": dict(sorted(libraries.items())),
        "backend": spec.backend,
        "target": spec.target,
        "precision": precision,
        "source": source_sha256,
        "profiles": [p.model_dump(by_alias=True) for p in spec.profiles],
        "validation": {
            "sha256": validation_sha256,
            "labels": spec.validation.labels,
        },
        "gate": spec.gate.model_dump(by_alias=True),
    }
    if spec.backend == "torch":
        inputs["scheme"] = TORCH_SCHEMES[precision]
        return inputs
    if spec.backend == "tensorrt":
        inputs["network"] = {"typing": "strong", **TENSORRT_NETWORKS[precision]}
    elif precision == "fp32":
        inputs["optimization"] = spec.optimization
    if precision == "int8":
        assert spec.calibration is not None  # the spec requires it for int8
        inputs["calibration"] = {
            "sha256": calibration_sha256,
            "maxSamples": spec.calibration.max_samples,
            "batchSize": spec.calibration.batch_size,
        }
        inputs["quantization"] = spec.quantization.model_dump(by_alias=True)
    return inputs


def build_key(inputs: dict[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """Dotted paths at which two key inputs differ (what changed since the last build)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for name in sorted(set(old) | set(new)):
            out += differences(old.get(name), new.get(name), f"{where}.{name}" if where else name)
        return out
    return [] if old == new else [where or "(all)"]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class FileRecord(_Model):
    """The published file: its sha256, and since issue 46 the sha256 of each ``chunk_bytes``
    chunk (the last one short), so a fetch or a stage verifies on every core
    (:mod:`tidal.runtime.backends.staging`).  Manifests written before carry no chunks."""

    name: str
    sha256: str
    size_bytes: int
    chunk_bytes: int | None = None
    chunk_sha256: list[str] | None = None


class DataRecord(_Model):
    uri: str
    sha256: str
    samples: int | None = None


class CheckRecord(_Model):
    criterion: str
    metric: str
    value: float | None  # None: NaN (JSON has none)
    limit: float
    passed: bool


class AccuracyRecord(_Model):
    """The gate's measurement and verdict, as the manifest carries them."""

    reference: Literal["source-fp32"] = "source-fp32"
    output: str
    samples: int
    top1_agreement: float | None
    max_abs_error: float | None
    mean_abs_error: float | None
    reference_accuracy: float | None = None
    candidate_accuracy: float | None = None
    accuracy_drop: float | None = None
    gate: GateSpec
    passed: bool
    checks: list[CheckRecord]
    skipped: list[str] = Field(default_factory=list)
    reason: str


def _finite(value: float | None) -> float | None:
    return None if value is None or value != value else value


def accuracy_record(
    output: str, metrics: AccuracyMetrics, gate: GateSpec, verdict: GateVerdict
) -> AccuracyRecord:
    return AccuracyRecord(
        output=output,
        samples=metrics.samples,
        top1_agreement=_finite(metrics.top1_agreement),
        max_abs_error=_finite(metrics.max_abs_error),
        mean_abs_error=_finite(metrics.mean_abs_error),
        reference_accuracy=metrics.reference_accuracy,
        candidate_accuracy=metrics.candidate_accuracy,
        accuracy_drop=metrics.accuracy_drop,
        gate=gate,
        passed=verdict.passed,
        checks=[
            CheckRecord(
                criterion=c.criterion,
                metric=c.metric,
                value=_finite(c.value),
                limit=c.limit,
                passed=c.passed,
            )
            for c in verdict.checks
        ],
        skipped=list(verdict.skipped),
        reason=verdict.reason,
    )


class Manifest(_Model):
    """Written beside each engine (``manifest.json``)."""

    schema_: str = Field(default=MANIFEST_SCHEMA, alias="schema")
    model: str
    version: str
    backend: str
    target: str
    precision: str
    file: FileRecord
    source: DataRecord
    calibration: DataRecord | None = None
    validation: DataRecord
    profiles: list[ShapeProfile]
    builder: dict[str, str]
    libraries: dict[str, str]
    build_key: str
    inputs: dict[str, Any]
    accuracy: AccuracyRecord
    published: bool
    built_at: str
    build_seconds: float

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2) + "\n"
