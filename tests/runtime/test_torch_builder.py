"""The torch (AOTInductor) builder's pure parts, without torch: the spec, the package names the
runtime reads, the build key, the batch range, the package layout's torch-only dtypes; and that
a torch build where torch is missing fails naming the backend. The parts that need torch and a
GPU are in tests/gpu/test_torch_builder_gpu.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tidal.runtime.backends import TensorSpec
from tidal.runtime.backends.torch_aoti import (
    Pt2Manifest,
    dtype_name,
    itemsize,
    parse_manifest,
)
from tidal.runtime.builder.__main__ import main as builder_main
from tidal.runtime.builder.aoti import batch_range
from tidal.runtime.builder.plan import (
    TORCH_SCHEMES,
    build_key,
    differences,
    engine_file_name,
    key_inputs,
)
from tidal.runtime.builder.pt2 import (
    layout_constants,
    manifest_to_json,
)
from tidal.runtime.builder.spec import BuildSpec, ModelError, parse_build_spec
from tidal.runtime.core.engines import EngineTarget, describe_engine, select_engine
from tidal.runtime.errors import EngineLoadError

LIBRARIES = {"torch": "2.11.0+cu130", "cuda": "13.0", "numpy": "2.4.6", "tidal": "0.1.0"}


def torch_spec(**overrides: Any) -> BuildSpec:
    data: dict[str, Any] = {
        "model": "digits",
        "version": "1",
        "source": {"uri": "s3://models/digits/1/digits.pt2"},
        "backend": "torch",
        "target": "sm90",
        "precisions": ["fp32", "fp16", "bf16"],
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
        "validation": {"uri": "s3://models/digits/validation.npz", "labels": "labels"},
        "output": "s3://engines/team",
    }
    data.update(overrides)
    return parse_build_spec(data)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_package_names_are_what_the_runtime_reads_and_selects(precision: str) -> None:
    spec = torch_spec()
    name = engine_file_name(spec, precision, LIBRARIES)
    assert name == f"sm90-torch2.11-{precision}.pt2"
    described = describe_engine(f"s3://engines/team/digits/1/sm90/{precision}/{name}")
    assert (described.format, described.gpu_arch, described.torch_version) == (
        "pt2",
        "sm90",
        (2, 11),
    )
    assert described.precision == precision
    here = EngineTarget(format="pt2", gpu_arch="sm90", torch_version=(2, 11))
    assert select_engine([described], here).chosen == described
    elsewhere = EngineTarget(format="pt2", gpu_arch="sm80", torch_version=(2, 11))
    assert "compiled for sm90" in select_engine([described], elsewhere).reason


def test_a_package_name_needs_the_torch_version() -> None:
    with pytest.raises(ValueError, match="torch version"):
        engine_file_name(torch_spec(), "fp16", {})


def test_onnx_engine_names_are_unchanged() -> None:
    spec = parse_build_spec(
        {
            "model": "digits",
            "version": "1",
            "source": {"uri": "digits.onnx"},
            "precisions": ["fp32"],
            "validation": {"uri": "v.npz"},
            "output": "out",
        }
    )
    assert engine_file_name(spec, "fp32", LIBRARIES) == "digits-fp32.onnx"


def test_the_torch_build_key_covers_the_scheme_and_the_torch_that_compiled() -> None:
    spec = torch_spec()

    def inputs(precision: str, libraries: dict[str, str] = LIBRARIES) -> dict[str, Any]:
        return key_inputs(
            spec,
            precision,
            source_sha256="a" * 64,
            calibration_sha256=None,
            validation_sha256="b" * 64,
            libraries=libraries,
        )

    fp16 = inputs("fp16")
    assert fp16["scheme"] == TORCH_SCHEMES["fp16"]
    assert "optimization" not in fp16 and "quantization" not in fp16
    assert (fp16["backend"], fp16["target"]) == ("torch", "sm90")
    keys = {build_key(inputs(p)) for p in ("fp32", "fp16", "bf16")}
    assert len(keys) == 3
    newer = inputs("fp16", {**LIBRARIES, "torch": "2.12.0"})
    assert build_key(newer) != build_key(fp16)
    assert differences(fp16, newer) == ["libraries.torch"]


TORCH_SPEC_ERRORS = [
    ({"precisions": ["int8"]}, "  precisions: ", "the torch builder makes"),
    ({"precisions": ["fp8"]}, "  precisions: ", "makes ['fp32', 'fp16', 'bf16'], not ['fp8']"),
    ({"profiles": []}, "  profiles: ", "required by the torch builder"),
    ({"target": "hopper"}, "  target: ", "compiles for a GPU architecture (sm90) or cpu"),
]


@pytest.mark.parametrize(("override", "field", "says"), TORCH_SPEC_ERRORS)
def test_invalid_torch_specs_name_the_field(
    override: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(Exception) as caught:
        torch_spec(**override)
    assert field in str(caught.value) and says in str(caught.value), str(caught.value)


def test_every_input_shares_one_batch_range() -> None:
    profiles = [
        {"input": "a", "min": [1, 8], "opt": [8, 8], "max": [64, 8]},
        {"input": "b", "min": [1, 3], "opt": [8, 3], "max": [64, 3]},
    ]
    assert batch_range(torch_spec(profiles=profiles)) == (1, 8, 64)
    profiles[1]["max"] = [32, 3]
    with pytest.raises(ModelError, match="profiles' batch axes differ"):
        batch_range(torch_spec(profiles=profiles))


def test_bf16_and_fp8_constants_are_laid_out_and_read_back() -> None:
    """Numpy has no bfloat16 or float8: the package manifest names them as torch does."""
    assert (dtype_name("bfloat16"), itemsize("bfloat16")) == ("bfloat16", 2)
    assert (dtype_name("float8_e4m3fn"), itemsize("float8_e4m3fn")) == ("float8_e4m3fn", 1)
    assert (dtype_name("float32"), itemsize("float32")) == ("float32", 4)
    layout, total = layout_constants(
        [
            ("0.weight", "bfloat16", (512, 64), 512 * 64 * 2),
            ("fp8_0_weight", "float8_e4m3fn", (512, 512), 512 * 512),
            ("fp8_0_scale", "float32", (), 4),
        ]
    )
    manifest = Pt2Manifest(
        inputs=(TensorSpec("input", "FP32", (-1, 64)),),
        outputs=(TensorSpec("output", "FP32", (-1, 10)),),
        constants=layout,
        weights_bytes=total,
        device="cuda",
        torch_version="2.11.0",
    )
    again = parse_manifest(manifest_to_json(manifest))
    assert [(c.dtype, c.nbytes) for c in again.constants] == [
        ("bfloat16", 65536),
        ("float8_e4m3fn", 262144),
        ("float32", 4),
    ]
    broken = json.loads(manifest_to_json(manifest))
    broken["constants"][1]["nbytes"] = 512 * 512 * 2
    with pytest.raises(EngineLoadError, match="does not match its shape"):
        parse_manifest(json.dumps(broken))


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_a_torch_build_without_torch_fails_naming_the_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "digits.pt2"
    source.write_bytes(b"not used")
    validation = tmp_path / "validation.npz"
    validation.write_bytes(b"not used")
    spec = {
        "model": "digits",
        "version": "1",
        "source": {"uri": str(source)},
        "backend": "torch",
        "target": "sm90",
        "precisions": ["fp16"],
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
        "validation": {"uri": str(validation)},
        "output": str(tmp_path / "out"),
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert builder_main([str(path), "--work-dir", str(tmp_path / "work")]) == 2
    assert "error: backend: the torch backend needs PyTorch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
