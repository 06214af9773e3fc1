"""BYTES tensors end to end: a string model on ONNX Runtime through tritonclient (JSON and the
binary extension), bytes in and bytes out; text that is not UTF-8 is the request's fault."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as triton

from tidal.runtime.modelgen import write_text_identity


@pytest.fixture
def text_runtime(serve, model_entry, tmp_path):
    info = write_text_identity(tmp_path / "text.onnx")
    return serve({"models": [model_entry(info, "text", maxBatchSize=4)]})


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_round_trip_through_a_string_model(text_runtime, binary: bool) -> None:
    client = triton.InferenceServerClient(text_runtime.url)
    meta = client.get_model_metadata("text")
    assert meta["inputs"][0]["datatype"] == "BYTES" and meta["outputs"][0]["datatype"] == "BYTES"
    data = np.array([[b"hello", "wörld".encode()]], dtype=object)
    tensor = triton.InferInput("input", [1, 2], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=binary)
    out = triton.InferRequestedOutput("output", binary_data=binary)
    result = client.infer("text", [tensor], outputs=[out]).as_numpy("output")
    # JSON carries BYTES as strings (tritonclient gives str back then), binary as raw bytes.
    got = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in result.tolist()]
    assert got == [[b"hello", "wörld".encode()]]
    assert all(isinstance(v, bytes) for v in result.flat) == binary


def test_bytes_that_are_not_utf8_are_a_400(text_runtime) -> None:
    header = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 2], "datatype": "BYTES",
                 "parameters": {"binary_data_size": 11}},
            ]
        }
    ).encode()  # fmt: skip
    payload = b"".join(len(b).to_bytes(4, "little") + b for b in (b"\xff", b"ok"))
    assert len(payload) == 11
    request = urllib.request.Request(
        f"http://{text_runtime.url}/v2/models/text/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    assert "UTF-8" in json.loads(caught.value.read())["error"]
