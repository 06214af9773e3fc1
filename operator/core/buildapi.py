"""The ModelBuild API (``serving.tidal.dev/v1alpha1``, kind ``ModelBuild``): one source of truth.

A ModelBuild is what a GitOps user commits to have engines built: one model version from a
source ONNX model in the store, for a set of targets (``cpu``, a GPU architecture such as
``sm90``, or a GPU product as the nodes' ``nvidia.com/gpu.product`` label names it), at a set
of precisions, with shape profiles, a calibration set and an accuracy gate. The operator runs
one Job per target on a node of that target (``tidal.operator.core.builds``), each running the
runtime image's builder (``python -m tidal.runtime.builder``, runtime/BUILD.md) with the
per-target spec rendered here; its status lists each target's engines with their verdicts.

Why a kind of its own rather than a field of the InferenceService: a build is a batch job with
a lifecycle (pending, running, built, refused, failed) and a version that never changes once
published, while a service is long-running and changes; one build feeds many services (and a
service's primary and baseline name two builds); building needs rights (Jobs, the store's write
credentials) that serving does not; and build failures must not make a serving service look
broken. See the operator README ("Building engines").

The wire shape of the builder's spec is repeated here, not imported: the operator does not
import the runtime (an import-linter contract). ``tests/operator/test_builds.py`` checks that
every per-target spec the operator renders parses with the builder's own model.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from ...common.buildspec import GateSpec, QuantizationSpec, ShapeProfile
from .api import (
    DNS_SUBDOMAIN_PATTERN,
    GROUP,
    IMAGE_PATTERN,
    LABEL_VALUE_PATTERN,
    SHA256_PATTERN,
    ApiModel,
    Condition,
    Resource,
    S3Storage,
    Toleration,
    _rules,
    cel,
)
from .api.base import _matches

BUILD_KIND = "ModelBuild"
BUILD_PLURAL = "modelbuilds"
BUILD_SINGULAR = "modelbuild"
BUILD_SHORT_NAMES = ("tbuild",)
LABEL_BUILD = f"{GROUP}/build"
LABEL_TARGET = f"{GROUP}/build-target"
ANNOTATION_INPUTS = f"{GROUP}/build-inputs"

# Node labels of NVIDIA's GPU feature discovery (what the default targets are read from).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
GPU_MINOR_LABEL = "nvidia.com/gpu.compute.minor"

CPU_TARGET = "cpu"
ARCH_TARGET_PATTERN = r"^sm[0-9]{2,3}$"
# cpu, an architecture (sm90), or a GPU product as a label value (NVIDIA-H100-80GB-HBM3).
TARGET_PATTERN = LABEL_VALUE_PATTERN
BUILD_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$"
STORE_URI_PATTERN = r"^(file:///.*|s3://[^/\s]+(/.*)?|https?://[^/\s].*|/.*)$"
OUTPUT_PATTERN = r"^(file:///.*|s3://[^/\s]+(/.*)?|/.*)$"
Target = Annotated[str, Field(min_length=1, max_length=63, pattern=TARGET_PATTERN)]

INT8_CALIBRATION_MESSAGE = "calibration is required when precisions include int8"
ORT_TARGETS_MESSAGE = "targets: the onnxruntime builder builds for cpu only"
GPU_TARGETS_MESSAGE = "targets: tensorrt builds for GPUs, not cpu"
# What a careless spec said before without a word (issue 41): each refused, naming the field.
CALIBRATION_WITHOUT_INT8_MESSAGE = (
    "calibration is only used for int8, and precisions has no int8: add int8 to precisions, "
    "or remove calibration"
)
MAX_SAMPLES_MESSAGE = (
    "calibration.maxSamples must be at least calibration.batchSize: fewer samples than one "
    "batch is not a representative calibration set"
)
SAME_SET_MESSAGE = (
    "calibration must not be the validation set (the same uri, or the same sha256): an engine "
    "calibrated on its validation set is gated on the data it was fitted to; gate on a "
    "held-out set"
)
ACCURACY_WITHOUT_LABELS_MESSAGE = (
    "gate.maxAccuracyDrop needs validation.labels: without labels the accuracy bound is "
    "skipped; name the labels array in validation.labels, or remove maxAccuracyDrop"
)
MEAN_ABOVE_MAX_MESSAGE = (
    "gate.maxMeanAbsError must be <= gate.maxAbsError: a mean above the largest error "
    "allowed can never bind"
)
UNUSED_S3_MESSAGE = (
    "s3: no URI of this build is s3:// (source, calibration, validation, output), so the s3 "
    "block is never used; use s3:// URIs, or remove s3"
)
ARCH_TYPO_MESSAGE = (
    "targets: an entry that starts with sm must be a GPU architecture, sm and 2 or 3 digits "
    "such as sm90 (a GPU product is named as nodes label it: NVIDIA-H100-80GB-HBM3)"
)
# A target that looks like an architecture but is not one would be read as a GPU product.
ARCH_LIKE_PATTERN = r"^[sS][mM][_-]?[0-9]*[a-z]?$"
DEFAULT_MAX_ACCURACY_DROP = GateSpec().max_accuracy_drop


class BuildBackend(StrEnum):
    """Which builder makes the engines (and which runtime backend serves them)."""

    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    TORCH = "torch"


# Backends the operator runs Jobs for (``plan_build``'s default). Each Job runs the builder in
# an image: ``spec.image``, else the runtime image of the backend (onnxruntime: the CPU runtime
# image; tensorrt: the runtime image on NVIDIA's TensorRT image, whose builder is written to
# TensorRT's documented API and was never run on this project's machines, runtime/BUILD.md).
# No published image carries torch: a torch build runs only when ``spec.image`` names one.
RUNNABLE_BACKENDS = frozenset(BuildBackend)
# Backends whose builds run with no image named (a runtime image of this release carries them).
BACKENDS_WITH_IMAGES = frozenset({BuildBackend.ONNXRUNTIME, BuildBackend.TENSORRT})
GPU_RESOURCE = "nvidia.com/gpu"


class BuildPrecision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


class BuildSource(ApiModel):
    """The FP32 model every engine is built from and compared with: ONNX (onnxruntime,
    tensorrt) or a ``torch.export`` program (torch)."""

    uri: str = Field(
        max_length=2048,
        pattern=STORE_URI_PATTERN,
        description="file:///path (a volume the build pods mount), http(s):// or s3://bucket/key.",
    )
    sha256: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="Verified before the build when set."
    )


class CalibrationSet(ApiModel):
    """An ``.npz`` with one array per model input (samples along the first axis): the
    representative data INT8 ranges are calibrated on."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!has(self.maxSamples) || self.maxSamples >= self.batchSize",
                MAX_SAMPLES_MESSAGE,
                ".maxSamples",
            ),
        )
    )

    uri: str = Field(max_length=2048, pattern=STORE_URI_PATTERN, description="Where it is.")
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN, description="Verified.")
    batch_size: int = Field(default=32, ge=1, le=4096, description="Samples per calibration run.")
    max_samples: int | None = Field(
        default=None, ge=1, description="Unset: every sample; at least batchSize."
    )

    @model_validator(mode="after")
    def _a_batch_at_least(self) -> CalibrationSet:
        if self.max_samples is not None and self.max_samples < self.batch_size:
            raise ValueError(MAX_SAMPLES_MESSAGE)
        return self


