"""The InferenceService API (``serving.tidal.dev/v1alpha1``): the one source of truth.

This module owns the typed model of the custom resource. ``tidal.operator.crdgen`` turns these
models into the CRD's OpenAPI schema, so every description here is what ``kubectl explain``
prints, and every bound, pattern and enum here is enforced by the API server.

Cross-field rules are written twice, on purpose: as CEL (``x-kubernetes-validations``, carried by
each model's ``json_schema_extra``) so the API server rejects a bad object before anyone stores
it, and as a pydantic validator so the operator's pure core (and unit tests without a cluster)
reach the same verdict. ``tests/operator/invalid/`` holds one manifest per rule and a test checks
that both layers reject each of them with a message naming the field.

Everything a spec can say that passes these rules but still cannot work (for example no engine
for the selected backend) is found by :func:`tidal.operator.core.resources.find_spec_problems`
and reported as the ``Degraded`` condition instead of being rejected: those depend on facts the
schema cannot know. Settings of a working spec that can never act, or that contradict each
other, are the rows of :data:`tidal.operator.core.rules.SETTING_RULES` (``Degraded``
``IneffectiveSetting`` / ``ConflictingSettings``); the operator README's rules table lists them
beside the CEL rules here (``make crds`` writes it).
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
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

# Kubernetes quantities ("20Gi", "512Mi", "1.5G") and percentages ("60%"). Bounds on the
# percentage are checked by CEL (below) because a regex bound on a number reads badly.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Byte counts: no milli suffix, and a fraction only before a unit (_whole_bytes_cel then
# rejects the fractions of a byte that remain, such as 1.0001k).
BYTES_PATTERN = r"^([0-9]+|[0-9]+(\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$"
BYTES_MESSAGE = (
    "must be a whole number of bytes, such as 20Gi, 1500Mi or 1.5G (no m suffix, no fraction "
    "of a byte)"
)
PERCENT_PATTERN = r"^[0-9]+(\.[0-9]+)?%$"
WEIGHT_STREAMING_PATTERN = r"^(auto|[0-9]+(\.[0-9]+)?((Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?|%))$"
# Go durations as CEL's duration() parses them, restricted to the units that make sense here.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
MAX_MODELS = 512
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MODEL_NAME_PATTERN = r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"
ENGINE_URI_PATTERN = r"^(file://.+|(s3|gs|https?)://[^/\s].*)$"
URI_SCHEMES = ("file://", "s3://", "gs://", "http://", "https://")
SHA256_PATTERN = r"^[a-f0-9]{64}$"
GPU_ARCH_PATTERN = r"^sm[0-9]{2,3}$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Label keys and resource names (Kubernetes "qualified names": an optional DNS prefix and '/').
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QUALIFIED_NAME_MAX = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
IMAGE_PATTERN = r"^[^\s]+$"
FILE_URI_MESSAGE = (
    "engines[].uri: a file:// URI needs an absolute path, i.e. three slashes "
    "(file:///models/m.onnx); in file://models/m.onnx, models is a host name"
)

_UNITS: dict[str, float] = {
    "": 1,
    "m": 0.001,
    "E": 10**18,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def _quantity_value(value: str) -> Decimal:
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", value)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    unit = match.group(2)
    return number * (Decimal("0.001") if unit == "m" else Decimal(int(_UNITS[unit])))


def quantity_bytes(value: str) -> int:
    """Bytes of a Kubernetes quantity such as ``20Gi`` (no percentages; rounded down)."""
    return int(_quantity_value(value))


def is_whole_bytes(value: str) -> bool:
    """Whether a quantity is a whole number of bytes below 2^63 (the CRD's CEL rule)."""
    try:
        exact = _quantity_value(value)
    except ValueError:
        return False
    return exact == exact.to_integral_value() and exact < 2**63


def quantity_cmp(left: str, right: str) -> int:
    """-1, 0 or 1 as quantity ``left`` is below, equal to or above ``right`` (exact)."""
    a, b = _quantity_value(left), _quantity_value(right)
    return (a > b) - (a < b)


def percent_value(value: str) -> float | None:
    """The number in ``"60%"``, or None when the value is not a percentage."""
    return float(value[:-1]) if value.endswith("%") else None


def duration_seconds(value: str) -> float:
    """Seconds in a Go duration string such as ``90s`` or ``1m30s``."""
    factors = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * factors[u] for n, u in parts)


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


