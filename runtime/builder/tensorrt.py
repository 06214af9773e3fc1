"""The TensorRT builder: from an ONNX model, one serialized plan per precision for the GPU the
build runs on, named as the runtime selects plans (``sm90-trt10.13-fp16.engine``), each gated
against the FP32 source.

Written against the TensorRT 10 Python API as NVIDIA documents it, and **never run here**: the
builder library (``libnvinfer`` with ``trt.Builder``) is not installable on this project's
machines, only the lean runtime (FACTS.md). It runs in NVIDIA's image (``nvcr.io/nvidia/
tensorrt``, the base of ``tidal-runtime``), which is the image the operator gives TensorRT
build Jobs. What was tested without TensorRT is listed in runtime/BUILD.md.

One build, in order:

1. the reference: the source run by ONNX Runtime on CPU with every graph optimization off
   (:class:`.onnxrt.OnnxRuntimeMaker`, which also checks the profiles against the model);
2. the network: ``trt.Builder`` -> ``create_network`` (explicit batch) -> ``trt.OnnxParser``
   ``parse_from_file``; a parser error names the ONNX node (name, operator, index);
3. per precision: ``create_builder_config``, the workspace pool (``set_memory_pool_limit``),
   one optimization profile from the spec's min/opt/max (:func:`input_shapes`), the precision's
   flags (``BuilderFlag.FP16``/``BF16``/``INT8``; TF32 cleared for fp32,
   :data:`.plan.TENSORRT_FLAGS`), for ``int8`` an ``IInt8EntropyCalibrator2`` fed whole batches
   of the calibration set (:func:`calibration_feeds`) through a calibration profile, with a
   calibration cache keyed by the set's digest; ``build_serialized_network`` writes the plan;
4. evaluation as served: the plan is selected for this GPU and TensorRT as the runtime selects
   (``select_engine``), loaded by the runtime's own TensorRT backend
   (:class:`tidal.runtime.backends.tensorrt.TensorRTBackend`: header check, deserialization,
   user-managed device memory, pinned staging) and run through ``infer`` (the batcher's call)
   at the profile's min, opt and max and over the validation set.

TensorRT 11 removed the precision flags (strongly typed networks only): there the builder makes
fp32 and names the missing flag for the others.  Plans are not built ``VERSION_COMPATIBLE``:
they load on the TensorRT that built them (the runtime image's), not on the lean runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..storage import sha256_file
from .datasets import Array, InputLike, batches, load_set, samples_of
from .gate import Reference
from .plan import GPU_LIBRARY, TENSORRT_FLAGS, ServedModel
from .spec import ARCH_TARGET, BuildSpec, ModelError, ShapeProfile

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


def calibration_shapes(
    inputs: Sequence[NetworkInput], shapes: Sequence[InputShapes], batch_size: int
) -> tuple[InputShapes, ...]:
    """The calibration profile: each input at ``batch_size`` rows and its opt shape beyond
    (TensorRT calibrates a dynamic network at the calibration profile's shapes)."""
    dims = {i.name: i.dims for i in inputs}
    out = []
    for s in shapes:
        fixed = dims[s.name][0] if dims[s.name] else -1
        if fixed >= 0 and fixed != batch_size:
            raise ModelError(
                f"calibration.batchSize: input {s.name!r} has a fixed batch of {fixed}, "
                f"the calibration batch is {batch_size}: set batchSize to {fixed}"
            )
        shape = (batch_size, *s.opt[1:])
        out.append(InputShapes(s.name, shape, shape, shape))
    return tuple(out)


def calibration_feeds(
    data: Mapping[str, Array],
    inputs: Sequence[InputLike],
    batch_size: int,
    max_samples: int | None,
) -> list[dict[str, Array]]:
    """Whole batches of the calibration set, in order, at most ``max_samples`` samples (a last
    partial batch is left out: every batch has the calibration profile's shape)."""
    feeds = [
        feed
        for feed in batches(data, inputs, batch_size, max_samples)
        if samples_of(feed, inputs) == batch_size
    ]
    if not feeds:
        held = samples_of(data, inputs)
        raise ModelError(
            f"calibration: {min(held, max_samples or held)} samples, fewer than one batch of "
            f"batchSize {batch_size}"
        )
    return feeds


def calibration_cache_name(sha256: str, batch_size: int, max_samples: int | None) -> str:
    """A calibration cache is valid for one calibration set, batch and sample count only."""
    return f"calibration-{sha256[:16]}-b{batch_size}-n{max_samples or 'all'}.cache"


def builder_flags(trt: Any, precision: str) -> tuple[list[Any], list[Any]]:
    """The ``BuilderFlag`` members a precision sets and clears; a :class:`ModelError` naming
    the flag when this TensorRT has none (TensorRT 11 builds strongly typed networks only)."""
    enabled, cleared = TENSORRT_FLAGS[precision]
    missing = [f for f in enabled if not hasattr(trt.BuilderFlag, f)]
    if missing:
        raise ModelError(
            f"precisions: {precision}: TensorRT {trt.__version__} has no BuilderFlag."
            f"{missing[0]} (TensorRT 11 removed the precision flags: only fp32 is built there)"
        )
    return (
        [getattr(trt.BuilderFlag, f) for f in enabled],
        [getattr(trt.BuilderFlag, f) for f in cleared if hasattr(trt.BuilderFlag, f)],
    )


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


def parser_errors(parser: Any) -> str:
    """The ONNX parser's errors, each naming its node."""
    lines = []
    for index in range(parser.num_errors):
        error = parser.get_error(index)
        name = error.node_name() if hasattr(error, "node_name") else ""
        operator = error.node_operator() if hasattr(error, "node_operator") else ""
        lines.append(f"node {name or '?'!r} ({operator or '?'}, #{error.node()}): {error.desc()}")
    return "; ".join(lines) or "the parser gave no error"


# -- the calibrator -----------------------------------------------------------------------------


def make_calibrator(
    trt: Any, feeds: Sequence[Mapping[str, Array]], cache: Path, device: Any
) -> Any:
    """An ``IInt8EntropyCalibrator2`` that hands TensorRT ``feeds`` one batch at a time, copied
    into device buffers, and keeps the calibration table in ``cache``."""
    from ..backends import cudamem as cm

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._feeds = iter(feeds)
            self._stream = cm.Stream()
            first = feeds[0]
            self._buffers = {n: device.alloc_device(a.nbytes) for n, a in first.items()}

        def get_batch_size(self) -> int:
            return 1  # explicit-batch networks take the batch from the shapes

        def get_batch(self, names: list[str]) -> list[int] | None:
            feed = next(self._feeds, None)
            if feed is None:
                return None
            for name in names:
                array = np.ascontiguousarray(feed[name])
                buffer = self._buffers[name]
                cm.copy_host_to_device(buffer.ptr, array.ctypes.data, array.nbytes, self._stream)
            self._stream.synchronize()
            return [self._buffers[n].ptr for n in names]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, table: Any) -> None:
            cache.write_bytes(bytes(table))

        def release(self) -> None:
            for buffer in self._buffers.values():
                device.free_device(buffer)
            self._stream.destroy()

    return EntropyCalibrator()