class ValidationSet(ApiModel):
    """An ``.npz`` like the calibration set; every engine is gated on it."""

    uri: str = Field(max_length=2048, pattern=STORE_URI_PATTERN, description="Where it is.")
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN, description="Verified.")
    labels: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="An integer array in the same file: labelled accuracy joins the gate.",
    )
    batch_size: int = Field(default=256, ge=1, le=65536, description="Samples per run.")


class ModelBuildSpec(ApiModel):
    """Which engines to build for one model version, where, and how they are gated."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!('int8' in self.precisions) || has(self.calibration)",
                INT8_CALIBRATION_MESSAGE,
                ".calibration",
            ),
            cel(
                "self.backend != 'onnxruntime' || !has(self.targets) || "
                "self.targets.all(t, t == 'cpu')",
                ORT_TARGETS_MESSAGE,
                ".targets",
            ),
            cel(
                "self.backend != 'tensorrt' || !has(self.targets) || !('cpu' in self.targets)",
                GPU_TARGETS_MESSAGE,
                ".targets",
            ),
            cel(
                "!has(self.targets) || self.targets.all(t, "
                f"!{_matches('t', ARCH_LIKE_PATTERN)} || {_matches('t', ARCH_TARGET_PATTERN)})",
                ARCH_TYPO_MESSAGE,
                ".targets",
            ),
            cel(
                "!has(self.calibration) || 'int8' in self.precisions",
                CALIBRATION_WITHOUT_INT8_MESSAGE,
                ".calibration",
            ),
            cel(
                "!has(self.calibration) || (self.calibration.uri != self.validation.uri && "
                "!(has(self.calibration.sha256) && has(self.validation.sha256) && "
                "self.calibration.sha256 == self.validation.sha256))",
                SAME_SET_MESSAGE,
                ".calibration",
            ),
            cel(
                "!has(self.gate) || !has(self.gate.maxAccuracyDrop) || "
                f"self.gate.maxAccuracyDrop == {DEFAULT_MAX_ACCURACY_DROP!r} || "
                "has(self.validation.labels)",
                ACCURACY_WITHOUT_LABELS_MESSAGE,
                ".gate.maxAccuracyDrop",
            ),
            cel(
                "!has(self.gate) || !has(self.gate.maxAbsError) || "
                "!has(self.gate.maxMeanAbsError) || "
                "self.gate.maxMeanAbsError <= self.gate.maxAbsError",
                MEAN_ABOVE_MAX_MESSAGE,
                ".gate.maxMeanAbsError",
            ),
            cel(
                "!has(self.s3) || self.source.uri.startsWith('s3://') || "
                "self.output.startsWith('s3://') || self.validation.uri.startsWith('s3://') || "
                "(has(self.calibration) && self.calibration.uri.startsWith('s3://'))",
                UNUSED_S3_MESSAGE,
                ".s3",
            ),
        )
    )

    model: str = Field(
        max_length=63, pattern=BUILD_NAME_PATTERN, description="The model's name in the store."
    )
    version: str = Field(
        max_length=63,
        pattern=BUILD_NAME_PATTERN,
        description="The version built; a published version is immutable (change inputs: "
        "build a new version).",
    )
    source: BuildSource = Field(
        description="The FP32 model: ONNX, or for torch a torch.export program (.pt2)."
    )
    backend: BuildBackend = Field(
        default=BuildBackend.ONNXRUNTIME,
        description="onnxruntime (target cpu, the CPU runtime image); tensorrt (GPU targets, "
        "the NVIDIA runtime image, one GPU per Job); torch (AOTInductor: targets sm90-like or "
        "cpu; needs spec.image, an image with torch).",
    )
    targets: list[Target] = Field(
        default_factory=list,
        max_length=32,
        description="cpu, a GPU architecture (sm90) or a GPU product as nodes label it "
        "(nvidia.com/gpu.product). Empty: cpu for onnxruntime; every GPU product among the "
        "cluster's nodes for the GPU backends. One Job per target, on a node of that target.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    precisions: list[BuildPrecision] = Field(
        min_length=1,
        max_length=4,
        description="Engines built per target.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    profiles: list[ShapeProfile] = Field(
        default_factory=list,
        max_length=16,
        description="Shape profiles, one per dynamic input.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["input"],
        },
    )
    calibration: CalibrationSet | None = Field(
        default=None, description="Required with int8: the representative data set."
    )
    validation: ValidationSet = Field(description="The data set every engine is gated on.")
    gate: GateSpec = Field(default_factory=GateSpec, description="The accuracy gate.")
    quantization: QuantizationSpec = Field(
        default_factory=QuantizationSpec, description="int8 quantization settings."
    )
    optimization: Literal["basic", "extended", "all"] = Field(
        default="extended", description="ONNX Runtime graph optimization of the fp32 engine."
    )
    output: str = Field(
        max_length=2048,
        pattern=OUTPUT_PATTERN,
        description="Where engines and manifests go: s3://bucket[/prefix] or a directory on a "
        "volume the build pods mount (file:///path); <model>/<version>/<target>/<precision>/ "
        "under it.",
    )
    s3: S3Storage | None = Field(
        default=None, description="The S3-compatible store s3:// URIs name (and its Secret)."
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Builder image; unset: the runtime image of the backend (torch has none: "
        "name an image with torch).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Tolerations of the build pods."
    )
    active_deadline_seconds: int = Field(
        default=3600, ge=60, le=86400, description="A build Job running longer fails."
    )

    @field_validator("precisions", "targets")
    @classmethod
    def _unique(cls, values: list[Any]) -> list[Any]:
        if len(set(values)) != len(values):
            raise ValueError(f"an entry appears twice: {[str(v) for v in values]}")
        return values

    @model_validator(mode="after")
    def _cross_fields(self) -> ModelBuildSpec:
        if BuildPrecision.INT8 in self.precisions and self.calibration is None:
            raise ValueError(INT8_CALIBRATION_MESSAGE)
        cpu_only = self.backend is BuildBackend.ONNXRUNTIME
        if cpu_only and any(t != CPU_TARGET for t in self.targets):
            raise ValueError(ORT_TARGETS_MESSAGE)
        if self.backend is BuildBackend.TENSORRT and CPU_TARGET in self.targets:
            raise ValueError(GPU_TARGETS_MESSAGE)
        if any(
            re.match(ARCH_LIKE_PATTERN, t) and not re.match(ARCH_TARGET_PATTERN, t)
            for t in self.targets
        ):
            raise ValueError(ARCH_TYPO_MESSAGE)
        calibration, gate = self.calibration, self.gate
        if calibration is not None and BuildPrecision.INT8 not in self.precisions:
            raise ValueError(CALIBRATION_WITHOUT_INT8_MESSAGE)
        if calibration is not None and (
            calibration.uri == self.validation.uri
            or (calibration.sha256 is not None and calibration.sha256 == self.validation.sha256)
        ):
            raise ValueError(SAME_SET_MESSAGE)
        if gate.max_accuracy_drop != DEFAULT_MAX_ACCURACY_DROP and not self.validation.labels:
            raise ValueError(ACCURACY_WITHOUT_LABELS_MESSAGE)
        if (
            gate.max_abs_error is not None
            and gate.max_mean_abs_error is not None
            and gate.max_mean_abs_error > gate.max_abs_error
        ):
            raise ValueError(MEAN_ABOVE_MAX_MESSAGE)
        if self.s3 is not None and not any(uri.startswith("s3://") for uri in self.store_uris()):
            raise ValueError(UNUSED_S3_MESSAGE)
        return self

    def store_uris(self) -> list[str]:
        """Every URI of the build: source, data sets and output."""
        calibration = [self.calibration.uri] if self.calibration is not None else []
        return [self.source.uri, *calibration, self.validation.uri, self.output]


class BuildPhase(StrEnum):
    """Where one target's build stands."""

    PENDING = "Pending"  # no Job yet, or its pod not started
    RUNNING = "Running"
    BUILT = "Built"  # every engine passed its gate and is published
    REFUSED = "Refused"  # the Job finished; the gate refused at least one engine
    FAILED = "Failed"  # the Job failed without verdicts: reason and log tail say why
    UNAVAILABLE = "Unavailable"  # nothing can build it here (no builder, no node)


