"""Desired children of an InferenceService, computed without I/O.

This module owns what the operator *wants* to exist: per pool a ConfigMap with the runtime's
configuration and a Deployment of runtime pods, plus one Service whose selector picks the pool
that gets traffic (or, for a fleet or a service that may scale to zero, a gateway Deployment
and a Service that selects it). :func:`desired_objects` is pure and total over valid specs;
the shell server-side-applies its output as is, so every field listed here is a field the
operator owns, and nothing else is.

Naming and labels are a contract with the autoscaler and Prometheus (DESIGN.md §3):
Deployment ``<isvc>-<pool>``, Service ``<isvc>``, ConfigMap ``<isvc>-<pool>-config``; pods carry
``serving.tidal.dev/{isvc,pool,role}``. The Deployment selects on {isvc, pool} only, so the
autoscaler can relabel ready pods ``role=standby`` (taking them out of the Service) without the
ReplicaSet replacing them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ...common.contract import (
    DEFAULT_ENGINE_CACHE_BUDGET_BYTES,
    ENV_GRPC_PORT,
    ENV_HOST,
    ENV_LOG_LEVEL,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_PORT,
    ENV_RUNTIME_CONFIG_JSON,
    RUNTIME_GRPC_PORT,
    RUNTIME_HTTP_PORT,
)
from .api import (
    ANNOTATION_CONFIG_HASH,
    API_VERSION,
    GROUP,
    KIND,
    LABEL_ISVC,
    LABEL_POOL,
    LABEL_ROLE,
    S3_CREDENTIAL_KEYS,
    ActivePool,
    Backend,
    Engine,
    Fleet,
    FleetGateway,
    InferenceService,
    Memory,
    Model,
    PoolName,
    Runtime,
    RuntimeOverride,
    format_validation_error,
    percent_value,
    quantity_bytes,
)
from .images import runtime_image

LABEL_COMPONENT = f"{GROUP}/component"

RUNTIME_PORT = RUNTIME_HTTP_PORT
GATEWAY_PORT = 8080
GATEWAY_GRPC_PORT = 8081  # OIP v2 gRPC passed through (tidal.gateway.grpc_proxy)
GATEWAY_CONTAINER = "gateway"
COMPONENT_GATEWAY = "gateway"
GATEWAY_CONFIG_ENV = "TIDAL_GATEWAY_CONFIG_JSON"
# The runtime's engine budget when spec.memory.engineCacheBudget is unset (tidal.runtime.config).
RUNTIME_DEFAULT_ENGINE_BUDGET = DEFAULT_ENGINE_CACHE_BUDGET_BYTES
CONFIG_KEY = "runtime-config.json"
CONTAINER_NAME = "runtime"
# Runtime and gateway pods run as this numeric user with a read-only root filesystem (the
# images' USER): what they write goes to an emptyDir at /tmp and the engine cache volume.
POD_UID = 65532
ENGINE_CACHE_MOUNT = "/var/cache/tidal/engines"
ENGINE_CACHE_VOLUME = "engine-cache"  # the pod's volumes[1] (volumes[0] is tmp)
TMP_MOUNT = "/tmp"
ROLE_SERVING = "serving"
ROLE_STANDBY = "standby"
MANAGED_BY = "tidal-operator"
ANNOTATION_APPLIED_HASH = "serving.tidal.dev/applied-hash"
ENGINE_FORMAT = {Backend.ONNXRUNTIME: "onnx", Backend.TENSORRT: "plan"}
# What tidal.runtime's storage can read today (the API also admits gs://).
RUNTIME_FETCH_SCHEMES = frozenset({"file", "http", "https", "s3"})
RUNTIME_CONFIG_ENV = ENV_RUNTIME_CONFIG_JSON
# Linux refuses to exec a process with one environment string (NAME=value and its NUL) longer
# than MAX_ARG_STRLEN (32 pages): the runtime's config travels in one variable.
MAX_ENV_STRING_BYTES = 32 * 4096


@dataclass(frozen=True)
class Pool:
    """The effective configuration of one pool (the baseline's unset fields copy the primary)."""

    name: PoolName
    runtime: Runtime
    models: tuple[Model, ...]
    memory: Memory


@dataclass(frozen=True)
class Observed:
    """What the shell knows beyond the spec when it computes the desired children.

    ``replicas``: the replica count per pool that the autoscaler (or, before it has decided,
    the existing Deployment) asks for; absent pools start at their minimum.
    ``active_pool``: the pool the rollout logic routes to when ``spec.rollout.activePool`` is
    ``auto`` (the last decision, as recorded in status).
    ``split``: a staged rollout step routes to the serving pods of both pools (the replica
    counts set the shares), so the Service selects on the InferenceService and role only.
    """

    replicas: Mapping[PoolName, int] = field(default_factory=dict)
    active_pool: PoolName = PoolName.PRIMARY
    split: bool = False
    # For the Service's switch between the gateway and the pods (``service_selects_gateway``):
    # the ``<isvc>-gateway`` Deployment has a ready pod; a serving pod of a pool the Service
    # would select is Ready.
    gateway_ready: bool = False
    serving_ready: bool = False


BASELINE_RUNTIME = "spec.rollout.baseline.runtime"


def _overridden(override: RuntimeOverride | None) -> dict[str, Any]:
    """The runtime fields ``spec.rollout.baseline.runtime`` names (python name: value)."""
    if override is None:
        return {}
    values = {name: getattr(override, name) for name in type(override).model_fields}
    return {name: value for name, value in values.items() if value is not None}


def merge_runtime(primary: Runtime, override: RuntimeOverride | None) -> Runtime:
    """The baseline's runtime: the primary's with the fields the override names replaced
    (a nested value replaced whole). Raises ValueError naming the baseline's fields when the
    result breaks a rule of :class:`Runtime` (say gpus: 2 on an onnxruntime primary)."""
    replaced = _overridden(override)
    if not replaced:
        return primary
    try:
        return Runtime.model_validate({**dict(primary), **replaced})
    except ValidationError as exc:
        detail = format_validation_error(exc).replace("\n", "; ")
        named = ", ".join(
            f"{BASELINE_RUNTIME}.{Runtime.model_fields[n].alias or n}" for n in replaced
        )
        raise ValueError(
            f"{named}: the baseline's runtime (spec.runtime with these fields replaced) is "
            f"invalid: {detail}; set the fields it needs in "
            f"{BASELINE_RUNTIME} too"
        ) from exc


def _baseline_runtime(spec_runtime: Runtime, override: RuntimeOverride | None) -> Runtime:
    try:
        return merge_runtime(spec_runtime, override)
    except ValueError:
        # Reported by find_spec_problems (nothing is built); kept as written meanwhile so the
        # pool's name and models stay known.
        return Runtime.model_construct(**{**dict(spec_runtime), **_overridden(override)})


def pools_of(isvc: InferenceService) -> tuple[Pool, ...]:
    """The primary pool, and the baseline pool when ``spec.rollout.baseline`` is set."""
    spec = isvc.spec
    primary = Pool(PoolName.PRIMARY, spec.runtime, tuple(spec.models), spec.memory)
    baseline = spec.rollout.baseline
    if baseline is None:
        return (primary,)
    return (
        primary,
        Pool(
            PoolName.BASELINE,
            _baseline_runtime(spec.runtime, baseline.runtime),
            tuple(baseline.models or spec.models),
            baseline.memory or spec.memory,
        ),
    )


@dataclass(frozen=True)
class PoolPaths:
    """Where a pool's settings were written: the baseline's unset fields are the primary's."""

    runtime_overrides: frozenset[str]
    models: str
    memory: str

    def runtime(self, name: str) -> str:
        """Path of the runtime field ``name`` (wire name) this pool reads."""
        at = BASELINE_RUNTIME if name in self.runtime_overrides else "spec.runtime"
        return f"{at}.{name}"


def paths_of(isvc: InferenceService, pool: PoolName) -> PoolPaths:
    baseline = isvc.spec.rollout.baseline
    if pool is PoolName.PRIMARY or baseline is None:
        return PoolPaths(frozenset(), "spec.models", "spec.memory")
    at = "spec.rollout.baseline"
    return PoolPaths(
        frozenset(Runtime.model_fields[n].alias or n for n in _overridden(baseline.runtime)),
        f"{at}.models" if baseline.models is not None else "spec.models",
        f"{at}.memory" if baseline.memory is not None else "spec.memory",
    )


def secret_fields(isvc: InferenceService) -> dict[str, str]:
    """Secrets the pods read, by name, with the spec field that names each (for a pod that
    cannot start because one is missing: ``core.podfaults.unstartable_pods``)."""
    out: dict[str, str] = {}
    for pool in pools_of(isvc):
        s3 = pool.runtime.storage.s3
        if s3 is not None and s3.credentials_secret is not None:
            path = paths_of(isvc, pool.name).runtime("storage")
            out.setdefault(s3.credentials_secret, f"{path}.s3.credentialsSecret")
    return out


def find_spec_problems(isvc: InferenceService) -> list[str]:
    """Reasons a schema-valid spec cannot work, each naming the field to change (empty: fine)."""
    problems: list[str] = []
    baseline = isvc.spec.rollout.baseline
    if baseline is not None:
        try:
            merge_runtime(isvc.spec.runtime, baseline.runtime)
        except ValueError as exc:
            return [f"{PoolName.BASELINE.value} pool: {exc}"]
    for pool in pools_of(isvc):
        paths = paths_of(isvc, pool.name)
        prefix = f"{pool.name.value} pool"
        problems += [f"{prefix}: {p}" for p in _model_problems(pool, paths)]
        problems += [f"{prefix}: {p}" for p in _memory_problems(pool, paths, isvc.spec.fleet)]
        size = _config_env_bytes(pool, isvc.spec.fleet is not None)
        if size > MAX_ENV_STRING_BYTES:
            problems.append(
                f"{prefix}: {paths.models}: the runtime configuration is {size} bytes, more than "
                f"the {MAX_ENV_STRING_BYTES} bytes of one environment variable "
                f"({RUNTIME_CONFIG_ENV}); the pods could not start: shorten the engine URIs or "
                "split the models over several InferenceServices"
            )
    return problems


def too_large_for_the_budget(pool: Pool, paths: PoolPaths) -> list[str]:
    """Models declared (``models[].memory``) larger than a replica's engine budget."""
    budget = engine_budget_bytes(pool.memory)
    lower = f" or lower {paths.memory}.reserve" if quantity_bytes(pool.memory.reserve) else ""
    found = []
    for model in pool.models:
        if model.memory is not None and quantity_bytes(model.memory) > budget > 0:
            gap = quantity_bytes(model.memory) - budget
            found.append(
                f"model {model.name!r} needs {model.memory} "
                f"({paths.models}[{model.name}].memory) but a replica's engine budget is "
                f"{budget} bytes ({gap} bytes short): raise "
                f"{paths.memory}.engineCacheBudget{lower}, or serve the model from a "
                "service with larger replicas"
            )
    return found


def _config_env_bytes(pool: Pool, fleet: bool) -> int:
    text = _canonical_json(render_runtime_config(pool, fleet))
    return len(f"{RUNTIME_CONFIG_ENV}={text}".encode()) + 1


def _model_problems(pool: Pool, paths: PoolPaths) -> list[str]:
    problems: list[str] = []
    backend = pool.runtime.backend
    for model in pool.models:
        at = f"{paths.models}[{model.name}]"
        if not any(e.effective_backend is backend for e in model.engines):
            have = sorted({str(e.effective_backend) for e in model.engines})
            problems.append(
                f"model {model.name!r} has no engine for backend {backend.value} (it has "
                f"{', '.join(have)}); add an engine with backend: {backend.value} to "
                f"{at}.engines or set {paths.runtime('backend')} to one of {', '.join(have)}"
            )
        for index, engine in enumerate(model.engines):
            uri_path = f"{at}.engines[{index}].uri"
            scheme = engine.uri.split("://", 1)[0]
            if scheme not in RUNTIME_FETCH_SCHEMES:
                problems.append(
                    f"model {model.name!r}: {uri_path}: the runtime cannot fetch {scheme}:// "
                    f"yet ({engine.uri}); serve the file over https:// (for example a presigned "
                    "object-store URL), from s3:// or from file://"
                )
            if engine.effective_backend is Backend.TENSORRT and not _plan_described(engine):
                problems.append(
                    f"model {model.name!r}: {uri_path}: {engine.uri} does not follow "
                    "<gpuArch>-trt<major>.<minor>[-vc]-<precision>.engine; rename it or set "
                    f"{at}.engines[{index}].gpuArch, tensorrtVersion and precision"
                )
    return problems


def _memory_problems(pool: Pool, paths: PoolPaths, fleet: Fleet | None) -> list[str]:
    problems: list[str] = []
    memory = pool.memory
    budget = engine_budget_bytes(memory)
    if memory.engine_cache_budget is None and budget == 0:
        problems.append(
            f"{paths.memory}.reserve {memory.reserve} leaves no engine budget: the runtime's "
            f"default engine cache budget is {RUNTIME_DEFAULT_ENGINE_BUDGET} bytes; lower "
            f"{paths.memory}.reserve or set {paths.memory}.engineCacheBudget above it"
        )
    if fleet is not None:
        problems += too_large_for_the_budget(pool, paths)
    if memory.weight_streaming_budget is not None and pool.runtime.backend is not Backend.TENSORRT:
        problems.append(
            f"{paths.memory}.weightStreamingBudget needs backend tensorrt; remove it or set "
            f"{paths.runtime('backend')}: tensorrt"
        )
    return problems


# The runtime's plan naming scheme (runtime/README.md); the operator cannot import the runtime.
_PLAN_NAME = re.compile(
    r"^(?P<arch>sm[0-9]{2,3})-trt(?P<ver>[0-9]+\.[0-9]+)(-vc)?-"
    r"(?P<prec>fp32|tf32|fp16|bf16|fp8|int8|fp4|int4)\.(engine|plan)$"
)


def _plan_described(engine: Engine) -> bool:
    """Whether the runtime can tell a plan's GPU arch, TensorRT version and precision."""
    if engine.gpu_arch and engine.tensorrt_version and engine.precision:
        return True
    name = engine.uri.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    return _PLAN_NAME.match(name) is not None


def engine_budget_bytes(memory: Memory) -> int:
    """Device bytes a runtime pod gives engines: the cache budget less the reserve."""
    if memory.engine_cache_budget is None:
        total = RUNTIME_DEFAULT_ENGINE_BUDGET
    else:
        total = quantity_bytes(memory.engine_cache_budget)
    return max(0, total - quantity_bytes(memory.reserve))


def placement_headroom(isvc: InferenceService) -> float:
    """Fraction of each replica's budget that placement leaves unpinned (0 without a fleet)."""
    fleet = isvc.spec.fleet
    return 0.0 if fleet is None else _fraction(fleet.placement.headroom)


def placement_landing_share(isvc: InferenceService) -> float:
    """Share of the replicas that keep landing room for the largest cold model (0 without a
    fleet)."""
    fleet = isvc.spec.fleet
    return 0.0 if fleet is None else _fraction(fleet.placement.landing_share)


def _fraction(percent: str) -> float:
    return (percent_value(percent) or 0.0) / 100.0


def resolve_active_pool(isvc: InferenceService, observed: Observed) -> PoolName:
    """The pool the Service routes to: a manual choice wins, ``auto`` follows the decision."""
    setting = isvc.spec.rollout.active_pool
    if setting is ActivePool.PRIMARY:
        return PoolName.PRIMARY
    if setting is ActivePool.BASELINE:
        return PoolName.BASELINE
    if observed.active_pool is PoolName.BASELINE and isvc.spec.rollout.baseline is not None:
        return PoolName.BASELINE
    return PoolName.PRIMARY


def desired_replicas(isvc: InferenceService, pool: PoolName, observed: Observed) -> int:
    """Replicas of a pool's Deployment (serving plus standby pods)."""
    scaling = isvc.spec.autoscaling
    asked = observed.replicas.get(pool)
    if pool is PoolName.PRIMARY:
        if isvc.spec.replicas is not None:
            return isvc.spec.replicas
        # A new service with minReplicas 0 starts with one replica, as Knative's initial
        # scale: it goes to zero once idle (``core.idle``), not before its first request.
        first = max(scaling.min_replicas, 1)
        initial = min(first + scaling.standby_replicas, scaling.max_replicas)
        wanted = initial if asked is None else asked
        return max(scaling.min_replicas, min(scaling.max_replicas, wanted))
    baseline = isvc.spec.rollout.baseline
    floor = baseline.min_replicas if baseline is not None else 0
    return max(floor, min(scaling.max_replicas, floor if asked is None else asked))


def _engine_entry(engine: Engine, backend: Backend) -> dict[str, Any]:
    """One engine of the pool's backend as the runtime's configuration lists it."""
    entry: dict[str, Any] = {"uri": engine.uri, "format": ENGINE_FORMAT[backend]}
    if engine.sha256 is not None:
        entry["sha256"] = engine.sha256
    if engine.gpu_arch is not None:
        entry["gpuArch"] = engine.gpu_arch
    if engine.precision is not None:
        entry["precision"] = engine.precision.value
    if engine.tensorrt_version is not None:
        entry["trtVersion"] = engine.tensorrt_version
    return entry


def render_runtime_config(pool: Pool, fleet: bool = False) -> dict[str, Any]:
    """The runtime's configuration (``tidal.runtime.config.RuntimeConfig``) as plain JSON.

    Only the engines for the pool's backend are passed on: the runtime of an onnxruntime pool
    has no use for TensorRT plans (and :func:`find_spec_problems` reports models left without
    any engine). Under ``spec.fleet`` no model is preloaded: a pod is ready as soon as it runs,
    the placement then pins models onto it, and the gateway routes a model only to the pods
    where it is hot.
    """
    backend = pool.runtime.backend
    models = []
    for model in pool.models:
        engines = [
            _engine_entry(e, backend) for e in model.engines if e.effective_backend is backend
        ]
        version = {} if model.version is None else {"version": model.version}
        models.append(
            {
                "name": model.name,
                **version,
                "engines": engines,
                "maxBatchSize": model.max_batch_size,
                "batching": _batching(model),
                "warmup": {
                    "batchSizes": list(model.warmup.batch_sizes),
                    "iterations": model.warmup.iterations,
                },
                "preload": model.preload and not fleet,
            }
        )
    memory: dict[str, Any] = {"reserveBytes": quantity_bytes(pool.memory.reserve)}
    if pool.memory.engine_cache_budget is not None:
        memory["engineCacheBudgetBytes"] = quantity_bytes(pool.memory.engine_cache_budget)
    if pool.memory.weight_streaming_budget is not None:
        budget = pool.memory.weight_streaming_budget
        memory["weightStreamingBudget"] = (
            budget if budget == "auto" or budget.endswith("%") else quantity_bytes(budget)
        )
    config: dict[str, Any] = {
        "backend": backend.value,
        "models": models,
        "memory": memory,
        "cacheDir": ENGINE_CACHE_MOUNT,
    }
    s3 = pool.runtime.storage.s3
    if s3 is not None:  # only when set, so that existing pools keep their config hash
        store: dict[str, Any] = {"region": s3.region, "pathStyle": s3.path_style}
        if s3.endpoint is not None:
            store["endpoint"] = s3.endpoint
        config["s3"] = store
    return config


def _batching(model: Model) -> dict[str, Any]:
    batching: dict[str, Any] = {
        "maxQueueDelayMs": model.batching.max_queue_delay_ms,
        "preferredBatchSizes": list(model.batching.preferred_batch_sizes),
    }
    # Only when set, so that existing pools keep their config hash (and are not rolled).
    if model.batching.timeout_ms is not None:
        batching["timeoutMs"] = model.batching.timeout_ms
    return batching


def _canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def content_hash(data: Any) -> str:
    """A short, stable hash of JSON-able data (canonical key order)."""
    text = _canonical_json(data)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def common_labels(isvc: InferenceService) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tidal-runtime",
        "app.kubernetes.io/instance": isvc.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_ISVC: isvc.name,
    }


