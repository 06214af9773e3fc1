"""``spec.rollout``: the baseline pool kept warm for rollback, the SLO that decides, the
manual traffic switch and the staged rollout of a new primary."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from .base import ApiModel, _matches, _rules, cel
from .engines import MAX_MODELS, Memory, Model
from .formats import (
    DURATION_PATTERN,
    PERCENT_PATTERN,
    Duration,
    Percent,
    duration_seconds,
    percent_value,
)
from .pod import RuntimeOverride


class ActivePool(StrEnum):
    """Which pool the Service routes to: ``auto`` lets the SLO logic decide."""

    AUTO = "auto"
    PRIMARY = "primary"
    BASELINE = "baseline"


class BreachAction(StrEnum):
    """What the operator does when the primary pool breaches its SLO."""

    ROLLBACK = "rollback"
    ALERT = "alert"


OVERFLOW_MESSAGE = (
    "spec.rollout.baseline.overflow needs spec.rollout.baseline.minReplicas of at least 1: a "
    "baseline kept at zero replicas has none to share a surge with"
)


class Baseline(ApiModel):
    """The validated configuration kept warm for rollback; unset fields copy the primary's."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel("!self.overflow || self.minReplicas >= 1", OVERFLOW_MESSAGE, ".overflow")
        )
    )

    runtime: RuntimeOverride | None = Field(
        default=None,
        description="Runtime fields of the baseline pool that differ from the primary's: each "
        "field named here replaces the primary's (a nested value such as resources, env or "
        "engineCache is replaced whole, not merged deeper); unset: the primary's runtime.",
    )
    models: list[Model] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MODELS,
        description="Models of the baseline pool; unset: the primary's.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    memory: Memory | None = Field(
        default=None, description="Memory budgets of the baseline pool; unset: the primary's."
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas the baseline keeps while it does not serve traffic.",
    )
    overflow: bool = Field(
        default=False,
        description="During a surge, while the promoted primary is short of ready replicas "
        "(its new ones still warm), the Service also selects the baseline's ready replicas "
        "(they are warm and paid for), as long as the baseline meets the SLO. It serves the "
        "baseline's version to part of the traffic for that time; off by default. Needs "
        "minReplicas >= 1.",
    )

    @model_validator(mode="after")
    def _overflow_has_replicas(self) -> Baseline:
        if self.overflow and self.min_replicas < 1:
            raise ValueError(OVERFLOW_MESSAGE)
        return self


