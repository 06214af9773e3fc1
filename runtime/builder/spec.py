"""The build spec: what one build of one model version is asked to produce.

A typed model at the boundary (camelCase on the wire, unknown fields are errors); invalid specs
raise :class:`BuildSpecError` whose message names every offending field. The spec is what a
Kubernetes Job will be handed (one per target), so it carries no credentials: ``s3`` says where
the store is, the standard AWS variables or the ambient identity say who is asking.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

# Shared with the operator's ModelBuild API (re-exported: the builder's modules import them here).
from ...common.buildspec import GateSpec as GateSpec
from ...common.buildspec import QuantizationSpec as QuantizationSpec
from ...common.buildspec import ShapeProfile as ShapeProfile
from ...common.settings import format_validation_error
from ..config import S3Spec

Name = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$", max_length=63)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
BuildPrecision = Literal["fp32", "int8", "fp16", "bf16", "fp8"]
# The precisions each backend builds. Torch fp8 is not offered: its packages compiled on an
# H200 but did not load (runtime/BUILD.md, "torch (AOTInductor) on a GPU").
BACKEND_PRECISIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("fp32", "int8"),
    "torch": ("fp32", "fp16", "bf16"),
    "tensorrt": ("fp32", "fp16", "bf16", "int8"),
}
ARCH_TARGET = re.compile(r"^sm\d{2,3}$")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class SourceRef(_Model):
    """The FP32 model every engine is built from and compared with: an ONNX file, or for the
    torch builder a ``torch.export`` program saved by ``torch.export.save`` (``.pt2``)."""

    uri: str = Field(min_length=1, description="a local path, file://, http(s):// or s3://")
    sha256: Sha256 | None = Field(default=None, description="verified when given")


class CalibrationSet(_Model):
    """An ``.npz`` file with one array per model input, named after the input, samples along
    the first axis: the representative data INT8 ranges are calibrated on."""

    uri: str = Field(min_length=1)
    sha256: Sha256 | None = None
    batch_size: int = Field(default=32, ge=1, le=4096, description="samples per calibration run")
    max_samples: int | None = Field(default=None, ge=1, description="None: every sample")


class ValidationSet(_Model):
    """An ``.npz`` file like the calibration set; ``labels`` names an array of integer class
    labels in the same file (labelled accuracy is then part of the gate)."""

    uri: str = Field(min_length=1)
    sha256: Sha256 | None = None
    labels: str | None = Field(default=None, min_length=1)
    batch_size: int = Field(default=256, ge=1, le=65536)


class BuildSpec(_Model):
    """One build: a model version, its source, and the engines wanted for one target."""

    model: Name
    version: Name
    source: SourceRef
    backend: Literal["onnxruntime", "torch", "tensorrt"] = "onnxruntime"
    target: str = Field(
        default="cpu",
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$",
        description="where the engines run: cpu; a GPU architecture (sm90) for torch; for "
        "tensorrt a GPU architecture or a GPU product as nodes label it (the build runs on it)",
    )
    precisions: list[BuildPrecision] = Field(min_length=1)
    profiles: list[ShapeProfile] = Field(default_factory=list, validate_default=True)
    calibration: CalibrationSet | None = Field(default=None, validate_default=True)
    validation: ValidationSet
    gate: GateSpec = Field(default_factory=GateSpec)
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
    optimization: Literal["basic", "extended", "all"] = Field(
        default="extended",
        description="ONNX Runtime graph optimization level of the fp32 engine; 'all' adds "
        "layout changes tied to the build machine's CPU",
    )
    output: str = Field(min_length=1, description="a local directory or s3://bucket[/prefix]")
    s3: S3Spec = Field(default_factory=S3Spec)

    @field_validator("precisions")
    @classmethod
    def _unique(cls, precisions: list[str]) -> list[str]:
        if len(set(precisions)) != len(precisions):
            raise ValueError(f"a precision appears twice: {precisions}")
        return precisions

    @field_validator("profiles")
    @classmethod
    def _one_per_input(cls, profiles: list[ShapeProfile]) -> list[ShapeProfile]:
        names = [p.input for p in profiles]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"more than one profile for input {', '.join(twice)}")
        return profiles

    @field_validator("calibration")
    @classmethod
    def _calibration_for_int8(
        cls, calibration: CalibrationSet | None, info: ValidationInfo
    ) -> CalibrationSet | None:
        if calibration is None and "int8" in info.data.get("precisions", ()):
            raise ValueError("required when precisions include int8 (static quantization)")
        return calibration

    @field_validator("target")
    @classmethod
    def _target_of_backend(cls, target: str, info: ValidationInfo) -> str:
        backend = info.data.get("backend")
        if backend == "onnxruntime" and target != "cpu":
            raise ValueError(f"the onnxruntime builder builds for cpu, not {target}")
        if backend == "torch" and target != "cpu" and not ARCH_TARGET.match(target):
            raise ValueError(
                f"the torch builder compiles for a GPU architecture (sm90) or cpu, not {target}"
            )
        if backend == "tensorrt" and target == "cpu":
            raise ValueError("the tensorrt builder builds for a GPU, not cpu")
        return target

    @field_validator("precisions")
    @classmethod
    def _made_by_backend(cls, precisions: list[str], info: ValidationInfo) -> list[str]:
        backend = info.data.get("backend")
        wanted = BACKEND_PRECISIONS.get(str(backend), ())
        other = [p for p in precisions if p not in wanted]
        if backend is not None and other:
            raise ValueError(f"the {backend} builder makes {list(wanted)}, not {other}")
        return precisions

    @field_validator("profiles")
    @classmethod
    def _profiles_for_torch(
        cls, profiles: list[ShapeProfile], info: ValidationInfo
    ) -> list[ShapeProfile]:
        if info.data.get("backend") == "torch" and not profiles:
            raise ValueError(
                "required by the torch builder (their batch axis, min..max, becomes the "
                "package's dynamic batch dimension)"
            )
        return profiles

    @field_validator("output")
    @classmethod
    def _output_scheme(cls, output: str) -> str:
        scheme = output.split("://", 1)[0] if "://" in output else ""
        if scheme not in ("", "file", "s3"):
            raise ValueError(f"expected a local directory or s3://bucket[/prefix], got {output}")
        if scheme == "s3" and not output[len("s3://") :].split("/", 1)[0]:
            raise ValueError(f"expected s3://bucket[/prefix], got {output}")
        return output


class BuildError(Exception):
    """Base of the builder's errors; each message names the spec field or the criterion.

    ``BuildSpecError``: the spec cannot be read or is invalid. ``ModelError``: the
    source, a data set or a profile does not fit the model. ``FetchError`` (build): an input
    cannot be read from its store. ``ArtifactConflict`` (build): a published engine of this
    version was built from other inputs. ``GateRefused`` (build): an engine lost more than
    the accuracy gate allows and was not published."""


class BuildSpecError(BuildError):
    """The build spec could not be read or is invalid; the message names the field."""


class ModelError(BuildError):
    """The source model, a data set or a profile does not fit; the message names which."""


def parse_build_spec(data: Any) -> BuildSpec:
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        raise BuildSpecError(format_validation_error(exc, "build spec")) from None


def read_build_spec(path: str | Path) -> BuildSpec:
    """A build spec from a YAML or JSON file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BuildSpecError(f"cannot read build spec {path}: {exc}") from None
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise BuildSpecError(f"build spec {path} is not valid YAML/JSON: {exc}") from None
    return parse_build_spec(data)