def owner_reference(isvc: InferenceService) -> dict[str, Any]:
    """Makes the garbage collector delete children with their InferenceService, even while
    the operator is down; so no finalizer is needed."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": isvc.name,
        "uid": isvc.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(isvc: InferenceService, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": isvc.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(isvc)],
    }


def deployment_name(isvc_name: str, pool: PoolName) -> str:
    return f"{isvc_name}-{pool.value}"


def config_map_name(isvc_name: str, pool: PoolName) -> str:
    return f"{isvc_name}-{pool.value}-config"


def _config_map(isvc: InferenceService, pool: Pool, config_json: str) -> dict[str, Any]:
    labels = {**common_labels(isvc), LABEL_POOL: pool.name.value}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(isvc, config_map_name(isvc.name, pool.name), labels),
        "data": {CONFIG_KEY: config_json},
    }


def _env(isvc: InferenceService, pool: Pool) -> list[dict[str, Any]]:
    def field_ref(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    fixed: list[dict[str, Any]] = [
        {"name": ENV_HOST, "valueFrom": field_ref("status.podIP")},
        {"name": ENV_POD_IP, "valueFrom": field_ref("status.podIP")},
        {"name": ENV_PORT, "value": str(RUNTIME_PORT)},
        {"name": ENV_GRPC_PORT, "value": str(RUNTIME_GRPC_PORT)},
        {"name": ENV_POD_NAME, "valueFrom": field_ref("metadata.name")},
        {"name": ENV_POD_NAMESPACE, "valueFrom": field_ref("metadata.namespace")},
        {"name": ENV_LOG_LEVEL, "value": pool.runtime.log_level.value},
        {
            "name": RUNTIME_CONFIG_ENV,
            "valueFrom": {
                "configMapKeyRef": {
                    "name": config_map_name(isvc.name, pool.name),
                    "key": CONFIG_KEY,
                }
            },
        },
    ]
    s3 = pool.runtime.storage.s3
    if s3 is not None and s3.credentials_secret is not None:
        # The keys by reference: credentials never reach the spec, the ConfigMap or a log. A
        # missing Secret or key keeps the pod in CreateContainerConfigError, which the control
        # loop reports as Degraded naming spec.runtime.storage.s3.credentialsSecret.
        for key in S3_CREDENTIAL_KEYS:
            ref: dict[str, Any] = {"name": s3.credentials_secret, "key": key}
            if key == "AWS_SESSION_TOKEN":
                ref["optional"] = True
            fixed.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    if s3 is not None:
        fixed.append({"name": "AWS_REGION", "value": s3.region})
    # The API rejects user variables named like ours (RESERVED_ENV_NAMES); ours win regardless.
    taken = {e["name"] for e in fixed}
    extra = [{"name": e.name, "value": e.value} for e in pool.runtime.env if e.name not in taken]
    return fixed + extra


def _resources(runtime: Runtime) -> dict[str, Any]:
    requests = dict(runtime.resources.requests)
    limits = dict(runtime.resources.limits)
    gpus = runtime.gpu_count
    if runtime.backend is Backend.TENSORRT and gpus > 0:
        # Extended resources must have request == limit; setting the limit implies the request.
        limits["nvidia.com/gpu"] = str(gpus)
        requests["nvidia.com/gpu"] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


# The restricted Pod Security level, which runtime and gateway pods meet (hostPath aside).
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": POD_UID,
    "runAsGroup": POD_UID,
    "fsGroup": POD_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _health_probes(**ready: int) -> dict[str, Any]:
    """A container's readiness probe, often so a warm pod joins the Service within a second,
    and its liveness probe (``ready``: more fields of the readiness probe)."""
    probe = {"port": "http", "scheme": "HTTP"}
    return {
        "readinessProbe": {
            "httpGet": {**probe, "path": "/v2/health/ready"},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 3,
            **ready,
        },
        "livenessProbe": {
            "httpGet": {**probe, "path": "/v2/health/live"},
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
    }


def _runtime_container(isvc: InferenceService, pool: Pool) -> dict[str, Any]:
    """The runtime container of a pool's pods."""
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": runtime_image(pool.runtime),
        "command": ["tidal-runtime"],
        "ports": [
            {"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": RUNTIME_GRPC_PORT, "protocol": "TCP"},
        ],
        "env": _env(isvc, pool),
        # Ready only once every preloaded model is loaded and warmed (DESIGN.md §3).
        **_health_probes(successThreshold=1),
    }
    resources = _resources(pool.runtime)
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = [
        {"name": "tmp", "mountPath": TMP_MOUNT},
        {"name": ENGINE_CACHE_VOLUME, "mountPath": ENGINE_CACHE_MOUNT},
    ]
    container["securityContext"] = CONTAINER_SECURITY
    return container


