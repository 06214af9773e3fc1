"""What every type of the API shares: the group, version and names of the custom resource,
the label and annotation keys the operator puts on what it creates, :class:`ApiModel` (camelCase
on the wire, unknown fields rejected, immutable), :class:`Resource` (a custom resource's metadata)
and the helpers that attach CEL rules (``x-kubernetes-validations``) to a model's schema."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)
from pydantic.alias_generators import to_camel

GROUP = "serving.tidal.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
# KServe's InferenceService already claims the short name `isvc`; two CRDs with one short name
# make `kubectl get isvc` ambiguous in clusters that run both, so ours is `tisvc` ("tidal isvc").
SHORT_NAMES = ("tisvc",)
CATEGORIES = ("tidal", "all")

# Label and annotation keys shared with the runtime's Prometheus relabelling and the autoscaler.
LABEL_ISVC = f"{GROUP}/isvc"
LABEL_POOL = f"{GROUP}/pool"
LABEL_ROLE = f"{GROUP}/role"
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry; ``field_path`` points the error at a field."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def _rules(*entries: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(entries)}


def _matches(expr: str, pattern: str) -> str:
    """CEL: ``expr`` matches ``pattern``. Rules guard on it, so that a value its field's own
    pattern already rejects yields that one error, not a second, misleading one (or a raw
    conversion error from quantity() or duration())."""
    return f"{expr}.matches(r'{pattern}')"


class ApiModel(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it (aliases, no unset optional fields)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Resource(ApiModel):
    """A custom resource's metadata, read the same way for every kind of this group."""

    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard metadata.")

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))
