"""``spec.models`` and ``spec.memory``: the models a pool serves, their engines (one per
backend, GPU arch and precision) or the ModelBuild they come from, batching and warm-up, and the
device memory budgets of each pod."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from ....common.contract import BYTES_MESSAGE, BYTES_PATTERN, is_whole_bytes, quantity_bytes
from .base import ApiModel, _matches, _rules, cel
from .formats import (
    DNS_SUBDOMAIN_PATTERN,
    ENGINE_URI_PATTERN,
    GPU_ARCH_PATTERN,
    MODEL_NAME_PATTERN,
    SHA256_PATTERN,
    URI_SCHEMES,
    WEIGHT_STREAMING_PATTERN,
    ByteQuantity,
    WeightStreamingBudget,
    _whole_bytes_cel,
    percent_value,
)
from .pod import Backend

# Most models in one service (spec.models and spec.rollout.baseline.models).
MAX_MODELS = 512
FILE_URI_MESSAGE = (
    "engines[].uri: a file:// URI needs an absolute path, i.e. three slashes "
    "(file:///models/m.onnx); in file://models/m.onnx, models is a host name"
)


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
        description="Where the engine lives: file:///absolute/path, http(s)://host/path or "
        "s3://bucket/key (the store spec.runtime.storage.s3 names; unset: AWS S3 with the pods' "
        "ambient credentials); gs:// is reserved (the runtime cannot fetch it yet: the service "
        "reports Degraded). Unique within a model.",
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


MODEL_MEMORY_MESSAGE = (
    "models[].memory must be above 0: it declares the loaded engine's device memory (placement "
    "would count the model as free and pile it anywhere); remove it to have it measured"
)


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
            cel(
                "!has(self.memory) || "
                f"!{_matches('self.memory', BYTES_PATTERN)} || "
                "quantity(self.memory).isGreaterThan(quantity('0'))",
                MODEL_MEMORY_MESSAGE,
                ".memory",
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
    version: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The version every answer reports (model_version in the inference "
        "response) and the one /v2/models/<name>/versions/<v> accepts. Default: the ModelBuild's "
        "version with build, else 1.",
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
        if self.memory is not None and quantity_bytes(self.memory) == 0:
            raise ValueError(MODEL_MEMORY_MESSAGE)
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
        "percentage of the streamable weights (60%) or auto; unset: weights stay resident. "
        "Only the tensorrt backend streams from this field; the torch backend's layer "
        "streaming is not yet reachable from it.",
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