def _runtime_pod_spec(pool: Pool, container: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a pool's pods: the runtime container, its scratch and engine cache."""
    cache = pool.runtime.engine_cache
    engine_cache: dict[str, Any] = (
        {"hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
        if cache.host_path is not None
        else {"emptyDir": {"sizeLimit": cache.size_limit} if cache.size_limit else {}}
    )
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Hundreds of Services in a namespace would otherwise flood every pod's environment.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": POD_SECURITY,
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": ENGINE_CACHE_VOLUME, **engine_cache}],
    }
    if pool.runtime.node_selector:
        pod_spec["nodeSelector"] = dict(pool.runtime.node_selector)
    if pool.runtime.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in pool.runtime.tolerations]
    return pod_spec


def _deployment(
    isvc: InferenceService, pool: Pool, replicas: int, config_hash: str
) -> dict[str, Any]:
    selector = {LABEL_ISVC: isvc.name, LABEL_POOL: pool.name.value}
    pod_labels = {**common_labels(isvc), **selector, LABEL_ROLE: ROLE_SERVING}
    pod_spec = _runtime_pod_spec(pool, _runtime_container(isvc, pool))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(
            isvc,
            deployment_name(isvc.name, pool.name),
            {**common_labels(isvc), LABEL_POOL: pool.name.value},
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # Never below the current capacity during a roll: a new pod must be ready (warm)
            # before an old one goes, so Ready and the replica counts hold throughout.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 600,
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(RUNTIME_PORT),
                        "prometheus.io/path": "/metrics",
                        # The config reaches pods through env, read at start: a new hash in
                        # the template is what rolls the pods when the config changes.
                        ANNOTATION_CONFIG_HASH: config_hash,
                    },
                },
                "spec": pod_spec,
            },
        },
    }


