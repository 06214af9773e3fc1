"""The ONNX Runtime builder: the graph-optimized FP32 model (the session's
``optimized_model_filepath``), static INT8 quantization calibrated on a data set
(``quantize_static``), and running models the way the runtime's backend does."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from .datasets import batches, load_set, samples_of
from .gate import Reference, gate_output, validation_labels
from .spec import BuildSpec, ModelError, QuantizationSpec, ShapeProfile

Array = np.ndarray[Any, Any]

_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int | str | None, ...]
    dtype: type[Any]


def library_versions() -> dict[str, str]:
    import onnx

    versions = {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "numpy": np.__version__}
    try:
        versions["tidal"] = metadata.version("tidal")
    except metadata.PackageNotFoundError:
        versions["tidal"] = "unknown"
    return versions


def session(
    path: Path, optimization: str = "all", intra_op_threads: int = 0
) -> ort.InferenceSession:
    """A CPU session. With ``optimization='all'`` and one inter-op thread it is what the
    runtime's ONNX Runtime backend opens (runtime/backends/onnx.py), so the gate measures the
    engine as it will be served."""
    options = ort.SessionOptions()
    options.graph_optimization_level = _LEVELS[optimization]
    options.inter_op_num_threads = 1
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types for bad models
        raise ModelError(f"ONNX Runtime cannot load {path.name}: {exc}") from None


def inputs_of(sess: ort.InferenceSession) -> list[TensorInfo]:
    out = []
    for arg in sess.get_inputs():
        dtype = _NUMPY_TYPES.get(arg.type)
        if dtype is None:
            raise ModelError(
                f"input {arg.name!r} has type {arg.type}, which the builder cannot feed"
            )
        out.append(TensorInfo(arg.name, tuple(arg.shape), dtype))
    return out


def run(
    sess: ort.InferenceSession,
    data: Mapping[str, Array],
    inputs: list[TensorInfo],
    output: str,
    batch_size: int,
) -> Array:
    """One output of the model over the whole data set, in batches."""
    parts = [sess.run([output], batch)[0] for batch in batches(data, inputs, batch_size)]
    return np.concatenate(parts, axis=0)


def check_profiles(
    sess: ort.InferenceSession, inputs: list[TensorInfo], profiles: list[ShapeProfile]
) -> None:
    """Every profile names an input whose static dimensions it keeps, and the model runs at
    each of its min, opt and max shapes (other inputs at their static shape, batch 1)."""
    by_name = {t.name: t for t in inputs}
    for index, profile in enumerate(profiles):
        field = f"profiles[{index}]"
        info = by_name.get(profile.input)
        if info is None:
            raise ModelError(
                f"{field}.input: the model has no input {profile.input!r} "
                f"(its inputs: {sorted(by_name)})"
            )
        if len(profile.opt) != len(info.dims):
            raise ModelError(
                f"{field}: input {info.name!r} has rank {len(info.dims)}, the profile "
                f"{len(profile.opt)}"
            )
        for axis, dim in enumerate(info.dims):
            if isinstance(dim, int) and dim > 0:
                used = {profile.min[axis], profile.opt[axis], profile.max[axis]}
                if used != {dim}:
                    raise ModelError(
                        f"{field}: axis {axis} of input {info.name!r} is fixed at {dim}, "
                        f"the profile asks for {sorted(used)}"
                    )
    for index, profile in enumerate(profiles):
        for point in ("min", "opt", "max"):
            shape = getattr(profile, point)
            feed = {
                t.name: np.zeros(
                    shape
                    if t.name == profile.input
                    else [d if isinstance(d, int) and d > 0 else 1 for d in t.dims],
                    dtype=t.dtype,
                )
                for t in inputs
            }
            try:
                sess.run(None, feed)
            except Exception as exc:
                raise ModelError(
                    f"profiles[{index}].{point}: the engine does not run input "
                    f"{profile.input!r} at {shape}: {exc}"
                ) from None


def optimize_fp32(source: Path, out: Path, level: str) -> None:
    """ONNX Runtime's offline graph optimization: the session writes the optimized graph."""
    options = ort.SessionOptions()
    options.graph_optimization_level = _LEVELS[level]
    options.optimized_model_filepath = str(out)
    try:
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"source: ONNX Runtime cannot optimize the model: {exc}") from None


