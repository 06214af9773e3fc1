"""The TensorRT builder's parts that run without TensorRT: profiles to optimization-profile
shapes, the strongly typed network's flags (no precision flag on TensorRT 10 or 11), the ONNX
model each precision's network is parsed from (the Q/DQ INT8 model calibrated and gated under
ONNX Runtime, the FP16/BF16 casts), the plan's name and the build key, and that a build where
TensorRT's builder is not installed (here: everywhere, FACTS.md) stops with an error saying
where it is.

No test here builds a plan: TensorRT's builder cannot be installed on these machines, and a
stand-in module would only test the stand-in (runtime/BUILD.md, "TensorRT")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tidal.runtime import modelgen
from tidal.runtime.builder.__main__ import main as builder_main
from tidal.runtime.builder.build import build, engine_maker
from tidal.runtime.builder.gate import RefusedBeforeBuild
from tidal.runtime.builder.plan import engine_file_name, key_inputs
from tidal.runtime.builder.spec import BuildSpecError, ModelError, ShapeProfile, parse_build_spec
from tidal.runtime.builder.tensorrt import (
    TENSORRT_QDQ_OPTIONS,
    InputShapes,
    NetworkInput,
    cleared_flags,
    input_shapes,
    network_flags,
    network_model,
    tensorrt_libraries,
    tensorrt_quantization,
)
from tidal.runtime.core.engines import EngineTarget, describe_engine, select_engine

NO_TENSORRT = importlib.util.find_spec("tensorrt") is None
PROFILE = ShapeProfile(input="input", min=[1, 64], opt=[8, 64], max=[64, 64])


def trt_spec(tmp: Path, **overrides: Any) -> Any:
    data: dict[str, Any] = {
        "model": "digits",
        "version": "1",
        "source": {"uri": str(tmp / "digits.onnx")},
        "backend": "tensorrt",
        "target": "sm90",
        "precisions": ["fp32", "fp16", "int8"],
        "profiles": [PROFILE.model_dump(by_alias=True)],
        "calibration": {"uri": str(tmp / "calibration.npz"), "batchSize": 16},
        "validation": {"uri": str(tmp / "validation.npz"), "labels": "labels"},
        "output": str(tmp / "store"),
    }
    data.update(overrides)
    return parse_build_spec(data)


# -- profiles -> the optimization profile --------------------------------------------------------


def test_a_profile_becomes_the_inputs_min_opt_max_and_static_inputs_keep_their_shape() -> None:
    inputs = [NetworkInput("input", (-1, 64)), NetworkInput("mask", (1, 4))]
    assert input_shapes(inputs, [PROFILE]) == (
        InputShapes("input", (1, 64), (8, 64), (64, 64)),
        InputShapes("mask", (1, 4), (1, 4), (1, 4)),
    )


@pytest.mark.parametrize(
    ("inputs", "profiles", "message"),
    [
        ([NetworkInput("input", (-1, 64))], [], "profiles: input 'input' has dynamic dimensions"),
        (
            [NetworkInput("pixels", (-1, 64))],
            [PROFILE],
            "profiles[0].input: the network has no input 'input' (its inputs: ['pixels'])",
        ),
        (
            [NetworkInput("input", (-1, 32))],
            [PROFILE],
            "profiles[0]: axis 1 of input 'input' is fixed at 32, the profile asks for [64]",
        ),
        (
            [NetworkInput("input", (-1, 8, 8))],
            [PROFILE],
            "profiles[0]: input 'input' has rank 3, the profile 2",
        ),
    ],
)
def test_profiles_that_do_not_fit_the_network_name_the_field(
    inputs: list[NetworkInput], profiles: list[ShapeProfile], message: str
) -> None:
    with pytest.raises(ModelError) as caught:
        input_shapes(inputs, profiles)
    assert message in str(caught.value)


# -- the strongly typed network ----------------------------------------------------------------

# TensorRT's enums as names: the mapping, not TensorRT, is under test.
TRT10 = SimpleNamespace(
    __version__="10.13.0.35",
    NetworkDefinitionCreationFlag=SimpleNamespace(EXPLICIT_BATCH=0, STRONGLY_TYPED=1),
    BuilderFlag=SimpleNamespace(FP16="FP16", BF16="BF16", INT8="INT8", TF32="TF32"),
)
TRT11 = SimpleNamespace(
    __version__="11.4.0",
    NetworkDefinitionCreationFlag=SimpleNamespace(),
    BuilderFlag=SimpleNamespace(TF32="TF32"),
)


def test_the_network_is_strongly_typed_and_no_precision_sets_a_builder_flag() -> None:
    assert network_flags(TRT10) == 1 << 1, "TensorRT 10: the STRONGLY_TYPED bit"
    assert network_flags(TRT11) == 0, "a TensorRT without the flag is strongly typed only"
    for trt in (TRT10, TRT11):
        assert cleared_flags(trt, "fp32") == ["TF32"], trt.__version__
        for precision in ("fp16", "bf16", "int8"):
            assert cleared_flags(trt, precision) == [], (trt.__version__, precision)


def test_tensorrt_takes_signed_symmetric_qdq_int8_and_says_which_setting_is_wrong(
    tmp_path: Path,
) -> None:
    settings, options = tensorrt_quantization(trt_spec(tmp_path).quantization)
    assert settings.format == "qdq" and options == TENSORRT_QDQ_OPTIONS, (settings, options)
    assert options["ActivationSymmetric"] and not options["QuantizeBias"], options
    for field, value in (("format", "qoperator"), ("activationType", "uint8")):
        spec = trt_spec(tmp_path, quantization={field: value})
        with pytest.raises(ModelError, match=rf"quantization.{field}: TensorRT takes .* not "):
            tensorrt_quantization(spec.quantization)


def _reference(inputs: Path, **overrides: Any) -> tuple[Any, Any, Any]:
    from tidal.runtime.builder.onnxrt import OnnxRuntimeMaker

    spec = trt_spec(inputs, **overrides)
    maker = OnnxRuntimeMaker(spec)
    reference = maker.reference(inputs / "digits.onnx", inputs / "validation.npz")
    return spec, maker, reference


def test_int8_is_a_qdq_model_gated_under_onnx_runtime_before_tensorrt(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    inputs = modelgen.write_digits_build_inputs(tmp_path / "inputs")
    spec, maker, reference = _reference(inputs)
    engine = tmp_path / "sm90-trt10.13-int8.engine"
    path, used = network_model(
        spec, maker, reference, inputs / "digits.onnx", "int8", engine, inputs / "calibration.npz"
    )
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and "DequantizeLinear" in ops, ops
    assert not {"QLinearMatMul", "MatMulInteger", "QLinearConv"} & set(ops), ops
    points = {
        t.name: numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.name.endswith("zero_point")
    }
    assert points and all(p.dtype == np.int8 and not p.any() for p in points.values()), points
    dequantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    int32 = [
        t.name
        for t in model.graph.initializer
        if t.name in dequantized and t.data_type == onnx.TensorProto.INT32
    ]
    assert not int32, f"bias must stay FP32 for TensorRT: {int32}"
    assert used and used > 1000, used  # the training digits

    # the same step refuses a model calibrated on blank images, before TensorRT would run
    with pytest.raises(RefusedBeforeBuild) as caught:
        network_model(
            spec, maker, reference, inputs / "digits.onnx", "int8", engine, inputs / "blank.npz"
        )
    early = caught.value
    assert early.judged.name.endswith(".qdq.onnx") and not early.verdict.passed, early
    assert early.metrics.top1_agreement < 0.99, early.metrics
    assert str(early).startswith("refused: top1Agreement"), str(early)


class QdqMaker:
    """The TensorRT maker's INT8 path with ONNX Runtime in TensorRT's place: the Q/DQ model is
    made and gated by the real code (network_model); the 'plan' is that model, run by ONNX
    Runtime. What is under test is how a build records a refusal before building."""

    def __init__(self, spec: Any) -> None:
        from tidal.runtime.builder.onnxrt import OnnxRuntimeMaker, library_versions

        self.spec, self.source, self.versions = spec, OnnxRuntimeMaker(spec), library_versions()

    def libraries(self) -> dict[str, str]:
        return {**self.versions, "tensorrt": "10.13.0", "gpu": "sm90"}

    def reference(self, source: Path, validation_file: Path) -> Any:
        self.onnx, self.ref = source, self.source.reference(source, validation_file)
        return self.ref

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None:
        model, used = network_model(
            self.spec, self.source, self.ref, self.onnx, precision, engine, calibration_file
        )
        engine.write_bytes(model.read_bytes())
        return used

    def evaluate(self, engine: Path, precision: str) -> Any:
        return self.source.evaluate(engine, precision)

    def close(self) -> None:
        pass


def test_a_qdq_model_refused_before_building_is_recorded_like_any_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import tidal.runtime.builder.build as build_module

    monkeypatch.setattr(build_module, "engine_maker", QdqMaker)
    inputs = modelgen.write_digits_build_inputs(tmp_path / "inputs")
    spec = trt_spec(
        inputs,
        precisions=["fp32", "int8"],
        calibration={"uri": str(inputs / "blank.npz"), "batchSize": 16},
        output=str(tmp_path / "store"),
    )
    lines: list[str] = []
    report = build(spec, tmp_path / "work", progress=lines.append)
    verdicts = {a.precision: a for a in report.artifacts}
    assert verdicts["fp32"].engine_uri and not verdicts["int8"].engine_uri, report
    assert "refused before building: int8 (sm90-trt10.13-int8.qdq.onnx)" in lines, lines
    folder = tmp_path / "store" / "digits" / "1" / "sm90" / "int8"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"], list(folder.iterdir())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert not manifest["published"], manifest
    assert manifest["file"]["name"] == "sm90-trt10.13-int8.qdq.onnx", manifest["file"]
    assert manifest["calibration"]["samples"] == 64, manifest["calibration"]
    assert manifest["accuracy"]["top1Agreement"] < 0.99, manifest["accuracy"]


def test_fp16_and_bf16_networks_parse_a_cast_model_with_fp32_at_the_boundary(
    tmp_path: Path,
) -> None:
    import onnx
    from onnx.reference import ReferenceEvaluator

    inputs = modelgen.write_digits_build_inputs(tmp_path / "inputs")
    spec, maker, reference = _reference(inputs)
    x = np.load(inputs / "validation.npz")["input"][:200].astype(np.float32)
    for precision, elem in (
        ("fp16", onnx.TensorProto.FLOAT16),
        ("bf16", onnx.TensorProto.BFLOAT16),
    ):
        engine = tmp_path / f"sm90-trt10.13-{precision}.engine"
        path, used = network_model(
            spec, maker, reference, inputs / "digits.onnx", precision, engine, None
        )
        assert used is None, precision
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        floats = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
        assert not floats, (precision, floats)
        assert elem in {t.data_type for t in model.graph.initializer}, precision
        io = [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)]
        assert set(io) == {onnx.TensorProto.FLOAT}, (precision, io)
        if precision == "fp16":  # numpy computes float16; bfloat16 it has not
            (got,) = ReferenceEvaluator(model).run(None, {"input": x})
            agreement = float((got.argmax(1) == reference.expected[:200].argmax(1)).mean())
            assert agreement >= 0.99, (precision, agreement)


# -- names and keys -----------------------------------------------------------------------------


def test_the_plan_is_named_as_the_runtime_selects_plans(tmp_path: Path) -> None:
    libraries = tensorrt_libraries("10.13.0.35", "sm90", "13.0")
    assert {"tensorrt", "gpu", "cuda", "numpy", "onnxruntime", "tidal"} <= set(libraries)
    name = engine_file_name(trt_spec(tmp_path), "fp16", libraries)
    assert name == "sm90-trt10.13-fp16.engine"
    descriptor = describe_engine(f"s3://engines/digits/1/sm90/fp16/{name}")
    here = EngineTarget(
        "plan", gpu_arch="sm90", trt_version=(10, 13), precision_preference=("fp16",)
    )
    assert select_engine([descriptor], here).chosen == descriptor
    other = EngineTarget("plan", gpu_arch="sm89", trt_version=(10, 13))
    assert "built for sm90 but the GPU is sm89" in select_engine([descriptor], other).reason
    with pytest.raises(ValueError, match="needs the TensorRT version and the GPU"):
        engine_file_name(trt_spec(tmp_path), "fp16", {"tensorrt": "10.13.0"})


def test_the_build_key_covers_the_network_the_gpu_and_tensorrts_version(tmp_path: Path) -> None:
    spec = trt_spec(tmp_path)

    def key(precision: str, **libraries: str) -> dict[str, Any]:
        return key_inputs(
            spec,
            precision,
            source_sha256="a" * 64,
            calibration_sha256="b" * 64,
            validation_sha256="c" * 64,
            libraries={"tensorrt": "10.13.0", "gpu": "sm90", **libraries},
        )

    assert key("fp16")["network"]["typing"] == "strong", key("fp16")
    assert key("fp32")["network"]["cleared"] == ["TF32"], key("fp32")
    assert "flags" not in key("fp16"), "no precision flag: the network is strongly typed"
    int8 = key("int8")
    assert int8["calibration"] == {"sha256": "b" * 64, "maxSamples": None, "batchSize": 16}
    assert int8["quantization"]["format"] == "qdq", "the Q/DQ model's settings are in the key"
    assert key("fp16") != key("fp16", tensorrt="10.14.0") != key("fp16", gpu="sm89")


def test_the_spec_takes_tensorrt_for_a_gpu_only(tmp_path: Path) -> None:
    assert trt_spec(tmp_path, target="NVIDIA-H100-80GB-HBM3").target == "NVIDIA-H100-80GB-HBM3"
    with pytest.raises(BuildSpecError, match="the tensorrt builder builds for a GPU, not cpu"):
        trt_spec(tmp_path, target="cpu")
    with pytest.raises(BuildSpecError, match=r"the tensorrt builder makes .*not \['fp8'\]"):
        trt_spec(tmp_path, precisions=["fp8"])
    with pytest.raises(BuildSpecError, match="torch builder compiles for a GPU architecture"):
        trt_spec(tmp_path, backend="torch", target="NVIDIA-H100-80GB-HBM3", precisions=["fp32"])


# -- without TensorRT's builder ----------------------------------------------------------------


@pytest.mark.skipif(not NO_TENSORRT, reason="TensorRT is installed here")
def test_a_build_without_tensorrt_says_it_needs_nvidias_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ModelError) as caught:
        engine_maker(trt_spec(tmp_path))
    message = str(caught.value)
    assert message.startswith("backend: the TensorRT builder needs NVIDIA's image: ")
    assert "nvcr.io/nvidia/tensorrt" in message and "No module named 'tensorrt'" in message
    inputs = modelgen.write_digits_build_inputs(tmp_path / "inputs")
    spec = trt_spec(inputs, output=str(tmp_path / "store"))
    with pytest.raises(ModelError, match="needs NVIDIA's image"):
        build(spec, tmp_path / "work")
    assert not (tmp_path / "store").exists(), "nothing is published"
    assert builder_main(["--spec-json", spec.model_dump_json(by_alias=True)]) == 2
    assert "the TensorRT builder needs NVIDIA's image" in capsys.readouterr().err
