"""``spec.runtime``: how the runtime pods of a pool are built and placed (image, backend, GPUs,
resources, env, node selector, tolerations, engine cache, object storage), and
:data:`RuntimeOverride`, the baseline pool's partial copy of it."""

from __future__ import annotations

import copy
import re
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)

from ....common.contract import RUNTIME_ENV_NAMES, is_whole_bytes
from .base import ApiModel, _matches, _rules, cel
from .formats import (
    DNS_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    IMAGE_PATTERN,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_MAX,
    QUALIFIED_NAME_PATTERN,
    ByteQuantity,
    LabelValue,
    Quantity,
    _bad_qualified_keys,
    _whole_bytes_cel,
    quantity_cmp,
)


class Backend(StrEnum):
    """Inference backend the runtime uses in every pod of a pool."""

    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


class LogLevel(StrEnum):
    """Log level of the runtime process."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


RESOURCE_NAMES_MESSAGE = (
    "keys must be cpu, memory, ephemeral-storage, hugepages-<size> or a fully qualified "
    "extended resource such as example.com/device"
)
EXTENDED_MESSAGE = (
    "resources: an extended resource (a name with a '/') or hugepages needs a limit equal to "
    "its request (they cannot be overcommitted)"
)
WHOLE_BYTES_RESOURCES_MESSAGE = (
    "resources: memory and ephemeral-storage must be whole numbers of bytes (no m suffix)"
)
GPU_RESOURCE_MESSAGE = "resources must not set nvidia.com/gpu: runtime.gpus sets it"
GATEWAY_GPU_RESOURCE_MESSAGE = (
    "spec.fleet.gateway.resources must not set nvidia.com/gpu: the gateway only routes "
    "requests and needs no GPU (the runtime's GPUs are set by runtime.gpus)"
)
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_BYTE_RESOURCES = ("memory", "ephemeral-storage")


def _resource_names_rule(what: str) -> dict[str, str]:
    return cel(
        f"self.all(k, k in {list(_STANDARD_RESOURCES)} || "
        f"({_matches('k', '^hugepages-[0-9]+(Ki|Mi|Gi|k|M|G)$')}) || "
        f"(k.contains('/') && k.size() <= {QUALIFIED_NAME_MAX} && "
        f"{_matches('k', QUALIFIED_NAME_PATTERN)}))",
        f"{what} {RESOURCE_NAMES_MESSAGE}",
    )


def _bad_resource_names(keys: Any) -> list[str]:
    return [
        k
        for k in keys
        if k not in _STANDARD_RESOURCES
        and re.fullmatch(r"hugepages-[0-9]+(Ki|Mi|Gi|k|M|G)", k) is None
        and ("/" not in k or k in _bad_qualified_keys([k]))
    ]


def _not_overcommittable(name: str) -> bool:
    return "/" in name or name.startswith("hugepages-")


def _resource_rules(gpu_message: str) -> dict[str, Any]:
    """The CEL rules of a container's ``resources``; ``gpu_message`` says who sets GPUs."""
    return _rules(
        cel(
            "!has(self.requests) || self.requests.all(k, "
            "!(k.contains('/') || k.startsWith('hugepages-')) || "
            "(has(self.limits) && k in self.limits && isQuantity(self.requests[k]) && "
            "isQuantity(self.limits[k]) && "
            "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) == 0))",
            EXTENDED_MESSAGE,
        ),
        cel(
            "(!has(self.requests) || self.requests.all(k, "
            f"!(k in {list(_BYTE_RESOURCES)}) || !isQuantity(self.requests[k]) || "
            f"{_whole_bytes_cel('self.requests[k]')})) && "
            "(!has(self.limits) || self.limits.all(k, "
            f"!(k in {list(_BYTE_RESOURCES)}) || !isQuantity(self.limits[k]) || "
            f"{_whole_bytes_cel('self.limits[k]')}))",
            WHOLE_BYTES_RESOURCES_MESSAGE,
        ),
        cel(
            "(!has(self.requests) || !('nvidia.com/gpu' in self.requests)) && "
            "(!has(self.limits) || !('nvidia.com/gpu' in self.limits))",
            gpu_message,
        ),
        cel(
            "!has(self.requests) || !has(self.limits) || self.requests.all(k, "
            "!(k in self.limits) || !isQuantity(self.requests[k]) || "
            "!isQuantity(self.limits[k]) || "
            "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
            "resources.limits must be at least resources.requests for each resource (a "
            "container cannot be created with a limit below its request)",
        ),
    )


