"""The TensorRT builder: from an ONNX model, one serialized plan per precision for the GPU the
build runs on, named as the runtime selects plans (``sm90-trt10.13-fp16.engine``), each gated
against the FP32 source.

Written against the TensorRT 10 Python API as NVIDIA documents it, and **never run here**: the
builder library (``libnvinfer`` with ``trt.Builder``) is not installable on this project's
machines, only the lean runtime (FACTS.md). It runs in NVIDIA's image (``nvcr.io/nvidia/
tensorrt``, the base of ``tidal-runtime``), which is the image the operator gives TensorRT
build Jobs. What was tested without TensorRT is listed in runtime/BUILD.md.

Written on TensorRT's current API, the one that TensorRT 10.x and 11.x share: **strongly typed
networks** (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``; TensorRT 11 has no other kind),
whose precision is the ONNX model's own, and **explicit quantization** (Q/DQ nodes in the ONNX
model). No precision builder flag (``BuilderFlag.FP16/BF16/INT8``: deprecated since 10.12,
removed in 11) and no implicit calibration (``IInt8EntropyCalibrator2``, ``int8_calibrator``,
``set_calibration_profile``: deprecated since 10.1, removed in 11) is used.

One build, in order:

1. the reference: the source run by ONNX Runtime on CPU with every graph optimization off
   (:class:`.onnxrt.OnnxRuntimeMaker`, which also checks the profiles against the model), and
   the source parsed once to check the profiles against TensorRT's view of its inputs;
2. per precision, the ONNX model the network is parsed from (:data:`.plan.TENSORRT_NETWORKS`):
   ``fp32`` the source; ``fp16``/``bf16`` the source cast (:func:`.lowprec.cast_model`);
   ``int8`` the Q/DQ model made by ONNX Runtime's ``quantize_static`` (QDQ format, symmetric
   INT8 activations and weights, bias left in FP32: :func:`tensorrt_quantization`) calibrated
   on the calibration set, and **gated under ONNX Runtime first**: a Q/DQ model that fails the
   gate is refused before TensorRT runs (recorded in the manifest like any refusal, naming the
   Q/DQ file judged); it is written beside the plan in the work directory (``*.qdq.onnx``),
   not published;
3. ``trt.Builder`` -> ``create_network(1 << STRONGLY_TYPED)`` (:func:`network_flags`) ->
   ``trt.OnnxParser`` ``parse_from_file``; a parser error names the ONNX node;
   ``create_builder_config``, the workspace pool (``set_memory_pool_limit``), one optimization
   profile from the spec's min/opt/max (:func:`input_shapes`), ``clear_flag(TF32)`` for fp32,
   ``build_serialized_network`` writes the plan;
4. evaluation as served: the plan is selected for this GPU and TensorRT as the runtime selects
   (``select_engine``), loaded by the runtime's own TensorRT backend
   (:class:`tidal.runtime.backends.tensorrt.TensorRTBackend`: header check, deserialization,
   user-managed device memory, pinned staging) and run through ``infer`` (the batcher's call)
   at the profile's min, opt and max and over the validation set: the plan's own gate.

Plans are not built ``VERSION_COMPATIBLE``: they load on the TensorRT that built them (the
runtime image's), not on the lean runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from .datasets import Array, batches, load_set
from .gate import Reference, RefusedBeforeBuild, judge, measure
from .onnxrt import OnnxRuntimeMaker, quantize_int8
from .plan import GPU_LIBRARY, TENSORRT_NETWORKS, ServedModel
from .spec import ARCH_TARGET, BuildSpec, ModelError, QuantizationSpec, ShapeProfile

# Scratch memory TensorRT's tactics may use while building (the WORKSPACE pool).
WORKSPACE_BYTES = 4 << 30
BUILDER_IMAGE = "nvcr.io/nvidia/tensorrt (the base of the tidal-runtime image)"
MISSING_MESSAGE = (
    "backend: the TensorRT builder needs NVIDIA's image: {image} carries the Python module "
    "'tensorrt' with its builder (trt.Builder, libnvinfer); {why}"
)


def import_builder() -> Any:
    """The full ``tensorrt`` module (the lean runtime cannot build), or a :class:`ModelError`
    saying where the builder is."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise ModelError(
            MISSING_MESSAGE.format(image=BUILDER_IMAGE, why=f"it is not importable here ({exc})")
        ) from None
    if not hasattr(trt, "Builder"):
        raise ModelError(
            MISSING_MESSAGE.format(
                image=BUILDER_IMAGE,
                why=f"the 'tensorrt' here ({getattr(trt, '__version__', '?')}) has no Builder",
            )
        )
    return trt