# How the API server words a refusal of the engine cache's hostPath volume: Pod Security
# (`hostPath volumes (volume "engine-cache")`, in a ReplicaSet's FailedCreate that the Deployment
# reports as ReplicaFailure) and the Deployment's own validation (a 422 on
# `spec.template.spec.volumes[1].hostPath.path`).
_HOST_PATH_REFUSED = re.compile(
    rf'hostPath volumes? \(volumes? [^)]*"{ENGINE_CACHE_VOLUME}"|volumes\[1\]\.hostPath'
)


def explain_pool_failure(isvc: InferenceService, message: str) -> str:
    """A failure the API server reports about a pool's Deployment or its pods, with the spec
    field it comes from named where the operator knows it; else ``message`` unchanged.

    The engine cache's hostPath volume is the operator's rendering of
    ``runtime.engineCache.hostPath``: the user sees that field (the baseline's own, or the
    primary's it copies), not the volume's name or index."""
    if _HOST_PATH_REFUSED.search(message) is None:
        return message
    pool = PoolName.PRIMARY
    if f'"{deployment_name(isvc.name, PoolName.BASELINE)}' in message:
        pool = PoolName.BASELINE
    field = f"{paths_of(isvc, pool).runtime('engineCache')}.hostPath"
    runtime = next(p.runtime for p in pools_of(isvc) if p.name is pool)
    where = f"{field} {runtime.engine_cache.host_path or ''}".rstrip()
    if "PodSecurity" in message:
        return (
            f"{where}: the namespace {isvc.namespace}'s Pod Security level forbids hostPath "
            f"volumes, so no pod of pool {pool.value} can be created; unset {field} (each pod "
            "then caches in an emptyDir), or label the namespace "
            "pod-security.kubernetes.io/enforce=privileged (API server: "
            f"{message})"
        )
    return f"{where}: the API server refused it as a hostPath volume (API server: {message})"