class ResourceRequirements(ApiModel):
    """CPU and memory for the runtime container, as in a Pod's ``resources``."""

    # Who sets the container's GPUs, for the message refusing nvidia.com/gpu here.
    _gpu_message: ClassVar[str] = GPU_RESOURCE_MESSAGE
    model_config = ConfigDict(json_schema_extra=_resource_rules(GPU_RESOURCE_MESSAGE))

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Minimum resources the scheduler reserves, e.g. {cpu: '2', memory: 8Gi}.",
        json_schema_extra=_rules(_resource_names_rule("resources.requests")),
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Maximum resources the container may use, e.g. {memory: 16Gi}.",
        json_schema_extra=_rules(_resource_names_rule("resources.limits")),
    )

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> ResourceRequirements:
        for what, entries in (("requests", self.requests), ("limits", self.limits)):
            if _bad_resource_names(entries):
                raise ValueError(f"resources.{what} {RESOURCE_NAMES_MESSAGE}")
            if "nvidia.com/gpu" in entries:
                raise ValueError(self._gpu_message)
            if any(k in _BYTE_RESOURCES and not is_whole_bytes(v) for k, v in entries.items()):
                raise ValueError(WHOLE_BYTES_RESOURCES_MESSAGE)
        if any(
            _not_overcommittable(k)
            and (k not in self.limits or quantity_cmp(v, self.limits[k]) != 0)
            for k, v in self.requests.items()
        ):
            raise ValueError(EXTENDED_MESSAGE)
        below = sorted(
            k
            for k, request in self.requests.items()
            if k in self.limits and quantity_cmp(request, self.limits[k]) > 0
        )
        if below:
            raise ValueError(
                "resources.limits must be at least resources.requests for each resource (a "
                f"container cannot be created with a limit below its request): {', '.join(below)}"
            )
        return self


class GatewayResourceRequirements(ResourceRequirements):
    """CPU and memory for the fleet gateway's container, as in a Pod's ``resources``."""

    _gpu_message: ClassVar[str] = GATEWAY_GPU_RESOURCE_MESSAGE
    model_config = ConfigDict(json_schema_extra=_resource_rules(GATEWAY_GPU_RESOURCE_MESSAGE))


# Variables the operator sets in the runtime container (its contract with the runtime).
RESERVED_ENV_NAMES = RUNTIME_ENV_NAMES
RESERVED_ENV_MESSAGE = (
    f"runtime.env[].name must not be one the operator sets ({', '.join(RESERVED_ENV_NAMES)}); "
    "runtime.logLevel sets TIDAL_LOG_LEVEL"
)