# -- the pure parts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkInput:
    """An input of the parsed network: its name and dimensions (-1: dynamic)."""

    name: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class InputShapes:
    """What ``IOptimizationProfile.set_shape`` is given for one input."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def input_shapes(
    inputs: Sequence[NetworkInput], profiles: Sequence[ShapeProfile]
) -> tuple[InputShapes, ...]:
    """The optimization profile: every input's min/opt/max, from its profile or, for an input
    with no dynamic dimension, its fixed shape. Errors name the profile field."""
    names = [i.name for i in inputs]
    for index, profile in enumerate(profiles):
        if profile.input not in names:
            raise ModelError(
                f"profiles[{index}].input: the network has no input {profile.input!r} "
                f"(its inputs: {names})"
            )
    by_name = {p.input: (i, p) for i, p in enumerate(profiles)}
    out = []
    for given in inputs:
        found = by_name.get(given.name)
        if found is None:
            if any(d < 0 for d in given.dims):
                raise ModelError(
                    f"profiles: input {given.name!r} has dynamic dimensions {list(given.dims)}: "
                    "TensorRT needs its min, opt and max shapes"
                )
            out.append(InputShapes(given.name, given.dims, given.dims, given.dims))
            continue
        index, profile = found
        field = f"profiles[{index}]"
        if len(profile.opt) != len(given.dims):
            raise ModelError(
                f"{field}: input {given.name!r} has rank {len(given.dims)}, the profile "
                f"{len(profile.opt)}"
            )
        for axis, dim in enumerate(given.dims):
            used = {profile.min[axis], profile.opt[axis], profile.max[axis]}
            if dim >= 0 and used != {dim}:
                raise ModelError(
                    f"{field}: axis {axis} of input {given.name!r} is fixed at {dim}, the "
                    f"profile asks for {sorted(used)}"
                )
        out.append(
            InputShapes(given.name, tuple(profile.min), tuple(profile.opt), tuple(profile.max))
        )
    return tuple(out)


def network_flags(trt: Any) -> int:
    """``create_network``'s flags: strongly typed. TensorRT 10 has the flag (weakly typed is
    its default); a TensorRT whose enum lacks it builds strongly typed networks only."""
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if strongly is None else 1 << int(strongly)


def cleared_flags(trt: Any, precision: str) -> list[Any]:
    """The ``BuilderFlag`` members a precision clears (TF32 for fp32), those this TensorRT has;
    no precision sets any."""
    names = TENSORRT_NETWORKS[precision]["cleared"]
    return [getattr(trt.BuilderFlag, f) for f in names if hasattr(trt.BuilderFlag, f)]


# quantize_static's options for a Q/DQ model TensorRT takes: INT8 Q/DQ with a zero point of 0
# (symmetric activations and weights), the bias left to TensorRT in FP32.
TENSORRT_QDQ_OPTIONS: dict[str, Any] = {
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    "QuantizeBias": False,
}


def tensorrt_quantization(settings: QuantizationSpec) -> tuple[QuantizationSpec, dict[str, Any]]:
    """The spec's ``quantization`` as TensorRT takes it (QDQ format, signed INT8), with
    quantize_static's extra options; a setting TensorRT cannot take is an error naming it."""
    wrong = {
        "quantization.format": (settings.format, "qdq"),
        "quantization.activationType": (settings.activation_type, "int8"),
        "quantization.weightType": (settings.weight_type, "int8"),
    }
    for field, (given, needed) in wrong.items():
        if given != needed:
            raise ModelError(
                f"{field}: TensorRT takes explicitly quantized (Q/DQ) models with signed, "
                f"symmetric INT8: set it to {needed!r}, not {given!r}"
            )
    return settings, dict(TENSORRT_QDQ_OPTIONS)


