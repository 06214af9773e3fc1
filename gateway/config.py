"""The gateway's typed configuration, where it is read from, and the operator's replica list.

Sources, first match wins: ``--config FILE`` (YAML, or JSON when the name ends in ``.json``),
``TIDAL_GATEWAY_CONFIG_JSON`` (inline JSON, what the operator renders).  Field names are
camelCase on the wire; unknown fields are errors.  :class:`ReplicaList` is the body of
``PUT /v2/tidal/replicas``.  The process's flags are :class:`GatewaySettings`, read by
:mod:`tidal.common.settings` like the runtime's.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from ..common.body import DEFAULT_MAX_JSON_VALUES
from ..common.contract import ENV_GATEWAY_CONFIG_JSON
from ..common.settings import CLI_ONLY, ConfigError, ProcessSettings, read_config_data

# Re-exported for gateway/server.py until it imports it from tidal.common.settings.
from ..common.settings import format_validation_error as format_validation_error

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class GatewayConfig(_Model):
    """Configuration of one gateway process."""

    models: list[Annotated[str, Field(pattern=MODEL_NAME)]] = Field(
        default_factory=list,
        description="the model names this gateway accepts; empty: any name a replica reports",
    )
    max_loads_per_replica: int = Field(default=1, gt=0, description="loads at once per replica")
    max_loads_total: int | None = Field(
        default=None,
        gt=0,
        description="loads that evict at once across the fleet; unset: maxLoadsPerReplica "
        "times the healthy replicas that serve the model (never above their load slots)",
    )
    hold_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="longest a request is held for a cold model"
    )
    upstream_timeout_seconds: float = Field(
        default=60.0, gt=0, description="whole-request timeout towards a replica"
    )
    busy_outstanding: int = Field(
        default=8,
        ge=0,
        description="when every hot copy has more requests in flight, load one more copy",
    )
    slots_per_concurrency: float = Field(
        default=0.0,
        ge=0,
        le=64,
        description=(
            "the burst buffer: requests in flight to a replica at most, in multiples of what it "
            "executes at once (its slots x maxBatchSize, reported by the runtime); the rest wait "
            "here, oldest first, for a slot on any replica; 0: no bound"
        ),
    )
    shutdown_drain_seconds: float = Field(
        default=5.0, ge=0, le=300, description="after SIGTERM: not ready, still serving"
    )
    max_request_bytes: int = Field(
        default=64 * 2**20, gt=0, description="larger bodies: 413 (a declared length: at once)"
    )
    request_read_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="a body that has not arrived by then: 408"
    )
    max_json_values: int = Field(
        default=DEFAULT_MAX_JSON_VALUES,
        gt=0,
        description="values in a held request's JSON header (every number, string, list, "
        "object counts one); more: 413 before it is parsed",
    )
    header_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="a request header block that has not arrived by then: 408, connection closed",
    )
    max_connections_per_replica: int = Field(
        default=512, gt=0, description="keep-alive connections to one replica"
    )
    watch_wait_seconds: float = Field(
        default=25.0, gt=0, le=30, description="how long one long-poll of a replica waits"
    )
    refused_cooldown_seconds: float = Field(
        default=2.0, ge=0, description="a replica that refused a load (no room) is skipped"
    )
    max_held_requests: int = Field(
        default=1000,
        gt=0,
        description="requests held at once; one more is answered 503 with Retry-After at once",
    )
    max_held_bytes: int = Field(
        default=256 * 2**20,
        gt=0,
        description="request body bytes held at once (the hold's memory budget); a request "
        "that would go over it is answered 503 with Retry-After at once",
    )
    replica_grpc_port: int = Field(
        default=8081,
        ge=1,
        le=65535,
        description="the replicas' OIP v2 gRPC port (on the host of each replica's URL)",
    )
    activator: bool = Field(
        default=False,
        description="fronts a service that may be at zero replicas: ready (and holding "
        "requests) with no replica at all",
    )


class ReplicaRef(_Model):
    name: str = Field(min_length=1, max_length=253)
    url: str

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s)://host:port URL")
        return url.rstrip("/")


class ReplicaList(_Model):
    """``PUT /v2/tidal/replicas``: the serving replicas and where the placement wants models."""

    replicas: list[ReplicaRef]
    placement: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("replicas")
    @classmethod
    def _unique_names(cls, replicas: list[ReplicaRef]) -> list[ReplicaRef]:
        names = [r.name for r in replicas]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"replica names appear twice: {twice}")
        return replicas


def replica_from_url(url: str) -> ReplicaRef:
    """A ``--replica URL`` flag: the name is the URL's host:port."""
    if "://" not in url:
        url = "http://" + url
    return ReplicaRef(name=urlsplit(url).netloc, url=url)


def load_config(path: str | None = None, env: dict[str, str] | None = None) -> GatewayConfig:
    """Read the configuration from ``path`` or the environment (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    data = read_config_data(
        path, env, json_variable=ENV_GATEWAY_CONFIG_JSON, what="gateway configuration"
    )
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "gateway configuration")) from None


class GatewaySettings(ProcessSettings):
    """tidal model gateway: routes OIP v2 requests to the replica where the model is hot.
    Static replicas from --replica URL (repeatable), else from PUT /v2/tidal/replicas."""

    config: str | None = Field(
        default=None,
        description=f"YAML or JSON file (else {ENV_GATEWAY_CONFIG_JSON})",
        json_schema_extra=CLI_ONLY,
    )
    grpc_port: int = Field(
        default=0, ge=0, le=65535, description="also pass OIP v2 gRPC through here; 0: HTTP only"
    )
    replica: list[str] = Field(
        default_factory=list,
        description="a runtime replica, e.g. http://10.0.0.5:8080 (repeatable)",
        json_schema_extra=CLI_ONLY,
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = Field(
        default="auto", description="auto: uvloop when installed"
    )