def gateway_name(isvc_name: str) -> str:
    return f"{isvc_name}-gateway"


def may_scale_to_zero(isvc: InferenceService) -> bool:
    """Whether the autoscaler may take the service to zero serving replicas."""
    return isvc.spec.replicas is None and isvc.spec.autoscaling.min_replicas == 0


def burst_buffered(isvc: InferenceService) -> bool:
    """Whether a single-model service asked for the gateway as its burst buffer
    (``spec.autoscaling.burstBuffer``; a fleet's gateway routes anyway)."""
    return isvc.spec.fleet is None and isvc.spec.autoscaling.burst_buffer


def holds_requests(isvc: InferenceService) -> bool:
    """Whether the gateway in front of a single-model service holds its requests: while it
    wakes from zero (the activator), and while every ready replica has its slots in flight
    (the burst buffer, which the activator always is once awake)."""
    return may_scale_to_zero(isvc) or burst_buffered(isvc)


def fronted_by_gateway(isvc: InferenceService) -> bool:
    """Whether the Service's endpoints are gateway pods: a fleet (the gateway routes each
    model), or a service whose gateway holds its requests (:func:`holds_requests`)."""
    return isvc.spec.fleet is not None or holds_requests(isvc)


def service_selects_gateway(isvc: InferenceService, observed: Observed) -> bool:
    """Whether the Service ``<isvc>`` selects the gateway pods (else the serving pods).

    A fleet always: only its gateway routes by model. A service that switches between the
    activator and its pods (``minReplicas`` edited between 0 and more) keeps the side that
    takes requests until the other side can: entering zero, the pods stay selected until the
    new gateway has a ready pod (or no pod is ready, where the gateway at least holds);
    leaving zero, the gateway stays selected (holding, and forwarding to the replicas the
    operator still pushes to it) until a serving pod is ready. So no request that either side
    could answer meets a Service without endpoints.
    """
    if isvc.spec.fleet is not None:
        return True
    if holds_requests(isvc):
        return observed.gateway_ready or not observed.serving_ready
    return observed.gateway_ready and not observed.serving_ready


