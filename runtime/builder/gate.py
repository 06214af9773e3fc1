"""The accuracy gate: how far an engine's outputs are from the FP32 reference's on the
validation set (:func:`measure`), and whether that is within what the gate allows
(:func:`judge`). Pure: arrays and thresholds in, a verdict with its reasons out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .spec import GateSpec, ModelError

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class Reference:
    """What every engine of a build is measured against: the FP32 source's ``output`` over the
    validation set (``expected``), and the set's labels when it has them."""

    output: str
    expected: Array
    labels: Array | None
    samples: int


def gate_output(wanted: str | None, outputs: list[str]) -> str:
    """The output the gate compares (``gate.output``, default the model's first)."""
    output = wanted or outputs[0]
    if output not in outputs:
        raise ModelError(
            f"gate.output: the model has no output {output!r} (its outputs: {outputs})"
        )
    return output


def validation_labels(name: str | None, data: dict[str, Array]) -> Array | None:
    """The validation set's labels array (``validation.labels``), if the spec names one."""
    if name is None:
        return None
    labels = data.get(name)
    if labels is None:
        raise ModelError(f"validation.labels: the validation set has no array {name!r}")
    return np.asarray(labels)


@dataclass(frozen=True)
class AccuracyMetrics:
    """An engine against the reference on ``samples`` validation samples."""

    samples: int
    top1_agreement: float  # share of samples whose arg-max class is the reference's
    max_abs_error: float
    mean_abs_error: float
    reference_accuracy: float | None = None  # against the labels, when there are labels
    candidate_accuracy: float | None = None

    @property
    def accuracy_drop(self) -> float | None:
        if self.reference_accuracy is None or self.candidate_accuracy is None:
            return None
        return self.reference_accuracy - self.candidate_accuracy


def measure(reference: Array, candidate: Array, labels: Array | None = None) -> AccuracyMetrics:
    """Compare one output of both models; classes are along the last axis, samples along the
    first (an output with one value per sample has no top class: agreement is then exact
    equality of the sign, the usual binary decision)."""
    if reference.shape != candidate.shape:
        raise ValueError(f"output shapes differ: reference {reference.shape}, {candidate.shape}")
    samples = int(reference.shape[0]) if reference.ndim else 1
    ref = reference.astype(np.float64).reshape(samples, -1)
    cand = candidate.astype(np.float64).reshape(samples, -1)
    error = np.abs(ref - cand)
    if ref.shape[1] > 1:
        ref_top, cand_top = ref.argmax(axis=1), cand.argmax(axis=1)
    else:
        ref_top, cand_top = (ref[:, 0] > 0).astype(np.int64), (cand[:, 0] > 0).astype(np.int64)
    # NaN anywhere makes the errors NaN, which no threshold admits
    metrics = AccuracyMetrics(
        samples=samples,
        top1_agreement=float((ref_top == cand_top).mean()) if samples else math.nan,
        max_abs_error=float(error.max()) if error.size else 0.0,
        mean_abs_error=float(error.mean()) if error.size else 0.0,
    )
    if labels is None:
        return metrics
    truth = labels.reshape(-1).astype(np.int64)
    if truth.shape[0] != samples:
        raise ValueError(f"{truth.shape[0]} labels for {samples} validation samples")
    return AccuracyMetrics(
        samples=metrics.samples,
        top1_agreement=metrics.top1_agreement,
        max_abs_error=metrics.max_abs_error,
        mean_abs_error=metrics.mean_abs_error,
        reference_accuracy=float((ref_top == truth).mean()),
        candidate_accuracy=float((cand_top == truth).mean()),
    )


@dataclass(frozen=True)
class Check:
    """One criterion of the gate: the measured value against its limit."""

    criterion: str  # the GateSpec field, camelCase as in the spec
    metric: str
    value: float
    limit: float
    at_least: bool  # the value must be >= the limit (else <=)

    @property
    def passed(self) -> bool:
        # NaN fails either way: comparisons with NaN are false
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def describe(self) -> str:
        relations = (">=", "<") if self.at_least else ("<=", ">")
        relation = relations[0] if self.passed else relations[1]
        return f"{self.metric} {self.value:.6g} {relation} {self.criterion} {self.limit:.6g}"


@dataclass(frozen=True)
class GateVerdict:
    """Whether an engine may be published, and why."""

    passed: bool
    checks: tuple[Check, ...]
    skipped: tuple[str, ...] = ()  # criteria that could not be checked, and why

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def reason(self) -> str:
        """The failed criteria with their numbers, or every check when all passed."""
        shown = self.failed if not self.passed else self.checks
        head = "refused: " if not self.passed else "passed: "
        return head + "; ".join(c.describe() for c in shown)


def judge(metrics: AccuracyMetrics, gate: GateSpec) -> GateVerdict:
    """The gate's verdict: every configured criterion must hold. Labelled accuracy is checked
    only when the validation set has labels (reported as skipped otherwise)."""
    checks = [
        Check(
            "minTop1Agreement",
            "top1Agreement",
            metrics.top1_agreement,
            gate.min_top1_agreement,
            at_least=True,
        )
    ]
    skipped: list[str] = []
    drop = metrics.accuracy_drop
    if drop is None:
        skipped.append("maxAccuracyDrop: the validation set has no labels")
    else:
        checks.append(
            Check("maxAccuracyDrop", "accuracyDrop", drop, gate.max_accuracy_drop, at_least=False)
        )
    if gate.max_abs_error is not None:
        checks.append(
            Check("maxAbsError", "maxAbsError", metrics.max_abs_error, gate.max_abs_error, False)
        )
    if gate.max_mean_abs_error is not None:
        checks.append(
            Check(
                "maxMeanAbsError",
                "meanAbsError",
                metrics.mean_abs_error,
                gate.max_mean_abs_error,
                False,
            )
        )
    return GateVerdict(
        passed=all(c.passed for c in checks), checks=tuple(checks), skipped=tuple(skipped)
    )


class RefusedBeforeBuild(Exception):
    """The gate refused the model an engine would be built from (the Q/DQ model of a TensorRT
    INT8 plan, judged where ONNX Runtime executes it): no engine is made, and the build records
    the refusal like any other, naming the file judged (``judged``)."""

    def __init__(
        self, judged: Path, metrics: AccuracyMetrics, verdict: GateVerdict, used: int | None
    ) -> None:
        super().__init__(verdict.reason)
        self.judged, self.metrics, self.verdict, self.used = judged, metrics, verdict, used
