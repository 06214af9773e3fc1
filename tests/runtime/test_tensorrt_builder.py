"""The TensorRT builder's parts that run without TensorRT: profiles to optimization-profile
shapes, the calibrator's batches over the calibration set, precision to builder flags, the
plan's name and the build key's library versions, and that a build where TensorRT's builder is
not installed (here: everywhere, FACTS.md) stops with an error saying where it is.

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
from tidal.runtime.builder.plan import engine_file_name, key_inputs
from tidal.runtime.builder.spec import BuildSpecError, ModelError, ShapeProfile, parse_build_spec
from tidal.runtime.builder.tensorrt import (
    InputShapes,
    NetworkInput,
    builder_flags,
    calibration_cache_name,
    calibration_feeds,
    calibration_shapes,
    input_shapes,
    tensorrt_libraries,
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


def test_the_calibration_profile_is_the_calibration_batch_at_the_opt_shape() -> None:
    inputs = [NetworkInput("input", (-1, 64))]
    shapes = input_shapes(inputs, [PROFILE])
    assert calibration_shapes(inputs, shapes, 16) == (
        InputShapes("input", (16, 64), (16, 64), (16, 64)),
    )
    fixed = [NetworkInput("input", (8, 64))]
    with pytest.raises(ModelError, match=r"calibration.batchSize: .* fixed batch of 8"):
        calibration_shapes(fixed, input_shapes(fixed, []), 16)


# -- the calibrator's batches ---------------------------------------------------------------------


def test_the_calibrator_gets_whole_batches_of_the_calibration_set_in_order() -> None:
    inputs = [SimpleNamespace(name="input", dtype=np.float32)]
    data = {"input": np.arange(100 * 2, dtype=np.float32).reshape(100, 2)}
    feeds = calibration_feeds(data, inputs, 32, None)
    assert [f["input"].shape for f in feeds] == [(32, 2)] * 3  # the last 4 samples left out
    assert np.array_equal(np.concatenate([f["input"] for f in feeds]), data["input"][:96])
    assert len(calibration_feeds(data, inputs, 32, 64)) == 2
    with pytest.raises(
        ModelError, match="calibration: 20 samples, fewer than one batch of batchSize 32"
    ):
        calibration_feeds(data, inputs, 32, 20)


def test_a_calibration_cache_is_named_by_its_set_batch_and_samples() -> None:
    a = calibration_cache_name("ab" * 32, 32, None)
    assert a == "calibration-abababababababab-b32-nall.cache"
    assert len({a, calibration_cache_name("cd" * 32, 32, None)}) == 2
    assert len({a, calibration_cache_name("ab" * 32, 16, None)}) == 2
    assert len({a, calibration_cache_name("ab" * 32, 32, 64)}) == 2


# -- precision -> flags ----------------------------------------------------------------------


def test_each_precision_sets_its_builder_flag_and_fp32_clears_tf32() -> None:
    # TensorRT 10's BuilderFlag members as names: the mapping, not TensorRT, is under test.
    trt10 = SimpleNamespace(
        __version__="10.13.0.35",
        BuilderFlag=SimpleNamespace(FP16="FP16", BF16="BF16", INT8="INT8", TF32="TF32"),
    )
    assert builder_flags(trt10, "fp32") == ([], ["TF32"])
    assert builder_flags(trt10, "fp16") == (["FP16"], [])
    assert builder_flags(trt10, "bf16") == (["BF16"], [])
    assert builder_flags(trt10, "int8") == (["INT8"], [])
    trt11 = SimpleNamespace(__version__="11.4.0", BuilderFlag=SimpleNamespace(TF32="TF32"))
    assert builder_flags(trt11, "fp32") == ([], ["TF32"])
    with pytest.raises(ModelError, match=r"fp16: TensorRT 11.4.0 has no BuilderFlag.FP16"):
        builder_flags(trt11, "fp16")


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


def test_the_build_key_covers_the_flags_the_gpu_and_tensorrts_version(tmp_path: Path) -> None:
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

    assert key("fp16")["flags"] == {"set": ["FP16"], "cleared": []}
    assert key("fp32")["flags"] == {"set": [], "cleared": ["TF32"]}
    int8 = key("int8")
    assert int8["calibration"] == {"sha256": "b" * 64, "maxSamples": None, "batchSize": 16}
    assert "quantization" not in int8, "ONNX Runtime's quantization settings do not apply"
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