def gateway_retired(isvc: InferenceService, observed: Observed) -> bool:
    """Whether a left-over ``<isvc>-gateway`` (the service no longer may reach zero) is no
    longer selected by the Service and so goes to zero pods. The Deployment object stays
    (the operator may patch Deployments, not delete them; the garbage collector removes it
    with the service), so a return to ``minReplicas: 0`` applies it again."""
    return not fronted_by_gateway(isvc) and not service_selects_gateway(isvc, observed)


# Every replica of a single-model service preloads its models: its gateway never asks for
# another copy, however busy the hot ones are.
NO_EXTRA_COPIES = 1_000_000
# The burst buffer's bound on requests in flight to one replica, in multiples of what it
# executes at once (its batch slots x maxBatchSize): one full batch running and one forming
# behind it per slot, so no replica idles between batches and nothing more queues where only
# that replica could serve it (gateway/README.md, "The burst buffer").
BURST_SLOTS_PER_CONCURRENCY = 2.0
# How long the activator holds a request while the service wakes from zero, unless
# spec.autoscaling.holdTimeoutSeconds says otherwise: twice the time-to-routable `core.idle`
# assumes of a GPU replica until it has measured one (60 s); a request's own `timeout`
# parameter shortens it. (A fleet's gateway: spec.fleet.gateway.holdTimeoutSeconds.)
ACTIVATOR_HOLD_SECONDS = 120.0


