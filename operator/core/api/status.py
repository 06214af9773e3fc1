"""``status``: what the operator observed and decided, written through the status subresource
(conditions, replica counts per pool, signals, decisions, the autoscaler's and rollout's state,
the fleet's placement, the engines served from ModelBuilds)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import (
    Field,
)

from .base import ApiModel


class PoolName(StrEnum):
    """The two pools of an InferenceService (one Deployment each)."""

    PRIMARY = "primary"
    BASELINE = "baseline"


class ConditionStatus(StrEnum):
    """Kubernetes condition status."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A condition in Kubernetes' standard form (metav1.Condition)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready or Degraded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, description="CamelCase reason for the last change.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(
        description="When the status last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed from."
    )


class PoolStatus(ApiModel):
    """Replica counts of one pool."""

    desired: int = Field(default=0, ge=0, description="Replicas the operator asks for.")
    replicas: int = Field(default=0, ge=0, description="Pods that exist.")
    ready: int = Field(default=0, ge=0, description="Ready pods routed by the Service.")
    warming: int = Field(default=0, ge=0, description="Pods loading or warming their models.")
    standby: int = Field(default=0, ge=0, description="Ready pods held out of the Service.")
    updated: int = Field(default=0, ge=0, description="Pods running the current template.")
    metrics: ServiceMetrics | None = Field(default=None, description="Latest signals.")


class TimeToRoutable(ApiModel):
    """How long the pool's recently started replicas took from creation to Ready, by phase
    (medians over the replicas that turned Ready in the last 10 minutes)."""

    samples: int = Field(default=0, ge=0, description="Replicas measured.")
    total_seconds: float | None = Field(
        default=None, ge=0, description="Pod created to Ready (the API's 1 s resolution)."
    )
    schedule_seconds: float | None = Field(
        default=None, ge=0, description="Created to scheduled (1 s resolution)."
    )
    process_start_seconds: float | None = Field(
        default=None, ge=0, description="Scheduled to the runtime's container running (1 s)."
    )
    runtime_seconds: float | None = Field(
        default=None,
        ge=0,
        description="The runtime's own start to Ready (tidal_startup_seconds): engines fetched, "
        "deserialized, copied and warmed.",
    )
    promote_seconds: float | None = Field(
        default=None,
        ge=0,
        description="The last promotion of standby replicas: for host-warm standby the load "
        "back onto the device and its warm-up, then the label flip that routes them.",
    )
    phases: dict[str, float] = Field(
        default_factory=dict,
        max_length=16,
        description="Seconds per engine load phase (tidal_engine_load_seconds: fetch, "
        "deserialize, warmup; the torch backend adds stage, h2d, profile), summed over models.",
    )


class ServiceMetrics(ApiModel):
    """Latest signals of one pool: pod scrapes for the queue, Prometheus for the rest."""

    queue_depth: float | None = Field(
        default=None, description="In-flight plus queued requests of the pool's serving pods."
    )
    arrival_rate: float | None = Field(default=None, description="Requests per second.")
    p99_hot_ms: float | None = Field(default=None, description="Hot-path P99 latency, ms.")
    p99_cold_ms: float | None = Field(default=None, description="Cold-start P99 latency, ms.")
    error_rate: float | None = Field(default=None, description="Fraction of failed requests.")
    requests: int | None = Field(
        default=None, ge=0, description="Requests behind p99HotMs and errorRate (their window)."
    )
    queue_source: str | None = Field(
        default=None,
        max_length=32,
        description="Where the queue depth came from: pods, prometheus or none.",
    )
    time_to_routable: TimeToRoutable | None = Field(
        default=None, description="Creation to Ready of the pool's recent replicas, by phase."
    )


class Decision(ApiModel):
    """The operator's last scaling or rollout decision."""

    reason: str = Field(max_length=1024, description="Why, e.g. surge:queue.")
    at: str = Field(description="When (RFC 3339).", json_schema_extra={"format": "date-time"})
    pool: str | None = Field(default=None, max_length=16, description="Pool it was made for.")
    desired_replicas: int | None = Field(
        default=None, ge=0, description="Serving replicas asked for by this decision."
    )
    standby_replicas: int | None = Field(
        default=None, ge=0, description="Standby replicas asked for by this decision."
    )
    inputs: dict[str, float] = Field(
        default_factory=dict,
        max_length=32,
        description="The numbers the decision was made from (counts, queue, rates, P99).",
    )


class AutoscalerStatus(ApiModel):
    """The autoscaler's learned capacity and its memory, so a restarted operator resumes."""

    capacity_per_replica: float | None = Field(
        default=None, ge=0, description="Requests per second one replica serves at saturation."
    )
    knee_concurrency: float | None = Field(
        default=None,
        ge=0,
        description="Requests one replica holds in service at saturation; latency rises beyond.",
    )
    state: str = Field(
        default="",
        max_length=16384,
        description="The autoscaler's state as JSON (learned capacity, last decisions, windows).",
    )