class EnvVar(ApiModel):
    """An extra environment variable for the runtime container."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(f"!(self.name in {list(RESERVED_ENV_NAMES)})", RESERVED_ENV_MESSAGE, ".name")
        )
    )

    name: str = Field(
        min_length=1, max_length=253, pattern=ENV_NAME_PATTERN, description="Variable name."
    )
    value: str = Field(default="", max_length=4096, description="Literal value.")

    @model_validator(mode="after")
    def _not_reserved(self) -> EnvVar:
        if self.name in RESERVED_ENV_NAMES:
            raise ValueError(RESERVED_ENV_MESSAGE)
        return self


class Toleration(ApiModel):
    """A Pod toleration, so pools can run on tainted (e.g. GPU-only) nodes."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "self.operator == 'Exists' || (has(self.key) && self.key != '')",
                "tolerations[].operator must be Exists when tolerations[].key is empty",
                ".operator",
            ),
            cel(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "tolerations[].value must be empty when tolerations[].operator is Exists",
                ".value",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerations[].tolerationSeconds needs tolerations[].effect: NoExecute",
                ".tolerationSeconds",
            ),
        )
    )

    key: str | None = Field(
        default=None,
        max_length=QUALIFIED_NAME_MAX,
        pattern=QUALIFIED_NAME_PATTERN,
        description="Taint key to tolerate; empty (with operator Exists) tolerates every taint.",
    )
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Exists matches any value; Equal matches `value`."
    )
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN, description="Taint value."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty tolerates all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=31536000,
        description="For NoExecute: seconds the pod stays after the taint (at most a year).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Equal" and not self.key:
            raise ValueError(
                "tolerations[].operator must be Exists when tolerations[].key is empty"
            )
        if self.operator == "Exists" and self.value:
            raise ValueError(
                "tolerations[].value must be empty when tolerations[].operator is Exists"
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(
                "tolerations[].tolerationSeconds needs tolerations[].effect: NoExecute"
            )
        return self


HOST_PATH_BACKSTEP_MESSAGE = (
    "runtime.engineCache.hostPath must be an absolute directory with no '..' segment, such as "
    "/var/cache/tidal/engines (Kubernetes refuses a hostPath volume that steps back)"
)
SIZE_LIMIT_WITH_HOST_PATH_MESSAGE = (
    "runtime.engineCache.sizeLimit bounds the per-pod emptyDir only: with hostPath nothing "
    "limits the node's directory; remove sizeLimit, or hostPath"
)
_BACKSTEP = r"(^|/)\.\.(/|$)"


class EngineCache(ApiModel):
    """Where a runtime pod keeps the engines it downloads (http(s) engine URIs), verified by
    sha256. Without ``hostPath``: an emptyDir, gone with the pod. With it: a directory on the
    node (a hostPath volume) that outlives pods, so a replacement or a new replica on the same
    node finds its engines there and skips the download. hostPath, not a PersistentVolume: a
    Deployment's replicas cannot each claim a volume on their own node, and a shared
    ReadWriteMany volume is network storage, not node-local. The directory must be writable
    by the runtime's user (uid 65532), and hostPath volumes need a namespace whose Pod Security
    level allows them (baseline does not)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                f"!has(self.hostPath) || !self.hostPath.matches(r'{_BACKSTEP}')",
                HOST_PATH_BACKSTEP_MESSAGE,
                ".hostPath",
            ),
            cel(
                "!has(self.hostPath) || !has(self.sizeLimit)",
                SIZE_LIMIT_WITH_HOST_PATH_MESSAGE,
                ".sizeLimit",
            ),
        )
    )

    host_path: str | None = Field(
        default=None,
        min_length=2,
        max_length=512,
        pattern=r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$",
        description="Absolute directory on the node for downloaded engines, kept across pods "
        "(e.g. /var/cache/tidal/engines); writable by uid 65532. Unset: an emptyDir per pod.",
    )
    size_limit: ByteQuantity | None = Field(
        default=None,
        description="Most bytes the per-pod emptyDir may hold (not with hostPath), e.g. 20Gi.",
    )

    @model_validator(mode="after")
    def _host_path_rules(self) -> EngineCache:
        if self.host_path is not None and re.search(_BACKSTEP, self.host_path):
            raise ValueError(HOST_PATH_BACKSTEP_MESSAGE)
        if self.host_path is not None and self.size_limit is not None:
            raise ValueError(SIZE_LIMIT_WITH_HOST_PATH_MESSAGE)
        return self


S3_ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$"
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
S3_PORT_MESSAGE = "s3.endpoint: the port must be from 1 to 65535"
_S3_PORTED = r"^https?://[A-Za-z0-9.-]+:[0-9]{1,5}/?$"


def s3_endpoint_port(endpoint: str) -> int | None:
    """The port an endpoint names (None: none named, the scheme's)."""
    if not re.match(_S3_PORTED, endpoint):
        return None
    return int(endpoint.rstrip("/").rsplit(":", 1)[1])


class S3Storage(ApiModel):
    """An S3-compatible object store for ``s3://bucket/key`` engine URIs (AWS S3, MinIO, Ceph
    RGW, versitygw, ...). Credentials never appear here: name a Secret in the service's
    namespace with the keys ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` (and optionally
    ``AWS_SESSION_TOKEN``), or leave ``credentialsSecret`` unset to use the pods' ambient
    workload identity (IRSA's ``AWS_WEB_IDENTITY_TOKEN_FILE`` and ``AWS_ROLE_ARN``, set by your
    cluster on the pods' service account, or the node's instance metadata)."""

    # A port outside 1-65535 passes the pattern; the S3 client would fail on it with a text
    # that names neither the field nor the port (a Rust panic, issue 41).
    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                f"!has(self.endpoint) || !{_matches('self.endpoint', _S3_PORTED)} || "
                "(int(self.endpoint.split(':')[2].split('/')[0]) >= 1 && "
                "int(self.endpoint.split(':')[2].split('/')[0]) <= 65535)",
                S3_PORT_MESSAGE,
                ".endpoint",
            ),
        )
    )

    endpoint: str | None = Field(
        default=None,
        max_length=256,
        pattern=S3_ENDPOINT_PATTERN,
        description="The store's URL, e.g. http://minio.storage.svc:9000; unset: AWS S3 for "
        "the region.",
    )
    region: str = Field(
        default="us-east-1",
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9-]+$",
        description="Region the requests are signed for.",
    )
    path_style: bool = Field(
        default=True,
        description="Bucket in the URL's path (most S3-compatible stores) rather than in the "
        "host name (virtual-hosted style).",
    )
    credentials_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Secret in this namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(AWS_SESSION_TOKEN optional); unset: the pods' ambient credentials.",
    )

    @model_validator(mode="after")
    def _port_in_range(self) -> S3Storage:
        port = s3_endpoint_port(self.endpoint) if self.endpoint is not None else None
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(S3_PORT_MESSAGE)
        return self