# -- the maker -----------------------------------------------------------------------------------


class TensorRTMaker:
    """The TensorRT builder as :func:`tidal.runtime.builder.build.build` drives it."""

    def __init__(self, spec: BuildSpec) -> None:
        from .onnxrt import OnnxRuntimeMaker

        self.spec = spec
        self.trt = import_builder()
        self._source = OnnxRuntimeMaker(spec)  # the reference, and the profiles' check
        self._logger: Any = None
        self._messages: list[str] = []
        self._builder: Any = None
        self._network: Any = None
        self._parser: Any = None
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
        reference = self._source.reference(source, validation_file)
        self._parse(source)
        return reference

    def _parse(self, source: Path) -> None:
        from ..backends.tensorrt import _make_logger

        trt = self.trt
        self._logger, self._messages = _make_logger(trt)
        self._builder = trt.Builder(self._logger)
        explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
        # Explicit batch is the only mode from TensorRT 10 on (the flag is kept, ignored).
        flags = 0 if explicit is None else 1 << int(explicit)
        self._network = self._builder.create_network(flags)
        self._parser = trt.OnnxParser(self._network, self._logger)
        if not self._parser.parse_from_file(str(source)):
            raise ModelError(
                f"source: TensorRT's ONNX parser refused the model: {parser_errors(self._parser)}"
            )
        network = self._network
        self._inputs = [
            NetworkInput(t.name, tuple(int(d) for d in t.shape))
            for t in (network.get_input(i) for i in range(network.num_inputs))
        ]
        self._shapes = input_shapes(self._inputs, self.spec.profiles)

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None:
        """Write the plan; returns the calibration samples used (None: not calibrated)."""
        trt, builder = self.trt, self._builder
        assert builder is not None, "reference() first"
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        config.add_optimization_profile(self._profile(self._shapes))
        enabled, cleared = builder_flags(trt, precision)
        for flag in enabled:
            config.set_flag(flag)
        for flag in cleared:
            config.clear_flag(flag)
        calibrator, used = None, None
        if precision == "int8":
            assert self.spec.calibration is not None  # the spec's rule
            # Checked first: a fixed batch that differs from the calibration batch is an error.
            shapes = calibration_shapes(
                self._inputs, self._shapes, self.spec.calibration.batch_size
            )
            calibrator, used = self._calibrator(engine, calibration_file)
            config.int8_calibrator = calibrator
            if any(-1 in i.dims for i in self._inputs):
                config.set_calibration_profile(self._profile(shapes))
        self._messages.clear()
        try:
            plan = builder.build_serialized_network(self._network, config)
        finally:
            if calibrator is not None:
                calibrator.release()
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

    def _calibrator(self, engine: Path, calibration_file: Path | None) -> tuple[Any, int]:
        calibration = self.spec.calibration
        assert calibration is not None and calibration_file is not None  # the spec's rule
        data = load_set(calibration_file, self._source.inputs, "calibration")
        feeds = calibration_feeds(
            data, self._source.inputs, calibration.batch_size, calibration.max_samples
        )
        name = calibration_cache_name(
            sha256_file(calibration_file), calibration.batch_size, calibration.max_samples
        )
        calibrator = make_calibrator(
            self.trt, feeds, engine.parent / name, self._runtime_backend().allocator
        )
        return calibrator, len(feeds) * calibration.batch_size

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
