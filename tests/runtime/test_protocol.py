"""Open Inference Protocol codec: JSON and binary tensors, and what malformed input says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.runtime.errors import InvalidInput, InvalidRequest, ServingError
from tidal.runtime.protocol import DATATYPES, RequestedOutput, decode_request, encode_response


def binary_body(header: dict[str, object], *chunks: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), len(head)


def test_json_and_binary_inputs_decode_to_the_same_arrays() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    as_json = decode_request(
        json.dumps(
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": x.ravel().tolist()}
                ]
            }
        ).encode(),
        None,
    )
    body, length = binary_body(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        },
        x.tobytes(),
    )
    as_binary = decode_request(body, length)
    np.testing.assert_array_equal(as_json.inputs["x"], x)
    np.testing.assert_array_equal(as_binary.inputs["x"], x)


@pytest.mark.parametrize(
    ("body", "length", "error", "message"),
    [
        (b"{", None, InvalidRequest, "not valid JSON"),
        (b"[]", None, InvalidRequest, "JSON object"),
        (b'{"inputs": []}', None, InvalidRequest, "non-empty"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}',
            None,
            InvalidInput,
            "FP99",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}',
            None,
            InvalidInput,
            "needs 2 elements",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
            None,
            InvalidInput,
            "non-negative",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": ["a"]}]}',
            None,
            InvalidInput,
            "not INT32",
        ),
        (b"{}", 99, InvalidRequest, "Inference-Header-Content-Length"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4294967296, 4294967296], '
            b'"data": []}]}',
            None,
            InvalidInput,
            "needs 18446744073709551616 elements",
        ),
    ],
)
def test_malformed_requests_say_what_was_expected(
    body: bytes, length: int | None, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        decode_request(body, length)


def test_binary_outputs_follow_the_json_header() -> None:
    out = np.arange(4, dtype=np.float32).reshape(2, 2)
    body, length = encode_response("m", {"y": out}, [RequestedOutput("y", True)], False, "42")
    assert length is not None
    header = json.loads(body[:length])
    assert header["id"] == "42"
    assert header["outputs"][0]["parameters"]["binary_data_size"] == out.nbytes
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32).reshape(2, 2), out)


def test_json_outputs_when_binary_is_not_asked_for() -> None:
    body, length = encode_response("m", {"y": np.ones((1, 2), np.int64)}, None, False)
    assert length is None
    assert json.loads(body)["outputs"][0] == {
        "name": "y",
        "datatype": "INT64",
        "shape": [1, 2],
        "data": [1, 1],
    }


def test_binary_sizes_must_match_the_shape_and_the_body() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 8}}
    body, length = binary_body({"inputs": [tensor]}, bytes(8))
    with pytest.raises(InvalidInput, match="needs 4 bytes"):
        decode_request(body, length)
    body, length = binary_body({"inputs": [tensor]}, bytes(4))
    with pytest.raises(InvalidRequest, match="past the end"):
        decode_request(body, length)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
tensor_like = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["x", 1, None]),
        "datatype": st.sampled_from([*DATATYPES, "BYTES", 3]),
        "shape": st.lists(st.integers(-2, 4) | st.just(2**32), max_size=3) | json_values,
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "binary_data"]), json_values, max_size=2
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"inputs": st.lists(tensor_like, max_size=3)},
            optional={"outputs": json_values, "parameters": json_values, "id": json_values},
        ),
    ),
    st.binary(max_size=64),
    st.one_of(st.none(), st.integers(-5, 400)),
)
def test_nothing_a_client_sends_raises_anything_but_a_serving_error(
    header: object, tail: bytes, length: int | None
) -> None:
    body = json.dumps(header).encode()
    try:
        decode_request(body + tail, len(body) if length is None else length)
    except ServingError:
        pass