def _whole_bytes_cel(expr: str) -> str:
    """CEL: the quantity ``expr`` is a whole number of bytes below 2^63. Not isInteger(): it
    is false for exact binary fractions such as 1.5Gi (stored as a decimal internally)."""
    value = f"quantity({expr}).asApproximateFloat()"
    return f"({value} < 9.2e18 && {value} == double(int({value})))"


def _whole_bytes(value: str) -> str:
    if not is_whole_bytes(value):
        raise ValueError(BYTES_MESSAGE)
    return value


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


# ---------------------------------------------------------------------------------------------
# Enums


class Backend(StrEnum):
    """Inference backend the runtime uses in every pod of a pool."""

    TENSORRT = "tensorrt"
    ONNXRUNTIME = "onnxruntime"


class Precision(StrEnum):
    """Numeric precision an engine was built for."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    FP4 = "fp4"
    INT4 = "int4"


class PoolName(StrEnum):
    """The two pools of an InferenceService (one Deployment each)."""

    PRIMARY = "primary"
    BASELINE = "baseline"


class ActivePool(StrEnum):
    """Which pool the Service routes to: ``auto`` lets the SLO logic decide."""

    AUTO = "auto"
    PRIMARY = "primary"
    BASELINE = "baseline"


class StandbyTier(StrEnum):
    """Where a warm standby replica keeps its engines."""

    DEVICE = "device"  # loaded and warm on the device: promotion is a label flip
    HOST = "host"  # fetched, verified and staged in host memory: promotion loads and warms


class BreachAction(StrEnum):
    """What the operator does when the primary pool breaches its SLO."""

    ROLLBACK = "rollback"
    ALERT = "alert"


class LogLevel(StrEnum):
    """Log level of the runtime process."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


# ---------------------------------------------------------------------------------------------
# Runtime (the pod)

Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=32)]
Percent = Annotated[str, StringConstraints(pattern=PERCENT_PATTERN, max_length=16)]
WeightStreamingBudget = Annotated[
    str, StringConstraints(pattern=WEIGHT_STREAMING_PATTERN, max_length=32)
]
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN, max_length=32)]
ByteQuantity = Annotated[
    str,
    StringConstraints(pattern=BYTES_PATTERN, max_length=32),
    AfterValidator(_whole_bytes),
    Field(
        json_schema_extra=_rules(
            cel(f"!{_matches('self', BYTES_PATTERN)} || {_whole_bytes_cel('self')}", BYTES_MESSAGE)
        )
    ),
]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE_PATTERN, max_length=63)]


def _bad_qualified_keys(keys: Any) -> list[str]:
    return [
        k
        for k in keys
        if len(k) > QUALIFIED_NAME_MAX or re.fullmatch(QUALIFIED_NAME_PATTERN, k) is None
    ]


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
RESERVED_ENV_NAMES = (
    "TIDAL_HOST",
    "POD_IP",
    "TIDAL_PORT",
    "TIDAL_GRPC_PORT",
    "POD_NAME",
    "POD_NAMESPACE",
    "TIDAL_LOG_LEVEL",
    "TIDAL_RUNTIME_CONFIG_JSON",
)
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


class S3Storage(ApiModel):
    """An S3-compatible object store for ``s3://bucket/key`` engine URIs (AWS S3, MinIO, Ceph
    RGW, versitygw, ...). Credentials never appear here: name a Secret in the service's
    namespace with the keys ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` (and optionally
    ``AWS_SESSION_TOKEN``), or leave ``credentialsSecret`` unset to use the pods' ambient
    workload identity (IRSA's ``AWS_WEB_IDENTITY_TOKEN_FILE`` and ``AWS_ROLE_ARN``, set by your
    cluster on the pods' service account, or the node's instance metadata)."""

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


# ---------------------------------------------------------------------------------------------
# Models and engines


