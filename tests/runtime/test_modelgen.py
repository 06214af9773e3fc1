"""The model generator: deterministic, dynamic batch, sized on request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tidal.runtime.modelgen import mlp_hidden_for_bytes, write_convnet, write_mlp


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