def quantize_int8(
    source: Path,
    out: Path,
    calibration: Mapping[str, Array],
    inputs: list[TensorInfo],
    settings: QuantizationSpec,
    batch_size: int,
    max_samples: int | None,
    extra_options: Mapping[str, Any] | None = None,
) -> int:
    """Static INT8 quantization calibrated on ``calibration``; returns the samples used.
    ``extra_options``: quantize_static's (the TensorRT builder asks for symmetric activations
    and FP32 bias, what TensorRT's Q/DQ networks take).

    The source is first pre-processed (ONNX shape inference and ORT's basic optimizations:
    what ONNX Runtime asks for before quantization), then quantized."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    feeds = list(batches(calibration, inputs, batch_size, max_samples))
    prepared = out.with_name(out.stem + ".pre.onnx")
    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    try:
        with _root_logger_quiet():
            # Symbolic shape inference needs sympy, which the runtime image does not carry.
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            quantize_static(
                str(prepared),
                str(out),
                _calibration_reader(feeds),
                quant_format=QuantFormat.QDQ if settings.format == "qdq" else QuantFormat.QOperator,
                activation_type=types[settings.activation_type],
                weight_type=types[settings.weight_type],
                per_channel=settings.per_channel,
                calibrate_method=methods[settings.method],
                extra_options=dict(extra_options or {}),
            )
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"quantization: ONNX Runtime's quantize_static failed: {exc}") from None
    finally:
        prepared.unlink(missing_ok=True)
    return sum(samples_of(f, inputs) for f in feeds)


@contextlib.contextmanager
def _root_logger_quiet() -> Iterator[None]:
    """The quantization tool logs advice through the root logger; the build reports instead."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _calibration_reader(feeds: list[dict[str, Array]]) -> Any:
    """ONNX Runtime's calibration reader over ``feeds``, one batch per call."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, Array] | None:
            return next(self._feeds, None)

    return Reader()


class OnnxRuntimeMaker:
    """The ONNX Runtime builder as :func:`tidal.runtime.builder.build.build` drives it: the
    reference is the source run with every graph optimization off, FP32; ``fp32`` is the
    graph-optimized model, ``int8`` static quantization; each engine is run as the runtime's
    ONNX Runtime backend opens it."""

    def __init__(self, spec: BuildSpec) -> None:
        self.spec = spec
        self._source: Path | None = None
        self._inputs: list[TensorInfo] = []
        self._validation: dict[str, Array] = {}
        self._output = ""

    def libraries(self) -> dict[str, str]:
        return library_versions()

    @property
    def inputs(self) -> list[TensorInfo]:
        """The source's inputs (after :meth:`reference`)."""
        return self._inputs

    @property
    def validation(self) -> dict[str, Array]:
        """The validation set, cast to the inputs' types (after :meth:`reference`)."""
        return self._validation

    @property
    def output(self) -> str:
        """The output the gate compares (after :meth:`reference`)."""
        return self._output

    def reference(self, source: Path, validation_file: Path) -> Reference:
        spec = self.spec
        reference = session(source, "disabled")
        self._source = source
        self._inputs = inputs_of(reference)
        self._output = gate_output(spec.gate.output, [o.name for o in reference.get_outputs()])
        self._validation = load_set(validation_file, self._inputs, "validation")
        labels = validation_labels(spec.validation.labels, self._validation)
        check_profiles(reference, self._inputs, spec.profiles)
        expected = run(
            reference, self._validation, self._inputs, self._output, spec.validation.batch_size
        )
        return Reference(self._output, expected, labels, samples_of(self._validation, self._inputs))

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None:
        """Write the engine; returns the calibration samples used (None: no calibration)."""
        spec = self.spec
        assert self._source is not None, "reference() first"
        if precision == "fp32":
            optimize_fp32(self._source, engine, spec.optimization)
            return None
        assert spec.calibration is not None and calibration_file is not None
        calibration = load_set(calibration_file, self._inputs, "calibration")
        return quantize_int8(
            self._source,
            engine,
            calibration,
            self._inputs,
            spec.quantization,
            spec.calibration.batch_size,
            spec.calibration.max_samples,
        )

    def evaluate(self, engine: Path, precision: str) -> Array:
        candidate = session(engine)
        check_profiles(candidate, self._inputs, self.spec.profiles)
        return run(
            candidate, self._validation, self._inputs, self._output, self.spec.validation.batch_size
        )

    def close(self) -> None:
        pass