class Storage(ApiModel):
    """Where remote engines are read from, beyond file:// and http(s):// URIs."""

    s3: S3Storage | None = Field(
        default=None, description="The S3-compatible store that s3:// engine URIs name."
    )


class Runtime(ApiModel):
    """How the runtime pods of a pool are built and placed."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!has(self.gpus) || self.backend == 'tensorrt' || self.gpus == 0",
                "runtime.gpus must be 0 when runtime.backend is onnxruntime",
                ".gpus",
            ),
            cel(
                "!has(self.gpus) || self.backend != 'tensorrt' || self.gpus >= 1",
                "runtime.gpus must be at least 1 when runtime.backend is tensorrt",
                ".gpus",
            ),
        )
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Container image with the tidal runtime (`tidal-runtime` on its PATH). "
        "Unset: the operator's image for the backend (tidal-runtime-cpu for onnxruntime, "
        "tidal-runtime for tensorrt, of the operator's release).",
    )
    backend: Backend = Field(
        default=Backend.ONNXRUNTIME,
        description="Inference backend: tensorrt on NVIDIA GPUs, onnxruntime on CPUs "
        "(the default, as in tidal-runtime).",
    )
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="GPUs (nvidia.com/gpu) per pod; unset: 1 for tensorrt, 0 for onnxruntime.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory requests and limits of the runtime container.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for the runtime container; names must be unique.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels the pods must run on, e.g. a GPU product label.",
        json_schema_extra=_rules(
            cel(
                f"self.all(k, k.size() <= {QUALIFIED_NAME_MAX} && "
                f"{_matches('k', QUALIFIED_NAME_PATTERN)})",
                "runtime.nodeSelector keys must be label keys such as "
                "nvidia.com/gpu.product (at most 317 characters)",
            )
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints the pods tolerate."
    )
    log_level: LogLevel = Field(default=LogLevel.INFO, description="Runtime log level.")
    engine_cache: EngineCache = Field(
        default_factory=EngineCache,
        description="Where pods keep downloaded engines: a per-pod emptyDir, or a node-local "
        "directory (hostPath) that outlives pods.",
    )
    storage: Storage = Field(
        default_factory=Storage,
        description="Object stores that engine URIs name (s3://): endpoint, region, "
        "credentials Secret.",
    )

    @property
    def gpu_count(self) -> int:
        """GPUs per pod after applying the backend's default."""
        if self.gpus is not None:
            return self.gpus
        return 1 if self.backend is Backend.TENSORRT else 0

    @model_validator(mode="after")
    def _gpus_match_backend(self) -> Runtime:
        _check_runtime(self.env, self.node_selector, self.backend, self.gpus)
        return self


