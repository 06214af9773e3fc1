"""``spec.autoscaling``: replica bounds, the autoscaler's targets, warm standby and scale to
zero."""

from __future__ import annotations

from enum import StrEnum

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from .base import ApiModel, _rules, cel


class StandbyTier(StrEnum):
    """Where a warm standby replica keeps its engines."""

    DEVICE = "device"  # loaded and warm on the device: promotion is a label flip
    HOST = "host"  # fetched, verified and staged in host memory: promotion loads and warms


HOST_TIER_MESSAGE = (
    "spec.autoscaling.standbyTier: host needs spec.autoscaling.standbyReplicas (or "
    "maxStandbyReplicas) above 0: there is no standby replica to keep host-warm"
)


class Autoscaling(ApiModel):
    """Replica bounds and targets for the autoscaler (primary pool)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "self.maxReplicas < 1 || self.minReplicas <= self.maxReplicas",
                "spec.autoscaling.minReplicas must be <= spec.autoscaling.maxReplicas",
                ".minReplicas",
            ),
            cel(
                "self.maxReplicas < 1 || self.standbyReplicas <= self.maxReplicas",
                "spec.autoscaling.standbyReplicas must be <= spec.autoscaling.maxReplicas",
                ".standbyReplicas",
            ),
            cel(
                "!has(self.maxStandbyReplicas) || (self.maxStandbyReplicas >= "
                "self.standbyReplicas && self.maxStandbyReplicas <= self.maxReplicas)",
                "spec.autoscaling.maxStandbyReplicas must be >= standbyReplicas and <= maxReplicas",
                ".maxStandbyReplicas",
            ),
            cel(
                "self.standbyTier != 'host' || self.standbyReplicas > 0 || "
                "(has(self.maxStandbyReplicas) && self.maxStandbyReplicas > 0)",
                HOST_TIER_MESSAGE,
                ".standbyTier",
            ),
        )
    )

    min_replicas: int = Field(
        default=1, ge=0, le=1000, description="Fewest replicas; 0 allows scale to zero."
    )
    max_replicas: int = Field(default=10, ge=1, le=1000, description="Most replicas.")
    target_utilization: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Share of a replica's capacity to load it with. The operator learns the "
        "capacity (requests per second at saturation) from the runtime's batch timings.",
    )
    target_queue_depth: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="In-flight plus queued requests per ready replica to aim for; when set it "
        "replaces targetUtilization as the target.",
    )
    target_p99_ms: float | None = Field(
        default=None,
        gt=0,
        le=600000,
        description="Hot-path P99 latency to stay under, in milliseconds; unset: queue only.",
    )
    standby_replicas: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Warm replicas kept out of the Service and promoted at once on a surge "
        "(with maxStandbyReplicas: the fewest).",
    )
    max_standby_replicas: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Size the standby from the surges the service has seen: enough learned "
        "capacity for the largest rise of the request rate within one warm-up (remembered "
        "with a one-hour half-life), between standbyReplicas and this. Unset: "
        "standbyReplicas, fixed.",
    )
    standby_tier: StandbyTier = Field(
        default=StandbyTier.DEVICE,
        description="device: standby engines stay on the device (promotion is a label flip); "
        "host: they are staged in host memory, off the device (promotion loads them from there "
        "and warms them up, about a second, before the replica joins the Service).",
    )
    scale_down_delay_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="How long demand must stay low before replicas are removed.",
    )
    scale_to_zero_after_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="With minReplicas 0: seconds without any request before the last replica "
        "(and the standby) is removed. A request held at the gateway or demand the service's "
        "forecast expects within one time-to-routable (plus 30 s) keeps it, and brings a "
        "service at zero back. A new service keeps its first replica until one has been Ready "
        "(at most 600 s), so that a model that cannot load shows before it goes to zero.",
    )
    burst_buffer: bool = Field(
        default=False,
        description="Keep the gateway (the same program as the activator: one small CPU pod) in "
        "front of the service as a burst buffer: it sends each replica at most twice what it "
        "executes at once (its batch slots x maxBatchSize) and holds the rest, oldest first, "
        "for the first replica with a free slot, so a surge never queues on the one ready "
        "replica while new ones stand idle; what it holds counts as queued demand for the "
        "autoscaler. Always on with minReplicas 0 (the activator) and for spec.fleet. Costs one "
        "hop (about a millisecond) and the gateway pod.",
    )
    late_request_gpu_seconds: float = Field(
        default=3600.0,
        gt=0,
        le=31536000,
        description="With minReplicas 0: what one late request (one that finds the service at "
        "zero where the idle timer would still have kept a replica) is worth to you, in "
        "GPU-seconds. The service goes to zero before scaleToZeroAfterSeconds only where its "
        "learned demand says that saves more GPU time than this per late request it is expected "
        "to cause: at the default (one GPU-hour) only hours with fewer than one request an hour "
        "go to zero early; a lower price trades late requests for GPU time.",
    )
    hold_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="With minReplicas 0 or burstBuffer (and no spec.fleet): longest the gateway "
        "in front of the service holds a request while it wakes from zero or waits for a free "
        "replica; then 503 with Retry-After (a "
        "request's own timeout parameter shortens it). Unset: 120, twice the time-to-routable "
        "assumed of a GPU replica until one is measured. A fleet's gateway holds for "
        "spec.fleet.gateway.holdTimeoutSeconds instead.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must be <= spec.autoscaling.maxReplicas")
        if self.standby_replicas > self.max_replicas:
            raise ValueError(
                "spec.autoscaling.standbyReplicas must be <= spec.autoscaling.maxReplicas"
            )
        top = self.max_standby_replicas
        if top is not None and not self.standby_replicas <= top <= self.max_replicas:
            raise ValueError(
                "spec.autoscaling.maxStandbyReplicas must be >= standbyReplicas and <= maxReplicas"
            )
        if self.standby_tier is StandbyTier.HOST and self.standby_replicas == 0 and not top:
            raise ValueError(HOST_TIER_MESSAGE)
        return self
