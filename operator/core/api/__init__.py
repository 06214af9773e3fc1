"""The InferenceService API (``serving.tidal.dev/v1alpha1``): the one source of truth.

This package owns the typed model of the custom resource. ``tidal.operator.crdgen`` turns these
models into the CRD's OpenAPI schema, so every description here is what ``kubectl explain``
prints, and every bound, pattern and enum here is enforced by the API server.

Cross-field rules are written twice, on purpose: as CEL (``x-kubernetes-validations``, carried by
each model's ``json_schema_extra``) so the API server rejects a bad object before anyone stores
it, and as a pydantic validator so the operator's pure core (and unit tests without a cluster)
reach the same verdict. Each model keeps both side by side. ``tests/operator/invalid/`` holds one
manifest per rule and a test checks that both layers reject each of them with a message naming
the field.

Everything a spec can say that passes these rules but still cannot work (for example no engine
for the selected backend) is found by :func:`tidal.operator.core.resources.find_spec_problems`
and reported as the ``Degraded`` condition instead of being rejected: those depend on facts the
schema cannot know. Settings of a working spec that can never act, or that contradict each
other, are the rows of :data:`tidal.operator.core.rules.SETTING_RULES` (``Degraded``
``IneffectiveSetting`` / ``ConflictingSettings``); the operator README's rules table lists them
beside the CEL rules here (``make crds`` writes it).

The modules follow the resource's sections; import from this package, not from them:

    base         group, version, names, labels; ApiModel, Resource; CEL rule helpers
    formats      patterns, constrained strings (Quantity, ByteQuantity, Duration, ...), parsing
    pod          spec.runtime (and the baseline's RuntimeOverride)
    engines      spec.models (engines, batching, warm-up, ModelBuild refs) and spec.memory
    autoscaling  spec.autoscaling
    rollout      spec.rollout (baseline, SLO, steps)
    fleet        spec.fleet (gateway, placement, forecast)
    status       status
    service      the spec and the resource put together; parsing and error wording
"""

from ....common.contract import (
    BYTES_MESSAGE,
    BYTES_PATTERN,
    QUANTITY_UNITS,
    is_whole_bytes,
    quantity_bytes,
)
from .autoscaling import (
    HOST_TIER_MESSAGE,
    Autoscaling,
    StandbyTier,
)
from .base import (
    ANNOTATION_CONFIG_HASH,
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    LABEL_ISVC,
    LABEL_POOL,
    LABEL_ROLE,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ApiModel,
    Resource,
    cel,
)
from .base import (
    _rules as _rules,
)
from .engines import (
    ENGINES_OR_BUILD_MESSAGE,
    FILE_URI_MESSAGE,
    MAX_MODELS,
    Batching,
    BuildRef,
    Engine,
    Memory,
    Model,
    Precision,
    Warmup,
)
from .fleet import (
    LEAD_MESSAGE,
    LOADS_TOTAL_MESSAGE,
    MIN_RATE_MESSAGE,
    Fleet,
    FleetForecast,
    FleetGateway,
    FleetPlacement,
)
from .formats import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    DURATION_PATTERN,
    ENGINE_URI_PATTERN,
    ENV_NAME_PATTERN,
    GPU_ARCH_PATTERN,
    IMAGE_PATTERN,
    LABEL_VALUE_PATTERN,
    MODEL_NAME_PATTERN,
    PERCENT_PATTERN,
    QUALIFIED_NAME_MAX,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
    SHA256_PATTERN,
    URI_SCHEMES,
    WEIGHT_STREAMING_PATTERN,
    ByteQuantity,
    Duration,
    LabelValue,
    Percent,
    Quantity,
    WeightStreamingBudget,
    duration_seconds,
    percent_value,
    quantity_cmp,
)
from .pod import (
    EXTENDED_MESSAGE,
    GATEWAY_GPU_RESOURCE_MESSAGE,
    GPU_RESOURCE_MESSAGE,
    HOST_PATH_BACKSTEP_MESSAGE,
    RESERVED_ENV_MESSAGE,
    RESERVED_ENV_NAMES,
    RESOURCE_NAMES_MESSAGE,
    S3_CREDENTIAL_KEYS,
    S3_ENDPOINT_PATTERN,
    SIZE_LIMIT_WITH_HOST_PATH_MESSAGE,
    WHOLE_BYTES_RESOURCES_MESSAGE,
    Backend,
    EngineCache,
    EnvVar,
    GatewayResourceRequirements,
    LogLevel,
    ResourceRequirements,
    Runtime,
    RuntimeOverride,
    S3Storage,
    Storage,
    Toleration,
)
from .rollout import (
    OVERFLOW_MESSAGE,
    ActivePool,
    Baseline,
    BreachAction,
    Rollout,
    Slo,
)
from .service import (
    METADATA_SCHEMA,
    NAME_MESSAGE,
    InferenceService,
    InferenceServiceSpec,
    format_validation_error,
    parse_inference_service,
)
from .status import (
    AutoscalerStatus,
    Condition,
    ConditionStatus,
    Decision,
    FleetStatus,
    InferenceServiceStatus,
    PoolName,
    PoolStatus,
    RolloutStatus,
    ServedBuild,
    ServiceMetrics,
    TimeToRoutable,
)