# The activator's memory: what it holds is bounded by the gateway's maxHeldBytes (set here, so
# that the budget and the pod's memory come from one place) and its pod asks for memory sized
# from it. Measured by bench/activator_memory.py (gateway README, "Memory"): idle RSS ~60 MiB;
# with the hold full of 8 MiB bodies ~1.1 bytes of RSS per held byte (binary tensors), the
# peak ~1.2 (JSON bodies: the hold parses each JSON header it keeps, one at a time).
ACTIVATOR_HELD_BYTES = 256 * 2**20
ACTIVATOR_BASE_BYTES = 64 * 2**20  # the idle process (~60 MiB measured)
ACTIVATOR_HELD_FACTOR = 1.3  # RSS per held body byte, with room over the ~1.2 measured
# Over the request: bodies being read or forwarded (each up to maxRequestBytes, 64 MiB) while
# the hold is full. The activator stays in the data path once the service is up, so a burst of
# large bodies in flight shares this headroom; no CPU limit (throttling would add latency to
# every request through it), a CPU request so that it is scheduled where it can run.
ACTIVATOR_IN_FLIGHT_BYTES = 4 * 64 * 2**20
ACTIVATOR_CPU_REQUEST = "100m"


def activator_resources(held_bytes: int = ACTIVATOR_HELD_BYTES) -> dict[str, dict[str, str]]:
    """The activator container's requests and limits, sized from its hold's byte budget."""
    request = ACTIVATOR_BASE_BYTES + math.ceil(held_bytes * ACTIVATOR_HELD_FACTOR)
    limit = request + ACTIVATOR_IN_FLIGHT_BYTES
    mib = 2**20
    return {
        "requests": {"cpu": ACTIVATOR_CPU_REQUEST, "memory": f"{math.ceil(request / mib)}Mi"},
        "limits": {"memory": f"{math.ceil(limit / mib)}Mi"},
    }


def activator_hold_seconds(isvc: InferenceService) -> float:
    """How long the activator in front of a single-model service holds a request."""
    hold = isvc.spec.autoscaling.hold_timeout_seconds
    return ACTIVATOR_HOLD_SECONDS if hold is None else hold


def _gateway_spec(isvc: InferenceService) -> FleetGateway:
    fleet = isvc.spec.fleet
    return fleet.gateway if fleet is not None else FleetGateway()


def gateway_config(isvc: InferenceService) -> dict[str, Any]:
    """The gateway's configuration (``tidal.gateway.config.GatewayConfig``) as plain JSON."""
    names = sorted({m.name for pool in pools_of(isvc) for m in pool.models})
    gw = _gateway_spec(isvc)
    config: dict[str, Any] = {
        "models": names,
        "maxLoadsPerReplica": gw.max_loads_per_replica,
        "holdTimeoutSeconds": gw.hold_timeout_seconds,
        "busyOutstanding": gw.busy_outstanding if isvc.spec.fleet else NO_EXTRA_COPIES,
        "replicaGrpcPort": RUNTIME_GRPC_PORT,
    }
    if gw.max_loads_total is not None:  # unset: the gateway sizes it from the pool
        config["maxLoadsTotal"] = gw.max_loads_total
    if holds_requests(isvc):
        config["activator"] = True
        config["maxHeldBytes"] = ACTIVATOR_HELD_BYTES
        if isvc.spec.fleet is None:
            config["holdTimeoutSeconds"] = activator_hold_seconds(isvc)
            config["slotsPerConcurrency"] = BURST_SLOTS_PER_CONCURRENCY
    return config