class Slo(ApiModel):
    """Service level objectives of the primary pool; a breach sustained `for` triggers onBreach."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "has(self.p99Ms) || has(self.errorRate) || has(self.coldStartMs) || "
                "has(self.gpuMemoryHeadroom) || has(self.transferWaitMs)",
                "spec.rollout.slo needs at least one objective (p99Ms, errorRate, coldStartMs, "
                "gpuMemoryHeadroom or transferWaitMs)",
            ),
            cel(
                f"!{_matches('self.__for__', DURATION_PATTERN)} || "
                "(duration(self.__for__) >= duration('1s') && "
                "duration(self.__for__) <= duration('24h'))",
                "spec.rollout.slo.for must be a duration between 1s and 24h",
                ".for",
            ),
            cel(
                "!has(self.gpuMemoryHeadroom) || "
                f"!{_matches('self.gpuMemoryHeadroom', PERCENT_PATTERN)} || "
                "double(self.gpuMemoryHeadroom.substring(0, "
                "self.gpuMemoryHeadroom.size() - 1)) <= 100.0",
                "spec.rollout.slo.gpuMemoryHeadroom must be a percentage between 0% and 100%",
                ".gpuMemoryHeadroom",
            ),
        )
    )

    p99_ms: float | None = Field(
        default=None, gt=0, le=600000, description="Hot-path P99 latency bound, milliseconds."
    )
    error_rate: float | None = Field(
        default=None, ge=0, le=1, description="Highest tolerated fraction of failed requests."
    )
    cold_start_ms: float | None = Field(
        default=None,
        gt=0,
        le=3600000,
        description="Longest tolerated cold model load (separate from the hot P99), ms.",
    )
    gpu_memory_headroom: Percent | None = Field(
        default=None, description="GPU memory that must stay free, as a percentage, e.g. 10%."
    )
    transfer_wait_ms: float | None = Field(
        default=None,
        gt=0,
        le=3600000,
        description="P99 bound on the time requests wait for host->device weight transfer "
        "(requests held by an engine load; separate from the hot P99), ms.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1000000,
        description="Requests a window needs before p99Ms or errorRate can count as breached.",
    )
    for_: Duration = Field(
        default="60s",
        alias="for",
        description="How long a breach must last before onBreach acts, e.g. 60s.",
    )

    @model_validator(mode="after")
    def _objectives(self) -> Slo:
        if (
            self.p99_ms is None
            and self.error_rate is None
            and self.cold_start_ms is None
            and self.gpu_memory_headroom is None
            and self.transfer_wait_ms is None
        ):
            raise ValueError(
                "spec.rollout.slo needs at least one objective (p99Ms, errorRate, coldStartMs, "
                "gpuMemoryHeadroom or transferWaitMs)"
            )
        if not 1 <= duration_seconds(self.for_) <= 86400:
            raise ValueError("spec.rollout.slo.for must be a duration between 1s and 24h")
        headroom = percent_value(self.gpu_memory_headroom or "")
        if headroom is not None and headroom > 100:
            raise ValueError(
                "spec.rollout.slo.gpuMemoryHeadroom must be a percentage between 0% and 100%"
            )
        return self


class Rollout(ApiModel):
    """Two-pool rollout: a baseline pool to fall back to, and the SLO that decides."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "self.activePool != 'baseline' || has(self.baseline)",
                "spec.rollout.activePool: baseline requires spec.rollout.baseline",
                ".activePool",
            ),
            cel(
                "!has(self.slo) || self.onBreach != 'rollback' || has(self.baseline)",
                "spec.rollout.onBreach: rollback requires spec.rollout.baseline",
                ".onBreach",
            ),
            cel(
                "size(self.steps) == 0 || "
                "(self.steps.isSorted() && self.steps[size(self.steps) - 1] == 100)",
                "spec.rollout.steps must increase and end with 100",
                ".steps",
            ),
        )
    )

    baseline: Baseline | None = Field(
        default=None, description="The baseline pool; unset: a single primary pool."
    )
    slo: Slo | None = Field(default=None, description="Objectives the primary pool must meet.")
    on_breach: BreachAction = Field(
        default=BreachAction.ROLLBACK,
        description="rollback: route to the baseline; alert: only report the breach.",
    )
    active_pool: ActivePool = Field(
        default=ActivePool.AUTO,
        description="Pool that gets traffic: auto (SLO decides), or a manual primary/baseline.",
    )
    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [25, 50, 100],
        min_length=1,
        max_length=10,
        description="Staged rollout of a new primary beside the baseline: the primary's share "
        "of serving replicas at each step, in percent, ending with 100.",
        json_schema_extra={"x-kubernetes-list-type": "set", "default": [25, 50, 100]},
    )
    step_seconds: int = Field(
        default=60, ge=0, le=86400, description="How long each step is evaluated, seconds."
    )
    drain_seconds: int = Field(
        default=10, ge=0, le=3600, description="A pool that lost traffic keeps its size this long."
    )
    control_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Primary replicas kept (without traffic) for comparison after a rollback.",
    )

    @model_validator(mode="after")
    def _pool_references(self) -> Rollout:
        if self.active_pool is ActivePool.BASELINE and self.baseline is None:
            raise ValueError("spec.rollout.activePool: baseline requires spec.rollout.baseline")
        if (
            self.slo is not None
            and self.on_breach is BreachAction.ROLLBACK
            and self.baseline is None
        ):
            raise ValueError("spec.rollout.onBreach: rollback requires spec.rollout.baseline")
        if self.steps != sorted(set(self.steps)) or self.steps[-1] != 100:
            raise ValueError("spec.rollout.steps must increase and end with 100")
        return self