class EngineArtifact(ApiModel):
    """One engine of one target: its verdict and, when published, where it is."""

    precision: str = Field(max_length=16, description="fp32, fp16, int8.")
    published: bool = Field(description="Passed its gate and written to the store.")
    uri: str | None = Field(default=None, max_length=2048, description="The engine (published).")
    sha256: str | None = Field(default=None, max_length=64, description="The engine's digest.")
    manifest: str | None = Field(default=None, max_length=2048, description="Its manifest.")
    build_key: str | None = Field(default=None, max_length=64, description="Inputs' digest.")
    top1_agreement: float | None = Field(default=None, description="Measured by the gate.")
    reason: str = Field(default="", max_length=1024, description="The gate's verdict.")


class TargetStatus(ApiModel):
    """One target's Job and engines."""

    target: str = Field(max_length=63, description="cpu, sm90 or a GPU product.")
    phase: BuildPhase = Field(description="Pending, Running, Built, Refused, Failed, Unavailable.")
    job: str | None = Field(default=None, max_length=63, description="The Job building it.")
    inputs: str = Field(default="", max_length=64, description="Digest of the Job's inputs.")
    reason: str = Field(default="", max_length=128, description="CamelCase why, when not Built.")
    message: str = Field(default="", max_length=4096, description="What to fix, log's tail.")
    artifacts: list[EngineArtifact] = Field(
        default_factory=list, max_length=8, description="Engines and their verdicts."
    )