class Engine(ApiModel):
    """One compiled artefact of a model: a TensorRT plan for a GPU arch, or an ONNX file.

    TensorRT plans follow the runtime's naming scheme
    ``<gpuArch>-trt<major>.<minor>[-vc]-<precision>.engine`` (e.g. ``sm90-trt11.4-fp16.engine``)
    or set gpuArch, tensorrtVersion and precision explicitly.
    """

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                # A uri without a scheme (empty, say) gets its pattern's error only. (A regex
                # match here would cost too much for the API server over 512 x 32 engines.)
                f"!({' || '.join(f'self.uri.startsWith({s!r})' for s in URI_SCHEMES)}) || "
                "has(self.backend) || self.uri.endsWith('.onnx') || "
                "self.uri.endsWith('.engine') || self.uri.endsWith('.plan')",
                "engines[].backend is required when engines[].uri does not end in .onnx, "
                ".engine or .plan",
                ".backend",
            ),
            cel(
                "!has(self.backend) || self.backend != 'onnxruntime' || "
                "(!has(self.gpuArch) && !has(self.tensorrtVersion))",
                "engines[].gpuArch and engines[].tensorrtVersion apply to tensorrt engines only",
            ),
            cel(
                "!self.uri.startsWith('file://') || self.uri.startsWith('file:///')",
                FILE_URI_MESSAGE,
                ".uri",
            ),
        )
    )

    uri: str = Field(
        # No min_length: the pattern needs a scheme and more, so an empty uri gets one error.
        max_length=2048,
        pattern=ENGINE_URI_PATTERN,
        description="Where the engine lives: file:///absolute/path or http(s)://; s3:// and "
        "gs:// are reserved (the runtime cannot fetch them yet: the service reports Degraded). "
        "Unique within a model.",
    )
    backend: Backend | None = Field(
        default=None,
        description="Backend that runs this engine; unset: onnxruntime for *.onnx, tensorrt "
        "for *.engine and *.plan.",
    )
    gpu_arch: str | None = Field(
        default=None,
        pattern=GPU_ARCH_PATTERN,
        max_length=8,
        description="CUDA compute capability the plan was built for, e.g. sm90 (TensorRT only; "
        "unset: read from the file name).",
    )
    precision: Precision | None = Field(
        default=None, description="Precision of the engine; unset: read from the file name."
    )
    tensorrt_version: str | None = Field(
        default=None,
        pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+){0,2}$",
        max_length=32,
        description="TensorRT version the plan was built with, e.g. 11.4 (unset: read from the "
        "file name).",
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        max_length=64,
        description="Hex SHA-256 of the file; the runtime refuses a file that does not match.",
    )

    @property
    def effective_backend(self) -> Backend | None:
        """The backend, explicit or inferred from the file name."""
        if self.backend is not None:
            return self.backend
        if self.uri.endswith(".onnx"):
            return Backend.ONNXRUNTIME
        if self.uri.endswith((".engine", ".plan")):
            return Backend.TENSORRT
        return None

    @model_validator(mode="after")
    def _backend_known(self) -> Engine:
        if self.uri.startswith("file://") and not self.uri.startswith("file:///"):
            raise ValueError(FILE_URI_MESSAGE)
        if self.effective_backend is None:
            raise ValueError(
                "engines[].backend is required when engines[].uri does not end in .onnx, "
                ".engine or .plan"
            )
        if self.backend is Backend.ONNXRUNTIME and (
            self.gpu_arch is not None or self.tensorrt_version is not None
        ):
            raise ValueError(
                "engines[].gpuArch and engines[].tensorrtVersion apply to tensorrt engines only"
            )
        return self


class Batching(ApiModel):
    """Dynamic batching: how long a request may wait for others to share a batch."""

    max_queue_delay_ms: float = Field(
        default=2.0,
        ge=0,
        le=1000,
        description="Longest a request waits in the queue to fill a batch, in milliseconds.",
    )
    timeout_ms: float | None = Field(
        default=None,
        gt=0,
        le=600000,
        description="Deadline of each request from its arrival, in milliseconds: a request "
        "still queued then is answered with a timeout (a request's own timeout parameter "
        "shortens it); unset: no deadline.",
    )
    preferred_batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=list,
        max_length=16,
        description="Batch sizes the batcher aims for (each <= maxBatchSize).",
        json_schema_extra={"x-kubernetes-list-type": "set", "default": []},
    )

    @model_validator(mode="after")
    def _sizes_unique(self) -> Batching:
        if len(set(self.preferred_batch_sizes)) != len(self.preferred_batch_sizes):
            raise ValueError("batching.preferredBatchSizes must not repeat a size")
        return self


class Warmup(ApiModel):
    """Inference runs before a pod reports ready, so its first real request is hot."""

    batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1],
        max_length=16,
        description="Batch sizes to run once loaded (each <= maxBatchSize).",
        json_schema_extra={"x-kubernetes-list-type": "set", "default": [1]},
    )
    iterations: int = Field(
        default=1, ge=0, le=100, description="Runs per batch size; 0 disables warm-up."
    )

    @model_validator(mode="after")
    def _sizes_unique(self) -> Warmup:
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("warmup.batchSizes must not repeat a size")
        return self


