"""The parts of a build spec that the builder (``tidal.runtime.builder``) and the operator's
ModelBuild API (``tidal.operator.core.buildapi``) share: shape profiles, the accuracy gate and
the INT8 quantization settings. One definition, so that what a user writes in a ModelBuild is
what the builder reads and records in each manifest (and in the build key).

Plain pydantic (camelCase on the wire, unknown fields are errors, immutable); no I/O.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


RANK_MESSAGE = "min, opt and max must have the same rank"


class ShapeProfile(_Model):
    """The shapes one input takes: the engine is run at each of min, opt and max before it is
    gated, and the profile is recorded in the manifest (TensorRT builds from the same record)."""

    # The rank rule for the API server too (a CRD's CEL rule, with the field it names).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.min.size() == self.opt.size() && "
                    "self.opt.size() == self.max.size()",
                    "message": f"profiles[]: {RANK_MESSAGE}",
                }
            ]
        }
    )

    input: str = Field(min_length=1, max_length=256, description="The model input's name.")
    min: list[int] = Field(min_length=1, max_length=8, description="Smallest shape.")
    opt: list[int] = Field(min_length=1, max_length=8, description="Shape optimized for.")
    max: list[int] = Field(min_length=1, max_length=8, description="Largest shape.")

    @model_validator(mode="after")
    def _ordered(self) -> ShapeProfile:
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(
                f"input {self.input!r}: {RANK_MESSAGE} "
                f"({len(self.min)}, {len(self.opt)}, {len(self.max)})"
            )
        for axis, (lo, mid, hi) in enumerate(zip(self.min, self.opt, self.max, strict=True)):
            if not 1 <= lo <= mid <= hi:
                raise ValueError(
                    f"input {self.input!r} axis {axis}: need 1 <= min <= opt <= max, "
                    f"got {lo}, {mid}, {hi}"
                )
        return self


class GateSpec(_Model):
    """How much an engine may lose against the FP32 reference on the validation set; an engine
    that loses more is not published, and no InferenceService pod is ever pointed at it."""

    output: str | None = Field(
        default=None, max_length=256, description="Output compared; unset: the model's first."
    )
    min_top1_agreement: float = Field(
        default=0.99, ge=0, le=1, description="Share of samples whose top class is unchanged."
    )
    max_accuracy_drop: float = Field(
        default=0.01, ge=0, le=1, description="Labelled accuracy lost (needs validation.labels)."
    )
    max_abs_error: float | None = Field(default=None, ge=0, description="Unset: not checked.")
    max_mean_abs_error: float | None = Field(default=None, ge=0, description="Unset: unchecked.")


class QuantizationSpec(_Model):
    """ONNX Runtime static quantization (``quantize_static``) settings (int8)."""

    method: Literal["minmax", "entropy", "percentile"] = Field(
        default="minmax", description="Calibration method."
    )
    format: Literal["qdq", "qoperator"] = Field(default="qdq", description="Graph format.")
    activation_type: Literal["int8", "uint8"] = Field(default="int8", description="Activations.")
    weight_type: Literal["int8", "uint8"] = Field(default="int8", description="Weights.")
    per_channel: bool = Field(default=False, description="Per-channel weight scales.")