def _gateway_container(isvc: InferenceService, gateway: FleetGateway) -> dict[str, Any]:
    """The gateway's container: its config in the environment, its resources (the
    activator's sized from what it may hold)."""
    config = json.dumps(gateway_config(isvc), sort_keys=True, separators=(",", ":"))
    container: dict[str, Any] = {
        "name": GATEWAY_CONTAINER,
        "image": runtime_image(isvc.spec.runtime),
        "command": ["tidal-gateway"],
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GATEWAY_GRPC_PORT, "protocol": "TCP"},
        ],
        "env": [
            {"name": "TIDAL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "TIDAL_PORT", "value": str(GATEWAY_PORT)},
            {"name": "TIDAL_GRPC_PORT", "value": str(GATEWAY_GRPC_PORT)},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TIDAL_LOG_LEVEL", "value": isvc.spec.runtime.log_level.value},
            {"name": GATEWAY_CONFIG_ENV, "value": config},
        ],
        # Ready once the operator has told it about at least one healthy runtime pod.
        **_health_probes(),
    }
    requests = dict(gateway.resources.requests)
    limits = dict(gateway.resources.limits)
    if requests or limits:
        container["resources"] = {
            k: v for k, v in (("requests", requests), ("limits", limits)) if v
        }
    elif holds_requests(isvc):  # the activator: memory sized from what it may hold
        container["resources"] = activator_resources()
    container["volumeMounts"] = [{"name": "tmp", "mountPath": TMP_MOUNT}]
    container["securityContext"] = CONTAINER_SECURITY
    return container


def _gateway_deployment(isvc: InferenceService) -> dict[str, Any]:
    gateway = _gateway_spec(isvc)
    selector = {LABEL_ISVC: isvc.name, LABEL_COMPONENT: COMPONENT_GATEWAY}
    labels = {**common_labels(isvc), **selector, "app.kubernetes.io/name": "tidal-gateway"}
    container = _gateway_container(isvc, gateway)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": POD_SECURITY,
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if isvc.spec.runtime.node_selector:
        pod_spec["nodeSelector"] = dict(isvc.spec.runtime.node_selector)
    if isvc.spec.runtime.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in isvc.spec.runtime.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(
            isvc,
            gateway_name(isvc.name),
            {**common_labels(isvc), LABEL_COMPONENT: COMPONENT_GATEWAY},
        ),
        "spec": {
            "replicas": gateway.replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(GATEWAY_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def _service(isvc: InferenceService, active: PoolName, observed: Observed) -> dict[str, Any]:
    selector = {LABEL_ISVC: isvc.name, LABEL_POOL: active.value, LABEL_ROLE: ROLE_SERVING}
    if observed.split and isvc.spec.rollout.baseline is not None:
        del selector[LABEL_POOL]
    # The same ports whichever side is selected (the gateway's are named like the runtime's),
    # so clients keep working across a switch.
    ports = [
        {"name": "http", "port": RUNTIME_PORT, "targetPort": "http", "protocol": "TCP"},
        {
            "name": "grpc",
            "port": RUNTIME_GRPC_PORT,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c",
        },
    ]
    if service_selects_gateway(isvc, observed):
        # The gateway routes to the runtime pods itself (the operator tells it which) and
        # holds requests while none is routable, over HTTP and gRPC alike.
        selector = {LABEL_ISVC: isvc.name, LABEL_COMPONENT: COMPONENT_GATEWAY}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(isvc, isvc.name, common_labels(isvc)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": ports,
        },
    }


def desired_objects(isvc: InferenceService, observed: Observed) -> list[dict[str, Any]]:
    """Every child the InferenceService should have, in apply order (config before pods).

    Each object carries ``serving.tidal.dev/applied-hash`` (a hash of the object itself), so
    the shell can tell from a watch event whether a child already matches without a request.
    """
    objects: list[dict[str, Any]] = []
    fleet = isvc.spec.fleet is not None
    for pool in pools_of(isvc):
        config = render_runtime_config(pool, fleet)
        config_json = _canonical_json(config)
        replicas = desired_replicas(isvc, pool.name, observed)
        objects.append(_config_map(isvc, pool, config_json))
        objects.append(_deployment(isvc, pool, replicas, content_hash(config)))
    if fronted_by_gateway(isvc):
        objects.append(_gateway_deployment(isvc))
    objects.append(_service(isvc, resolve_active_pool(isvc, observed), observed))
    for obj in objects:
        obj["metadata"]["annotations"] = {ANNOTATION_APPLIED_HASH: content_hash(obj)}
    return objects


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of a child: unique among one InferenceService's children."""
    return str(obj["kind"]), str(obj["metadata"]["name"])