ENGINES_OR_BUILD_MESSAGE = (
    "models[]: set either engines (URIs) or build (a ModelBuild's engines), exactly one"
)


class BuildRef(ApiModel):
    """Engines from a ModelBuild in this namespace: the operator serves the engine of this
    precision for the pool's target (``cpu`` for onnxruntime) only once it passed its accuracy
    gate and was published; until then, or if the gate refused it, the service is Degraded
    naming why and its pods keep what they serve (a refused engine never reaches a pod)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The ModelBuild's name (metadata.name) in this namespace.",
    )
    precision: Precision = Field(description="The precision served, e.g. int8 or fp32.")


class Model(ApiModel):
    """A model served by the InferenceService, with one engine per backend/arch/precision."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "has(self.build) != (has(self.engines) && self.engines.size() > 0)",
                ENGINES_OR_BUILD_MESSAGE,
                ".engines",
            ),
            cel(
                "self.maxBatchSize < 1 || "
                "self.batching.preferredBatchSizes.all(b, b <= self.maxBatchSize)",
                "models[].batching.preferredBatchSizes must each be <= models[].maxBatchSize",
                ".batching.preferredBatchSizes",
            ),
            cel(
                "self.maxBatchSize < 1 || self.warmup.batchSizes.all(b, b <= self.maxBatchSize)",
                "models[].warmup.batchSizes must each be <= models[].maxBatchSize",
                ".warmup.batchSizes",
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=MODEL_NAME_PATTERN,
        description="Model name in the inference URL (/v2/models/<name>/infer); unique.",
    )
    engines: list[Engine] = Field(
        default_factory=list,
        max_length=32,
        description="Engines of this model; the runtime picks the one for its backend and GPU. "
        "Each uri at most once. Or set build instead.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uri"]},
    )
    build: BuildRef | None = Field(
        default=None,
        description="Serve the engines a ModelBuild published (instead of engines): only an "
        "engine that passed its accuracy gate is ever served.",
    )
    max_batch_size: int = Field(
        default=8, ge=1, le=4096, description="Largest batch the runtime forms for this model."
    )
    batching: Batching = Field(
        default_factory=Batching,
        description="Dynamic batching settings.",
        json_schema_extra={"default": {}},
    )
    warmup: Warmup = Field(
        default_factory=Warmup,
        description="Warm-up before readiness.",
        json_schema_extra={"default": {}},
    )
    preload: bool = Field(
        default=True,
        description="Load and warm up before the pod reports ready (hot); false loads it on "
        "its first request (cold) and lets the engine cache evict it when memory is short. "
        "Not used with spec.fleet: placement decides which models are hot where.",
    )
    memory: ByteQuantity | None = Field(
        default=None,
        description="Device memory of the loaded engine, e.g. 1500Mi. Optional: the runtime "
        "measures it on the first load; declared, it lets fleet placement plan before that and "
        "a model larger than every replica's budget is reported at once.",
    )

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> Model:
        if (self.build is not None) == bool(self.engines):
            raise ValueError(ENGINES_OR_BUILD_MESSAGE)
        uris = [e.uri for e in self.engines]
        repeated = sorted({u for u in uris if uris.count(u) > 1})
        if repeated:
            raise ValueError(
                f"models[].engines[].uri must be unique within a model: {', '.join(repeated)}"
            )
        if any(b > self.max_batch_size for b in self.batching.preferred_batch_sizes):
            raise ValueError(
                "models[].batching.preferredBatchSizes must each be <= models[].maxBatchSize"
            )
        if any(b > self.max_batch_size for b in self.warmup.batch_sizes):
            raise ValueError("models[].warmup.batchSizes must each be <= models[].maxBatchSize")
        return self


