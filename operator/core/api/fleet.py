"""``spec.fleet``: many models on one pool: the model gateway, the placement of models onto
replicas, and the demand forecast that preloads them."""

from __future__ import annotations

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from .base import ApiModel, _matches, _rules, cel
from .formats import (
    DURATION_PATTERN,
    PERCENT_PATTERN,
    Duration,
    Percent,
    duration_seconds,
    percent_value,
)
from .pod import GatewayResourceRequirements

LOADS_TOTAL_MESSAGE = (
    "spec.fleet.gateway.maxLoadsTotal must be >= spec.fleet.gateway.maxLoadsPerReplica: the "
    "pool-wide limit would cut the per-replica one"
)


class FleetGateway(ApiModel):
    """The model gateway in front of the runtime pods (a Deployment of its own)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!has(self.maxLoadsTotal) || self.maxLoadsTotal >= self.maxLoadsPerReplica",
                LOADS_TOTAL_MESSAGE,
                ".maxLoadsTotal",
            )
        )
    )

    replicas: int = Field(default=1, ge=1, le=100, description="Gateway pods.")
    resources: GatewayResourceRequirements = Field(
        default_factory=GatewayResourceRequirements,
        description="CPU and memory requests and limits of the gateway container.",
    )
    max_loads_per_replica: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Cold loads the gateway asks one runtime pod for at a time.",
    )
    max_loads_total: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Cold loads that evict which the gateway asks the whole pool for at a "
        "time. Unset: sized from the pool, maxLoadsPerReplica times the ready runtime pods "
        "that serve the model (a load that fits in free bytes is bounded by the pod's load "
        "slots alone).",
    )
    hold_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Longest a request for a cold model is held while it loads; then 503 "
        "with Retry-After (a request's own timeout parameter shortens it).",
    )
    busy_outstanding: int = Field(
        default=8,
        ge=1,
        le=100000,
        description="When every hot copy of a model has more requests outstanding than this, "
        "the gateway loads the model on one more replica.",
    )

    @model_validator(mode="after")
    def _loads_total_covers_one_replica(self) -> FleetGateway:
        total = self.max_loads_total
        if total is not None and total < self.max_loads_per_replica:
            raise ValueError(LOADS_TOTAL_MESSAGE)
        return self


MIN_RATE_MESSAGE = (
    "spec.fleet.placement.minRate must be <= spec.fleet.placement.ratePerCopy: a model busy "
    "enough for a copy would be pinned nowhere"
)

NO_ROOM_MESSAGE = (
    "spec.fleet.placement.headroom and landingShare are both 0%: no replica keeps room to load "
    "a model that is not pinned (placement may fill every budget with pinned models), so its "
    "requests can wait out the gateway's hold and fail; give either above 0%"
)


class FleetPlacement(ApiModel):
    """How the operator spreads models over the runtime pods' engine budgets."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                f"!{_matches('self.headroom', PERCENT_PATTERN)} || "
                "double(self.headroom.substring(0, self.headroom.size() - 1)) < 100.0",
                "spec.fleet.placement.headroom must be a percentage from 0% to below 100%",
                ".headroom",
            ),
            cel(
                f"!{_matches('self.landingShare', PERCENT_PATTERN)} || "
                "double(self.landingShare.substring(0, self.landingShare.size() - 1)) <= 100.0",
                "spec.fleet.placement.landingShare must be a percentage from 0% to 100%",
                ".landingShare",
            ),
            cel("self.minRate <= self.ratePerCopy", MIN_RATE_MESSAGE, ".minRate"),
            cel(
                f"!{_matches('self.headroom', PERCENT_PATTERN)} || "
                f"!{_matches('self.landingShare', PERCENT_PATTERN)} || "
                "double(self.headroom.substring(0, self.headroom.size() - 1)) > 0.0 || "
                "double(self.landingShare.substring(0, self.landingShare.size() - 1)) > 0.0",
                NO_ROOM_MESSAGE,
                ".headroom",
            ),
        )
    )

    rate_per_copy: float = Field(
        default=50.0,
        gt=0,
        le=1000000,
        description="Requests per second one hot copy of a model serves before placement "
        "wants another copy on another replica.",
    )
    max_copies: int | None = Field(
        default=None, ge=1, le=1000, description="Most hot copies of one model; unset: replicas."
    )
    min_rate: float = Field(
        default=0.01,
        ge=0,
        le=1000000,
        description="Models expected below this rate (requests per second) are pinned nowhere: "
        "they stay cold in the store and load on their first request.",
    )
    headroom: Percent = Field(
        default="20%",
        description="Share of each replica's engine budget kept free of pinned models, for "
        "on-demand loads of cold models.",
    )
    landing_share: Percent = Field(
        default="25%",
        description="Least share of the replicas (rounded up, at least one) that also keep room "
        "for the largest model not pinned everywhere, so that a cold request for any model finds "
        "a replica that can load it. More keep it while the tail (models that are not hot) takes "
        "a larger share of the requests: that share of the replicas, all but one at most. More "
        "spreads large cold loads over more replicas (lower latency for rare models) at the "
        "price of fewer pinned models; 0%: none.",
    )
    interval_seconds: float = Field(
        default=2.0, ge=0.5, le=300, description="How often placement is recomputed, seconds."
    )
    rate_window_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Models are ranked by their request rate averaged over about this long "
        "(an exponentially weighted mean); 0: over one interval. Short windows make pins "
        "follow single requests of rare models.",
    )

    @model_validator(mode="after")
    def _headroom_below_all(self) -> FleetPlacement:
        if (percent_value(self.headroom) or 0.0) >= 100:
            raise ValueError(
                "spec.fleet.placement.headroom must be a percentage from 0% to below 100%"
            )
        if (percent_value(self.landing_share) or 0.0) > 100:
            raise ValueError(
                "spec.fleet.placement.landingShare must be a percentage from 0% to 100%"
            )
        if self.min_rate > self.rate_per_copy:
            raise ValueError(MIN_RATE_MESSAGE)
        if not percent_value(self.headroom) and not percent_value(self.landing_share):
            raise ValueError(NO_ROOM_MESSAGE)
        return self