# The suffixes' values, by the name the module api.py gave them (tests read it).
_UNITS = QUANTITY_UNITS

__all__ = [
    "ANNOTATION_CONFIG_HASH",
    "API_VERSION",
    "BYTES_MESSAGE",
    "BYTES_PATTERN",
    "CATEGORIES",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "DURATION_PATTERN",
    "ENGINES_OR_BUILD_MESSAGE",
    "ENGINE_URI_PATTERN",
    "ENV_NAME_PATTERN",
    "EXTENDED_MESSAGE",
    "FILE_URI_MESSAGE",
    "GATEWAY_GPU_RESOURCE_MESSAGE",
    "GPU_ARCH_PATTERN",
    "GPU_RESOURCE_MESSAGE",
    "GROUP",
    "HOST_PATH_BACKSTEP_MESSAGE",
    "HOST_TIER_MESSAGE",
    "IMAGE_PATTERN",
    "KIND",
    "LABEL_ISVC",
    "LABEL_POOL",
    "LABEL_ROLE",
    "LABEL_VALUE_PATTERN",
    "LEAD_MESSAGE",
    "LOADS_TOTAL_MESSAGE",
    "MAX_MODELS",
    "METADATA_SCHEMA",
    "MIN_RATE_MESSAGE",
    "MODEL_NAME_PATTERN",
    "NAME_MESSAGE",
    "OVERFLOW_MESSAGE",
    "PERCENT_PATTERN",
    "PLURAL",
    "QUALIFIED_NAME_MAX",
    "QUALIFIED_NAME_PATTERN",
    "QUANTITY_PATTERN",
    "RESERVED_ENV_MESSAGE",
    "RESERVED_ENV_NAMES",
    "RESOURCE_NAMES_MESSAGE",
    "S3_CREDENTIAL_KEYS",
    "S3_ENDPOINT_PATTERN",
    "SHA256_PATTERN",
    "SHORT_NAMES",
    "SINGULAR",
    "SIZE_LIMIT_WITH_HOST_PATH_MESSAGE",
    "URI_SCHEMES",
    "VERSION",
    "WEIGHT_STREAMING_PATTERN",
    "WHOLE_BYTES_RESOURCES_MESSAGE",
    "ActivePool",
    "ApiModel",
    "AutoscalerStatus",
    "Autoscaling",
    "Backend",
    "Baseline",
    "Batching",
    "BreachAction",
    "BuildRef",
    "ByteQuantity",
    "Condition",
    "ConditionStatus",
    "Decision",
    "Duration",
    "Engine",
    "EngineCache",
    "EnvVar",
    "Fleet",
    "FleetForecast",
    "FleetGateway",
    "FleetPlacement",
    "FleetStatus",
    "GatewayResourceRequirements",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "LabelValue",
    "LogLevel",
    "Memory",
    "Model",
    "Percent",
    "PoolName",
    "PoolStatus",
    "Precision",
    "Quantity",
    "Resource",
    "ResourceRequirements",
    "Rollout",
    "RolloutStatus",
    "Runtime",
    "RuntimeOverride",
    "S3Storage",
    "ServedBuild",
    "ServiceMetrics",
    "Slo",
    "StandbyTier",
    "Storage",
    "TimeToRoutable",
    "Toleration",
    "Warmup",
    "WeightStreamingBudget",
    "cel",
    "duration_seconds",
    "format_validation_error",
    "is_whole_bytes",
    "parse_inference_service",
    "percent_value",
    "quantity_bytes",
    "quantity_cmp",
]
