"""The InferenceService itself: its spec (the sections of the other modules put together, with
the rules across them), its metadata schema, the resource, and the functions that parse an
object from the API server and word a validation error as the API server words paths."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from .autoscaling import Autoscaling
from .base import ApiModel, Resource, _rules, cel
from .engines import MAX_MODELS, Memory, Model
from .fleet import Fleet
from .pod import Runtime
from .rollout import Rollout
from .status import InferenceServiceStatus


class InferenceServiceSpec(ApiModel):
    """Desired state of an InferenceService."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!has(self.replicas) || self.autoscaling.maxReplicas < 1 || "
                "self.replicas <= self.autoscaling.maxReplicas",
                "spec.replicas must be <= spec.autoscaling.maxReplicas",
                ".replicas",
            ),
        )
    )

    runtime: Runtime = Field(
        default_factory=Runtime,
        description="Runtime pods: image, backend, resources, placement.",
        json_schema_extra={"default": {}},
    )
    models: list[Model] = Field(
        min_length=1,
        max_length=MAX_MODELS,
        description="Models served; names must be unique. More than a few (or more than the "
        "engine budget holds) want spec.fleet.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    memory: Memory = Field(
        default_factory=Memory,
        description="GPU memory budgets of each pod.",
        json_schema_extra={"default": {}},
    )
    autoscaling: Autoscaling = Field(
        default_factory=Autoscaling,
        description="Replica bounds and autoscaler targets.",
        json_schema_extra={"default": {}},
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Manual replica count of the primary pool (the scale subresource, "
        "`kubectl scale`); unset: the autoscaler decides within autoscaling's bounds.",
    )
    rollout: Rollout = Field(
        default_factory=Rollout,
        description="Baseline pool, SLO and traffic switch.",
        json_schema_extra={"default": {}},
    )
    fleet: Fleet | None = Field(
        default=None,
        description="Serve many models through a model gateway with placement and predictive "
        "preloading; unset: the Service routes to the runtime pods directly.",
    )

    @model_validator(mode="after")
    def _replicas_bound(self) -> InferenceServiceSpec:
        if self.replicas is not None and self.replicas > self.autoscaling.max_replicas:
            raise ValueError("spec.replicas must be <= spec.autoscaling.maxReplicas")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("spec.models[].name must be unique")
        return self


NAME_MESSAGE = (
    "metadata.name must be a DNS-1035 label (lower-case letters, digits, '-', starting with a "
    "letter, at most 63 characters): it names the Service"
)
# The CRD's schema of metadata: structural schemas allow rules on metadata.name only. The rule
# sits on the name itself, so that the API server reports the path metadata.name.
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": "Name of the InferenceService, and of its Service: a DNS-1035 label.",
            "maxLength": 63,
            **_rules(
                cel(
                    "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && self.size() <= 63",
                    NAME_MESSAGE,
                )
            ),
        }
    },
}


class InferenceService(Resource):
    """Serves one or more models on an elastic pool of runtime pods."""

    api_version: Literal["serving.tidal.dev/v1alpha1"] = Field(
        default="serving.tidal.dev/v1alpha1", description="serving.tidal.dev/v1alpha1"
    )
    kind: Literal["InferenceService"] = Field(
        default="InferenceService", description="InferenceService"
    )
    spec: InferenceServiceSpec = Field(description="Desired state.")
    status: InferenceServiceStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name_is_dns_label(self) -> InferenceService:
        name = self.metadata.get("name")
        if name is not None and not (
            re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", str(name)) and len(str(name)) <= 63
        ):
            raise ValueError(NAME_MESSAGE)
        return self


def parse_inference_service(body: dict[str, Any]) -> InferenceService:
    """Parse an object as the API server returns it (status may be partial or absent).

    Raises ``pydantic.ValidationError`` when the spec breaks the API's rules.
    """
    obj = {k: v for k, v in body.items() if k in ("apiVersion", "kind", "metadata", "spec")}
    return InferenceService.model_validate(obj)


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, ``spec.models[0].name: message``, as the API server words paths."""
    lines = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return "\n".join(lines)