class ModelBuildStatus(ApiModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(default=None, description="Generation acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Ready (every target built and published), Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    targets: list[TargetStatus] = Field(
        default_factory=list, max_length=32, description="Per target: Job, phase, engines."
    )
    summary: str = Field(default="", max_length=256, description="e.g. 3/4 published.")


class ModelBuild(Resource):
    """Builds engines of one model version for each target and gates them (runtime/BUILD.md)."""

    api_version: Literal["serving.tidal.dev/v1alpha1"] = Field(
        default="serving.tidal.dev/v1alpha1", description="serving.tidal.dev/v1alpha1"
    )
    kind: Literal["ModelBuild"] = Field(default="ModelBuild", description="ModelBuild")
    spec: ModelBuildSpec = Field(description="Desired state.")
    status: ModelBuildStatus | None = Field(default=None, description="Observed state.")


BUILD_METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": "Name of the ModelBuild (a DNS subdomain; its Jobs are named from it).",
            "maxLength": 253,
            "pattern": DNS_SUBDOMAIN_PATTERN,
        }
    },
}


def parse_model_build(body: dict[str, Any]) -> ModelBuild:
    """Parse a ModelBuild as the API server returns it, with the status it holds (a status
    this operator cannot read counts as none); raises ``pydantic.ValidationError`` when the
    spec breaks the API's rules."""
    obj = {k: v for k, v in body.items() if k in ("apiVersion", "kind", "metadata", "spec")}
    build = ModelBuild.model_validate(obj)
    return build.model_copy(update={"status": previous_status(body)})


def previous_status(body: dict[str, Any]) -> ModelBuildStatus | None:
    """The status a stored ModelBuild holds; None when absent or not readable."""
    try:
        return ModelBuildStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None
