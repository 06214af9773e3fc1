"""The model generator: deterministic, dynamic batch, sized on request."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tidal.runtime.config import S3Spec
from tidal.runtime.modelgen import (
    EXAMPLE_MODELS,
    example_model_names,
    mlp_hidden_for_bytes,
    write_convnet,
    write_mlp,
)
from tidal.runtime.modelgen import main as modelgen_main
from tidal.runtime.storage import EngineStore
from tidal.sandbox.objectstore import ObjectStore


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_mlp(tmp_path / "a.onnx", seed=1)
    b = write_mlp(tmp_path / "b.onnx", seed=1)
    c = write_mlp(tmp_path / "c.onnx", seed=2)
    assert a.sha256 == b.sha256 != c.sha256


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_models_accept_any_batch_size(tmp_path: Path, batch: int) -> None:
    for info in (
        write_mlp(tmp_path / "m.onnx", inputs=5, outputs=2),
        write_convnet(tmp_path / "c.onnx", channels=2, size=6, classes=3),
    ):
        session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
        shape = [batch, *info.input_shape[1:]]
        (out,) = session.run(None, {info.input_name: np.zeros(shape, np.float32)})
        assert out.shape == (batch, info.output_shape[1])


@pytest.mark.parametrize("target", [100_000, 1_000_000, 4_000_000])
def test_size_knob_hits_the_requested_file_size(tmp_path: Path, target: int) -> None:
    info = write_mlp(tmp_path / "s.onnx", hidden=mlp_hidden_for_bytes(target))
    assert abs(info.size_bytes - target) / target < 0.02


# -- the examples' models: written, and uploaded to an S3-compatible store --------------------

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def test_example_models_are_every_onnx_file_the_examples_fetch() -> None:
    in_text = {
        name
        for path in EXAMPLES.rglob("*.yaml")
        for name in re.findall(r"uri: s3://models/(\S+\.onnx)", path.read_text())
    }
    names = example_model_names(EXAMPLES)
    assert names == sorted(in_text), f"modelgen finds {names}, the manifests name {in_text}"
    assert "mlp-small.onnx" in names and not any(n.endswith(".engine") for n in names), names


def test_shipped_example_list_is_what_the_examples_fetch() -> None:
    """The chart's upload Job runs modelgen without a checkout: its list is the examples'."""
    assert example_model_names() == sorted(EXAMPLE_MODELS) == example_model_names(EXAMPLES), (
        f"EXAMPLE_MODELS {sorted(EXAMPLE_MODELS)} != examples/ {example_model_names(EXAMPLES)}"
    )


def test_examples_command_without_a_checkout_writes_the_shipped_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert modelgen_main(["examples", str(tmp_path / "out")]) == 0
    reported = [line.split()[2] for line in capsys.readouterr().out.splitlines()]
    assert reported == sorted(EXAMPLE_MODELS), reported
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == reported


def test_example_models_from_a_bucket_keep_their_path(tmp_path: Path) -> None:
    (tmp_path / "svc.yaml").write_text(
        "spec:\n  models:\n  - engines: [{uri: s3://models/team/a.onnx}, {uri: s3://m/b.plan}]\n"
        "  rollout: {baseline: {models: [{engines: [{uri: http://elsewhere.example/c.onnx}]}]}}\n"
    )
    assert example_model_names(tmp_path) == ["team/a.onnx"]


def test_examples_command_writes_each_model_it_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert modelgen_main(["examples", str(tmp_path / "out"), "--examples", str(EXAMPLES)]) == 0
    lines = capsys.readouterr().out.splitlines()
    reported = {line.split()[2]: line.split()[0] for line in lines}
    assert sorted(reported) == example_model_names(EXAMPLES), lines
    for name, digest in reported.items():
        path = tmp_path / "out" / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()], name


def test_examples_command_names_a_missing_examples_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        modelgen_main(["examples", str(tmp_path), "--examples", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--examples" in err and "nowhere" in err, err


@pytest.mark.sandbox
def test_upload_puts_every_example_model_where_the_runtime_reads_it(
    s3: ObjectStore, aws_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.create_bucket("models")
    argv = ["upload", "--endpoint", s3.endpoint, "--bucket", "models", "--prefix", "team/"]
    for _ in range(2):  # again over what is there: the same objects
        assert modelgen_main([*argv, "--examples", str(EXAMPLES)]) == 0, capsys.readouterr().err
        lines = capsys.readouterr().out.splitlines()
    reported = {line.split()[2]: line.split()[0] for line in lines}
    assert sorted(reported) == example_model_names(EXAMPLES), lines
    store = EngineStore(str(tmp_path / "cache"), S3Spec(endpoint=s3.endpoint))
    for name, digest in reported.items():
        path = store.fetch(f"s3://models/team/{name}", digest)  # the runtime's read, verified
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()], name


@pytest.mark.sandbox
def test_upload_to_a_missing_bucket_names_it(
    s3: ObjectStore, aws_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["upload", "--endpoint", s3.endpoint, "--bucket", "no-such-bucket"]
    assert modelgen_main([*argv, "--examples", str(EXAMPLES)]) == 1
    err = capsys.readouterr().err
    assert "s3://no-such-bucket/" in err and s3.endpoint in err, err