def tensorrt_libraries(tensorrt: str, gpu_arch: str, cuda: str) -> dict[str, str]:
    """What a plan's bytes depend on, for the build key and the file name: TensorRT, the GPU
    architecture it ran on, the CUDA runtime, ONNX Runtime (the reference), numpy, tidal."""
    versions = {"tensorrt": tensorrt, GPU_LIBRARY: gpu_arch, "cuda": cuda, "numpy": np.__version__}
    for name in ("onnxruntime", "tidal"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def network_inputs(network: Any) -> list[NetworkInput]:
    """The parsed network's inputs (-1: a dynamic dimension)."""
    return [
        NetworkInput(t.name, tuple(int(d) for d in t.shape))
        for t in (network.get_input(i) for i in range(network.num_inputs))
    ]


def parser_errors(parser: Any) -> str:
    """The ONNX parser's errors, each naming its node."""
    lines = []
    for index in range(parser.num_errors):
        error = parser.get_error(index)
        name = error.node_name() if hasattr(error, "node_name") else ""
        operator = error.node_operator() if hasattr(error, "node_operator") else ""
        lines.append(f"node {name or '?'!r} ({operator or '?'}, #{error.node()}): {error.desc()}")
    return "; ".join(lines) or "the parser gave no error"


# -- the ONNX model of each precision (runs without TensorRT) -----------------------------------


def network_model(
    spec: BuildSpec,
    source: OnnxRuntimeMaker,
    reference: Reference,
    onnx_path: Path,
    precision: str,
    engine: Path,
    calibration_file: Path | None,
) -> tuple[Path, int | None]:
    """The ONNX model the precision's strongly typed network is parsed from (written beside
    ``engine``), and the calibration samples used (None: not calibrated). ``source``: the
    reference maker, after its ``reference()``."""
    if precision == "fp32":
        return onnx_path, None
    if precision in ("fp16", "bf16"):
        import onnx

        from .lowprec import cast_model

        path = engine.with_name(f"{engine.stem}.{precision}.onnx")
        onnx.save(cast_model(onnx.load(str(onnx_path)), precision), str(path))
        return path, None
    return qdq_model(spec, source, reference, onnx_path, engine, calibration_file)


def qdq_model(
    spec: BuildSpec,
    source: OnnxRuntimeMaker,
    reference: Reference,
    onnx_path: Path,
    engine: Path,
    calibration_file: Path | None,
) -> tuple[Path, int]:
    """The Q/DQ INT8 model calibrated on the calibration set and gated under ONNX Runtime
    (the runtime's CPU backend) against the reference: refused here
    (:class:`.gate.RefusedBeforeBuild`), no plan is built and the build records the refusal."""
    calibration = spec.calibration
    assert calibration is not None and calibration_file is not None  # the spec's rule
    settings, options = tensorrt_quantization(spec.quantization)
    data = load_set(calibration_file, source.inputs, "calibration")
    path = engine.with_name(f"{engine.stem}.qdq.onnx")
    used = quantize_int8(
        onnx_path,
        path,
        data,
        source.inputs,
        settings,
        calibration.batch_size,
        calibration.max_samples,
        options,
    )
    metrics = measure(reference.expected, source.evaluate(path, "int8"), reference.labels)
    verdict = judge(metrics, spec.gate)
    if not verdict.passed:
        raise RefusedBeforeBuild(path, metrics, verdict, used)
    return path, used


# -- the maker -----------------------------------------------------------------------------------


class TensorRTMaker:
    """The TensorRT builder as :func:`tidal.runtime.builder.build.build` drives it."""

    def __init__(self, spec: BuildSpec) -> None:
        self.spec = spec
        self.trt = import_builder()
        self._source = OnnxRuntimeMaker(spec)  # the reference, and the profiles' check
        self._logger: Any = None
        self._messages: list[str] = []
        self._builder: Any = None
        self._parser: Any = None
        self._onnx: Path | None = None
        self._reference: Reference | None = None
        self._inputs: list[NetworkInput] = []
        self._shapes: tuple[InputShapes, ...] = ()
        self._backend: Any = None

    def libraries(self) -> dict[str, str]:
        from ..backends import cudamem as cm

        cm.set_device(0)
        arch = cm.device_arch(0)
        target = self.spec.target
        if ARCH_TARGET.match(target) and target != arch:
            raise ModelError(
                f"target: {target} asked, this machine's GPU is {arch}: a TensorRT plan runs on "
                "the GPU architecture that built it"
            )
        runtime = int(cm.check(cm.cudart().cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))
        cuda = f"{runtime // 1000}.{runtime % 1000 // 10}"  # 13000 -> 13.0
        return tensorrt_libraries(str(self.trt.__version__), arch, cuda)

    def reference(self, source: Path, validation_file: Path) -> Reference:
        from ..backends.tensorrt import _make_logger

        reference = self._source.reference(source, validation_file)
        self._reference = reference
        self._logger, self._messages = _make_logger(self.trt)
        self._builder = self.trt.Builder(self._logger)
        self._onnx = source
        network = self._parse(source)  # the profiles checked against TensorRT's view, once
        self._inputs = network_inputs(network)
        self._shapes = input_shapes(self._inputs, self.spec.profiles)
        return reference

    def _parse(self, path: Path) -> Any:
        """A strongly typed network parsed from ``path``."""
        network = self._builder.create_network(network_flags(self.trt))
        parser = self.trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(path)):
            raise ModelError(
                f"source: TensorRT's ONNX parser refused {path.name}: {parser_errors(parser)}"
            )
        self._parser = parser  # the network refers to the parser's weights: keep it alive
        return network

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None:
        """Write the plan; returns the calibration samples used (None: not calibrated)."""
        trt, builder = self.trt, self._builder
        assert builder is not None, "reference() first"
        assert self._onnx is not None and self._reference is not None
        model, used = network_model(
            self.spec,
            self._source,
            self._reference,
            self._onnx,
            precision,
            engine,
            calibration_file,
        )
        network = self._parse(model)
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        config.add_optimization_profile(self._profile(self._shapes))
        for flag in cleared_flags(trt, precision):
            config.clear_flag(flag)
        self._messages.clear()
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            detail = "; ".join(self._messages[-5:]) or "no message from TensorRT"
            raise ModelError(f"precisions: {precision}: TensorRT could not build a plan: {detail}")
        with engine.open("wb") as out:
            out.write(plan)
        return used

    def _profile(self, shapes: Sequence[InputShapes]) -> Any:
        profile = self._builder.create_optimization_profile()
        for s in shapes:
            profile.set_shape(s.name, s.min, s.opt, s.max)
        return profile

    # -- measuring a plan as the runtime serves it -----------------------------------------------

    def _runtime_backend(self) -> Any:
        if self._backend is None:
            from ..backends.tensorrt import TensorRTBackend
            from ..config import MemorySpec, TensorRTSpec

            self._backend = TensorRTBackend(TensorRTSpec(device=0), MemorySpec())
        return self._backend

    def _max_rows(self) -> int:
        return self._shapes[0].max[0] if self._shapes and self._shapes[0].max else 1

    def evaluate(self, engine: Path, precision: str) -> Array:
        from ..backends import cudamem as cm
        from ..core.engines import describe_engine, select_engine

        backend = self._runtime_backend()
        model = ServedModel(self.spec.model, self._max_rows(), (precision,))
        descriptor = describe_engine(str(engine))
        chosen = select_engine([descriptor], backend.target(model))
        if chosen.chosen is None:
            raise ModelError(f"the runtime would not select {engine.name}: {chosen.reason}")
        free, _ = cm.mem_get_info()
        try:
            loaded = backend.load(engine, descriptor, model, free)
        except Exception as exc:  # EngineLoadError, or TensorRT's own
            raise ModelError(
                f"precisions: {precision}: the runtime's TensorRT backend cannot load "
                f"{engine.name}: {type(exc).__name__}: {str(exc)[:800]}"
            ) from None
        dtypes = {t.name: t.dtype for t in self._source.inputs}
        try:
            for point in ("min", "opt", "max"):
                feed = {
                    s.name: np.zeros(getattr(s, point), dtype=dtypes[s.name]) for s in self._shapes
                }
                try:
                    loaded.infer(feed)
                except Exception as exc:
                    raise ModelError(
                        f"profiles: {point}: the plan does not run {point} shapes: {exc}"
                    ) from None
            size = min(self.spec.validation.batch_size, self._max_rows())
            chunks = batches(self._source.validation, self._source.inputs, size)
            parts = [loaded.infer(chunk)[self._source.output] for chunk in chunks]
        finally:
            loaded.close()
        return np.concatenate(parts, axis=0).astype(np.float32)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.allocator.close()
            self._backend = None