LEAD_MESSAGE = (
    "spec.fleet.forecast.leadSeconds must be shorter than spec.fleet.forecast.period: a lead "
    "of a whole cycle or more preloads for a rise that has already come round"
)


class FleetForecast(ApiModel):
    """Per-model demand forecast used to load models before their predicted rise."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                f"!{_matches('self.period', DURATION_PATTERN)} || "
                "(duration(self.period) >= duration('1m') && duration(self.period) <= "
                "duration('168h'))",
                "spec.fleet.forecast.period must be a duration between 1m and 168h",
                ".period",
            ),
            cel(
                f"!{_matches('self.period', DURATION_PATTERN)} || "
                "self.leadSeconds < double(duration(self.period).getSeconds())",
                LEAD_MESSAGE,
                ".leadSeconds",
            ),
        )
    )

    enabled: bool = Field(default=True, description="Preload ahead of forecast demand.")
    period: Duration = Field(
        default="24h",
        description="Length of the demand cycle the forecast learns (a day, usually).",
    )
    slots: int = Field(
        default=96, ge=4, le=1440, description="Buckets of the learned cycle (96: 15 minutes)."
    )
    lead_seconds: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="Preload this long before the predicted rise, beyond the model's measured "
        "load time.",
    )

    @model_validator(mode="after")
    def _period_bounds(self) -> FleetForecast:
        if not 60 <= duration_seconds(self.period) <= 168 * 3600:
            raise ValueError("spec.fleet.forecast.period must be a duration between 1m and 168h")
        if self.lead_seconds >= int(duration_seconds(self.period)):
            raise ValueError(LEAD_MESSAGE)
        return self


class Fleet(ApiModel):
    """Many models on one pool: a gateway routes each request to a replica where its model is
    hot, and the operator places models onto replicas from their demand and forecast."""

    gateway: FleetGateway = Field(
        default_factory=FleetGateway,
        description="The model gateway (the Service's endpoints).",
        json_schema_extra={"default": {}},
    )
    placement: FleetPlacement = Field(
        default_factory=FleetPlacement,
        description="How models are spread over the replicas.",
        json_schema_extra={"default": {}},
    )
    forecast: FleetForecast = Field(
        default_factory=FleetForecast,
        description="Predictive preloading.",
        json_schema_extra={"default": {}},
    )
