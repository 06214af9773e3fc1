"""The runtime's one typed configuration, and where it is read from.

Sources, first match wins: ``--config FILE`` (YAML or JSON), ``TIDAL_RUNTIME_CONFIG`` (a path),
``TIDAL_RUNTIME_CONFIG_JSON`` (inline JSON).  Fault-injection fields may also be overridden by
``TIDAL_FAULT_*`` variables (see :data:`FAULT_ENV`).  Field names are camelCase on the wire
(the operator renders this model into a ConfigMap as JSON); unknown fields are errors.
The process's flags (listen address, log level) are :class:`RuntimeSettings`, read by
:mod:`tidal.common.settings` like the gateway's.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ..common.body import DEFAULT_MAX_JSON_VALUES
from ..common.contract import (
    DEFAULT_ENGINE_CACHE_BUDGET_BYTES,
    ENV_RUNTIME_CONFIG,
    ENV_RUNTIME_CONFIG_JSON,
    RUNTIME_HTTP_PORT,
)
from ..common.settings import (
    CLI_ONLY,
    ConfigError,
    ProcessSettings,
    format_validation_error,
    read_config_data,
)
from .core.cache import POLICIES
from .core.engines import (
    PRECISIONS,
    EngineDescriptor,
    EngineNameError,
    describe_engine,
)
from .core.quantity import Fraction, parse_bytes, parse_bytes_or_fraction

ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]
Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"]
assert set(PRECISIONS) == set(Precision.__args__)  # type: ignore[attr-defined]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class EngineSpec(_Model):
    """One engine file of a model (see the naming scheme in runtime/README.md)."""

    uri: str = Field(description="file://, http(s)://, s3://bucket/key, or a plain local path")
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="expected hex digest; verified"
    )
    gpu_arch: str | None = Field(default=None, description="e.g. sm90; overrides the file name")
    precision: Precision | None = None
    trt_version: str | None = Field(default=None, description="e.g. '11.4'")
    format: Literal["onnx", "plan", "pt2"] | None = None
    version_compatible: bool | None = None

    def descriptor(self) -> EngineDescriptor:
        """What this engine is, from its file name and the explicit fields."""
        return describe_engine(
            self.uri,
            format=self.format,
            precision=self.precision,
            gpu_arch=self.gpu_arch,
            trt_version=self.trt_version,
            version_compatible=self.version_compatible,
        )

    @model_validator(mode="after")
    def _name_is_understood(self) -> EngineSpec:
        try:
            self.descriptor()
        except EngineNameError as exc:
            raise ValueError(str(exc)) from None
        return self


class BatchingSpec(_Model):
    enabled: bool = True
    max_queue_delay_ms: float = Field(default=0.0, ge=0, le=60_000)
    preferred_batch_sizes: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list)
    max_queue_size: int = Field(default=1024, gt=0, description="queued requests, not rows")
    timeout_ms: float | None = Field(
        default=None, gt=0, description="per-request deadline from arrival; None: no deadline"
    )


class WarmupSpec(_Model):
    batch_sizes: list[Annotated[int, Field(gt=0)]] = Field(default_factory=lambda: [1])
    iterations: int = Field(default=1, ge=0)


class ModelSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    version: str = Field(
        default="1",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
        description="the version every answer reports (model_version; the operator sets a "
        "ModelBuild's version); the one version the OIP paths accept",
    )
    engines: list[EngineSpec] = Field(min_length=1)
    max_batch_size: int = Field(default=8, gt=0, le=65536)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    preload: bool = Field(default=True, description="load and warm up at start (readiness)")
    precisions: list[Precision] = Field(
        default_factory=list, description="preference order; empty: the engines' order"
    )

    @model_validator(mode="after")
    def _sizes_fit_batch(self) -> ModelSpec:
        for size in self.batching.preferred_batch_sizes:
            if size > self.max_batch_size:
                raise ValueError(
                    f"batching.preferredBatchSizes: {size} exceeds maxBatchSize "
                    f"{self.max_batch_size}"
                )
        for size in self.warmup.batch_sizes:
            if size > self.max_batch_size:
                raise ValueError(
                    f"warmup.batchSizes: {size} exceeds maxBatchSize {self.max_batch_size}"
                )
        return self


class MemorySpec(_Model):
    engine_cache_budget_bytes: ByteSize = Field(
        default=DEFAULT_ENGINE_CACHE_BUDGET_BYTES,
        description="device bytes the hot set of engines may use",
    )
    weight_streaming_budget: str | int | None = Field(
        default=None, description="TensorRT only: bytes, 'N%' of streamable weights, or 'auto'"
    )
    reserve_bytes: ByteSize = Field(default=0, description="device bytes never given to engines")
    eviction_policy: str = Field(default="lru", description=f"one of {sorted(POLICIES)}")

    @field_validator("weight_streaming_budget")
    @classmethod
    def _budget_form(cls, value: str | int | None) -> str | int | None:
        if value is None or value == "auto":
            return value
        parse_bytes_or_fraction(value)
        return value

    @field_validator("eviction_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown eviction policy {value!r}; known: {sorted(POLICIES)}")
        return value

    def streaming_request(self) -> int | Fraction | str | None:
        value = self.weight_streaming_budget
        if value is None or value == "auto":
            return value
        return parse_bytes_or_fraction(value)


class FaultSpec(_Model):
    """Test and demo aids: make this replica slow, failing, slow to warm or capacity-limited.

    Off by default (one batch per model at a time, no emulated service time)."""

    added_latency_ms: float = Field(default=0.0, ge=0, description="added to every infer")
    error_rate: float = Field(default=0.0, ge=0, le=1, description="fraction answered 500")
    extra_warmup_seconds: float = Field(default=0.0, ge=0, description="added to each warm-up")
    extra_transfer_seconds: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="added to each engine load's host->device transfer (phase h2d)",
    )
    seed: int | None = Field(default=None, description="seed of the error draw")
    # An emulated device: a batch occupies one of `maxConcurrentBatches` execution slots for at
    # least serviceTimeMs + serviceTimePerRowMs x rows (the engine runs, then the slot waits out
    # the rest). Unlike addedLatencyMs, which sleeps beside the request without bound, this gives
    # a replica a real capacity limit: requests beyond it queue, so P99 and queues respond to
    # load as on a GPU. maxConcurrentBatches also applies without a service time.
    service_time_ms: float = Field(
        default=0.0, ge=0, le=600_000, description="least time a batch holds its slot"
    )
    service_time_per_row_ms: float = Field(
        default=0.0, ge=0, le=600_000, description="added to serviceTimeMs per row of the batch"
    )
    max_concurrent_batches: int = Field(
        default=1, ge=1, le=64, description="batches of one model executing at once"
    )

    @property
    def paced(self) -> bool:
        """True when batches are held to an emulated service time."""
        return self.service_time_ms > 0 or self.service_time_per_row_ms > 0

    def batch_floor_seconds(self, rows: int) -> float:
        """The least time a batch of `rows` rows holds its execution slot."""
        return (self.service_time_ms + self.service_time_per_row_ms * rows) / 1000.0


class OnnxRuntimeSpec(_Model):
    intra_op_threads: int = Field(default=0, ge=0, description="0: ONNX Runtime's default")
    providers: list[str] | None = Field(
        default=None, description="None: CUDA when available, else CPU"
    )


class TensorRTSpec(_Model):
    device: int = Field(default=0, ge=0)
    allow_host_code: bool = Field(
        default=False, description="allow plans with an embedded lean runtime (trusted only)"
    )


class S3Spec(_Model):
    """Where ``s3://bucket/key`` engines are read from (the operator renders it from
    ``spec.runtime.storage.s3``). Credentials never travel here: the standard AWS variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, set by the operator
    from the Secret the spec names) or the pod's ambient workload identity
    (``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, or the instance metadata service)."""

    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^/\s]+/?$",
        description="e.g. http://minio.storage:9000; None: AWS's endpoint for the region",
    )
    region: str = Field(default="us-east-1", min_length=1)
    path_style: bool = Field(
        default=True, description="bucket in the path (most S3-compatible servers) or the host"
    )
    part_bytes: ByteSize = Field(
        default=16 * 2**20, ge=2**20, description="ranged reads of this size for large objects"
    )
    concurrency: int = Field(default=8, ge=1, le=64, description="ranged reads at once")
    max_retries: int = Field(default=5, ge=0, le=20)


class RuntimeConfig(_Model):
    """Configuration of one runtime process (one inference pod)."""

    # torch: PyTorch AOTInductor packages (.pt2) on CUDA, the executing GPU backend where no
    # TensorRT builder exists (the `torch` extra; its device comes from `tensorrt.device`).
    backend: Literal["onnxruntime", "tensorrt", "torch"] = "onnxruntime"
    models: list[ModelSpec] = Field(default_factory=list)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    max_concurrent_loads: int = Field(default=2, gt=0)
    # On SIGTERM: report not-ready but keep serving this long, so the endpoint leaves the
    # Service's EndpointSlice (and clients' balancers) before the listener closes.
    shutdown_drain_seconds: float = Field(default=5.0, ge=0, le=300)
    faults: FaultSpec = Field(default_factory=FaultSpec)
    max_request_bytes: ByteSize = Field(default=64 * 2**20, gt=0)
    request_read_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="longest wait for a request body (then 408)"
    )
    max_json_values: int = Field(
        default=DEFAULT_MAX_JSON_VALUES,
        gt=0,
        description="values in an infer request's JSON header (every number, string, list, "
        "object counts one); more: 413 before it is parsed",
    )
    header_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="longest wait for a request's header block (then 408 and the connection "
        "is closed): a client that never finishes its headers cannot hold a connection",
    )
    # How a NaN or an infinity of an output is written in a JSON response: "tokens" (bare NaN,
    # Infinity, -Infinity, as Triton writes them; not strict JSON) or "strings" (the strings
    # "NaN", "Infinity", "-Infinity": strict JSON). Binary outputs carry any value either way.
    non_finite_json: Literal["tokens", "strings"] = "tokens"
    cache_dir: str | None = Field(
        default=None, description="where downloaded engines are kept; None: a temp dir"
    )
    s3: S3Spec = Field(default_factory=S3Spec)
    onnxruntime: OnnxRuntimeSpec = Field(default_factory=OnnxRuntimeSpec)
    tensorrt: TensorRTSpec = Field(default_factory=TensorRTSpec)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        seen: set[str] = set()
        for model in models:
            if model.name in seen:
                raise ValueError(f"model name {model.name!r} appears twice")
            seen.add(model.name)
        return models

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)


FAULT_ENV: dict[str, str] = {
    "TIDAL_FAULT_ADDED_LATENCY_MS": "addedLatencyMs",
    "TIDAL_FAULT_ERROR_RATE": "errorRate",
    "TIDAL_FAULT_EXTRA_WARMUP_SECONDS": "extraWarmupSeconds",
    "TIDAL_FAULT_EXTRA_TRANSFER_SECONDS": "extraTransferSeconds",
    "TIDAL_FAULT_SEED": "seed",
    "TIDAL_FAULT_SERVICE_TIME_MS": "serviceTimeMs",
    "TIDAL_FAULT_SERVICE_TIME_PER_ROW_MS": "serviceTimePerRowMs",
    "TIDAL_FAULT_MAX_CONCURRENT_BATCHES": "maxConcurrentBatches",
}


def parse_config(data: Any) -> RuntimeConfig:
    try:
        return RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "runtime configuration")) from None


def load_config(path: str | None = None, env: dict[str, str] | None = None) -> RuntimeConfig:
    """Read the configuration from ``path`` or the environment (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    data = read_config_data(
        path,
        env,
        json_variable=ENV_RUNTIME_CONFIG_JSON,
        path_variable=ENV_RUNTIME_CONFIG,
        what="runtime configuration",
    )
    faults = dict(data.get("faults") or {})
    for variable, field in FAULT_ENV.items():
        if env.get(variable):
            faults[field] = env[variable]
    if faults:
        data = {**data, "faults": faults}
    return parse_config(data)


class RuntimeSettings(ProcessSettings):
    """tidal inference runtime (Open Inference Protocol v2). Unset, the gRPC port is 8081
    where it is free."""

    config: str | None = Field(
        default=None,
        description=f"YAML or JSON file (else {ENV_RUNTIME_CONFIG}[_JSON])",
        json_schema_extra=CLI_ONLY,
    )
    port: int = Field(default=RUNTIME_HTTP_PORT, ge=0, le=65535, description="HTTP port")