def _check_runtime(
    env: list[EnvVar] | None,
    node_selector: dict[str, str] | None,
    backend: Backend | None,
    gpus: int | None,
) -> None:
    """The cross-field rules of :class:`Runtime`, over the fields given (None: not given)."""
    names = [e.name for e in env or []]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"runtime.env names must be unique: {', '.join(repeated)} repeated")
    if node_selector and _bad_qualified_keys(node_selector):
        raise ValueError(
            "runtime.nodeSelector keys must be label keys such as "
            "nvidia.com/gpu.product (at most 317 characters)"
        )
    if gpus is None or backend is None:
        return
    if backend is Backend.ONNXRUNTIME and gpus != 0:
        raise ValueError("runtime.gpus must be 0 when runtime.backend is onnxruntime")
    if backend is Backend.TENSORRT and gpus < 1:
        raise ValueError("runtime.gpus must be at least 1 when runtime.backend is tensorrt")


def _override_fields(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s fields, each optional with no default (so the API server fills nothing in),
    keeping its type, bounds, pattern, description and field-level rules."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        kept = copy.copy(info)
        kept.default, kept.default_factory = None, None
        kind: Any = info.annotation
        fields[name] = (kind | None, kept)
    return fields


class _RuntimeOverrideBase(ApiModel):
    """Fields of the primary's runtime to replace for the baseline pool; unset ones are the
    primary's. A nested value (resources, env, nodeSelector, tolerations, engineCache) replaces
    the primary's whole, it is not merged deeper."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            # Runtime's own rules, over the fields named here; a field taken from the primary is
            # checked once merged (tidal.operator.core.resources reports it Degraded).
            cel(
                "!has(self.gpus) || !has(self.backend) || self.backend == 'tensorrt' || "
                "self.gpus == 0",
                "runtime.gpus must be 0 when runtime.backend is onnxruntime",
                ".gpus",
            ),
            cel(
                "!has(self.gpus) || !has(self.backend) || self.backend != 'tensorrt' || "
                "self.gpus >= 1",
                "runtime.gpus must be at least 1 when runtime.backend is tensorrt",
                ".gpus",
            ),
        )
    )

    @model_validator(mode="after")
    def _rules_over_given_fields(self) -> _RuntimeOverrideBase:
        v = self.__dict__
        _check_runtime(v["env"], v["node_selector"], v["backend"], v["gpus"])
        return self


if TYPE_CHECKING:  # the fields are Runtime's (made optional), known at run time only
    RuntimeOverride = _RuntimeOverrideBase
else:
    RuntimeOverride = create_model(
        "RuntimeOverride",
        __base__=_RuntimeOverrideBase,
        __module__=__name__,
        __doc__=_RuntimeOverrideBase.__doc__,
        **_override_fields(Runtime),
    )