class RolloutStatus(ApiModel):
    """Where the two-pool traffic logic stands (present when spec.rollout.baseline is set)."""

    phase: str = Field(
        default="Stable",
        max_length=32,
        description="Stable, Preparing, RolledBack, Progressing, Pinned or Overflow.",
    )
    traffic: str = Field(
        default="primary",
        max_length=16,
        description="What the Service selects: primary, baseline, split (a rollout step) or "
        "overflow (the baseline shares a surge).",
    )
    primary_traffic_percent: float = Field(
        default=100.0, ge=0, le=100, description="Primary's share by ready replica proportion."
    )
    step: int | None = Field(default=None, ge=0, description="Index of the rollout step.")
    reason: str = Field(default="", max_length=2048, description="The last rollout decision.")
    state: str = Field(
        default="",
        max_length=65536,
        description="The rollout planner's state as JSON, so a restarted operator resumes.",
    )


class FleetStatus(ApiModel):
    """Where the fleet's models are (present with spec.fleet)."""

    summary: str = Field(
        default="", max_length=32, description="Models hot on some replica / models, e.g. 12/30."
    )
    models_hot: int = Field(default=0, ge=0, description="Models hot on at least one replica.")
    models_total: int = Field(default=0, ge=0, description="Models of the service.")
    hot_copies: int = Field(default=0, ge=0, description="Hot copies over all replicas.")
    pinned_copies: int = Field(
        default=0, ge=0, description="Copies the last placement pinned (loaded or loading)."
    )
    replicas: int = Field(default=0, ge=0, description="Runtime pods the placement covers.")
    gateways_ready: int = Field(default=0, ge=0, description="Ready gateway pods.")
    loaded_bytes: int = Field(
        default=0, ge=0, description="Engine bytes placement has asked replicas to load so far."
    )
    placed_at: str | None = Field(
        default=None,
        description="When the placement last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    too_large: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Models larger than every replica's engine budget, with the gap.",
    )
    hottest: list[str] = Field(
        default_factory=list,
        max_length=10,
        description="The busiest models with their copies and rates, e.g. m1:3@120.5/s.",
    )


class ServedBuild(ApiModel):
    """The engine a model of a pool serves from a ModelBuild (``models[].build``): what its
    pods were given. Kept while a newly named version is not servable (not built yet, or
    refused by its gate), so that the pods keep serving this one."""

    pool: str = Field(max_length=16, description="primary or baseline.")
    model: str = Field(max_length=63, description="The model's name.")
    build: str = Field(max_length=253, description="The ModelBuild it came from.")
    precision: str = Field(max_length=16, description="Its precision.")
    uri: str = Field(max_length=2048, description="The engine served.")
    sha256: str | None = Field(default=None, max_length=64, description="Its digest.")
    version: str | None = Field(
        default=None, max_length=63, description="The version its answers report."
    )


class InferenceServiceStatus(ApiModel):
    """Observed state, written by the operator through the status subresource."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Ready, Degraded, Progressing, ... in Kubernetes' condition form.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(
        default=0, ge=0, description="Pods of the active pool (the scale subresource)."
    )
    ready_replicas: int = Field(
        default=0, ge=0, description="Ready, routed pods of the active pool."
    )
    warming_replicas: int = Field(default=0, ge=0, description="Pods warming up (active pool).")
    standby_replicas: int = Field(default=0, ge=0, description="Warm standby pods (active pool).")
    desired_replicas: int = Field(default=0, ge=0, description="Replicas asked for (active pool).")
    selector: str = Field(
        default="", description="Label selector of the pods (the scale subresource)."
    )
    active_pool: PoolName = Field(
        default=PoolName.PRIMARY, description="The pool the Service routes to."
    )
    pools: dict[str, PoolStatus] = Field(
        default_factory=dict, max_length=2, description="Replica counts per pool."
    )
    metrics: ServiceMetrics | None = Field(default=None, description="Latest metrics.")
    last_decision: Decision | None = Field(default=None, description="Last decision and why.")
    rollout: RolloutStatus | None = Field(
        default=None, description="Two-pool traffic state (with a baseline)."
    )
    autoscaler: AutoscalerStatus | None = Field(
        default=None, description="What the autoscaler learned and remembers (survives restarts)."
    )
    fleet: FleetStatus | None = Field(
        default=None, description="Model placement summary (with spec.fleet)."
    )
    builds: list[ServedBuild] | None = Field(
        default=None,
        max_length=1024,
        description="Engines served from ModelBuilds (models[].build), per pool and model.",
    )