class Memory(ApiModel):
    """GPU memory budgets of each pod."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "!has(self.weightStreamingBudget) || "
                f"!{_matches('self.weightStreamingBudget', WEIGHT_STREAMING_PATTERN)} || "
                "self.weightStreamingBudget == 'auto' || "
                "(self.weightStreamingBudget.endsWith('%') ? "
                "(double(self.weightStreamingBudget.substring(0, "
                "self.weightStreamingBudget.size() - 1)) > 0.0 && "
                "double(self.weightStreamingBudget.substring(0, "
                "self.weightStreamingBudget.size() - 1)) <= 100.0) : "
                f"{_whole_bytes_cel('self.weightStreamingBudget')})",
                "memory.weightStreamingBudget must be auto, a quantity such as 8Gi, or a "
                "percentage above 0% and at most 100%",
                ".weightStreamingBudget",
            ),
            cel(
                "!has(self.engineCacheBudget) || "
                f"!{_matches('self.engineCacheBudget', BYTES_PATTERN)} || "
                "quantity(self.engineCacheBudget).isGreaterThan(quantity('0'))",
                "memory.engineCacheBudget must be above 0",
                ".engineCacheBudget",
            ),
            cel(
                "!has(self.engineCacheBudget) || "
                f"!{_matches('self.engineCacheBudget', BYTES_PATTERN)} || "
                f"!{_matches('self.reserve', BYTES_PATTERN)} || "
                f"!{_whole_bytes_cel('self.engineCacheBudget')} || "
                f"!{_whole_bytes_cel('self.reserve')} || "
                "!quantity(self.engineCacheBudget).isGreaterThan(quantity('0')) || "
                "quantity(self.reserve).isLessThan(quantity(self.engineCacheBudget))",
                "memory.reserve must be smaller than memory.engineCacheBudget",
                ".reserve",
            ),
        )
    )

    engine_cache_budget: ByteQuantity | None = Field(
        default=None,
        description="GPU memory for loaded engines (the hot set), e.g. 20Gi; unset: the "
        "runtime's default.",
    )
    weight_streaming_budget: WeightStreamingBudget | None = Field(
        default=None,
        description="TensorRT weight streaming: GPU memory for weights as bytes (8Gi), a "
        "percentage of the streamable weights (60%) or auto; unset: weights stay resident.",
    )
    reserve: ByteQuantity = Field(
        default="0",
        description="GPU memory never given to engines (activations, other processes).",
    )

    @model_validator(mode="after")
    def _budgets(self) -> Memory:
        budget = self.weight_streaming_budget
        pct = percent_value(budget) if budget is not None else None
        if pct is not None and not 0 < pct <= 100:
            raise ValueError(
                "memory.weightStreamingBudget must be auto, a quantity such as 8Gi, or a "
                "percentage above 0% and at most 100%"
            )
        if budget is not None and pct is None and budget != "auto" and not is_whole_bytes(budget):
            raise ValueError(
                "memory.weightStreamingBudget must be auto, a quantity such as 8Gi, or a "
                f"percentage above 0% and at most 100%: {BYTES_MESSAGE}"
            )
        cache = self.engine_cache_budget
        if cache is not None and quantity_bytes(cache) == 0:
            raise ValueError("memory.engineCacheBudget must be above 0")
        if cache is not None and quantity_bytes(self.reserve) >= quantity_bytes(cache):
            raise ValueError("memory.reserve must be smaller than memory.engineCacheBudget")
        return self


# ---------------------------------------------------------------------------------------------
# Autoscaling

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
    hold_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="With minReplicas 0 (and no spec.fleet): longest the gateway in front of "
        "the service holds a request while it wakes from zero; then 503 with Retry-After (a "
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


# ---------------------------------------------------------------------------------------------
# Rollout


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


# ---------------------------------------------------------------------------------------------
# Fleet: many models per service, a model gateway and placement


LOADS_TOTAL_MESSAGE = (
    "spec.fleet.gateway.maxLoadsTotal must be >= spec.fleet.gateway.maxLoadsPerReplica: the "
    "pool-wide limit would cut the per-replica one"
)


class FleetGateway(ApiModel):
    """The model gateway in front of the runtime pods (a Deployment of its own)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            cel(
                "self.maxLoadsTotal >= self.maxLoadsPerReplica",
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
    max_loads_total: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="Cold loads the gateway asks the whole pool for at a time.",
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
        if self.max_loads_total < self.max_loads_per_replica:
            raise ValueError(LOADS_TOTAL_MESSAGE)
        return self


MIN_RATE_MESSAGE = (
    "spec.fleet.placement.minRate must be <= spec.fleet.placement.ratePerCopy: a model busy "
    "enough for a copy would be pinned nowhere"
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


# ---------------------------------------------------------------------------------------------
# Spec


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


# ---------------------------------------------------------------------------------------------
# Status


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
