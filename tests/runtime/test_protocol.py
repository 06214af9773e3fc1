"""Open Inference Protocol codec: JSON and binary tensors, and what malformed input says."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.runtime.errors import InvalidInput, InvalidRequest, ServingError
from tidal.runtime.protocol import (
    DATATYPES,
    MAX_DIMS,
    RequestedOutput,
    decode_request,
    encode_response,
)


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
            "INT32 data must be integers",
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


def tensor_body(datatype: str, shape: list[int], data: object, **header: object) -> bytes:
    tensor = {"name": "x", "datatype": datatype, "shape": shape, "data": data}
    return json.dumps({"inputs": [tensor], **header}).encode()


def output(name: str, **parameters: object) -> dict[str, object]:
    return {"name": name, "parameters": parameters}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (tensor_body("FP32", [2], [1.0, None]), "FP32 data must be numbers"),
        (tensor_body("FP32", [1], ["1.5"]), "FP32 data must be numbers"),
        (tensor_body("FP32", [1], [True]), "FP32 data must be numbers"),
        (tensor_body("FP32", [1], [1e39]), "outside FP32's range"),
        (tensor_body("FP16", [1], [70000]), "outside FP16's range"),
        (tensor_body("INT32", [1], [1.5]), "INT32 data must be integers"),
        (tensor_body("UINT8", [1], [300]), r"outside UINT8's range 0\.\.255"),
        (tensor_body("INT8", [1], [-129]), "outside INT8's range"),
        (tensor_body("INT64", [2], [1, 2**64]), r"outside INT64's range -9223372036854775808\.\."),
        (tensor_body("INT64", [1], [-(2**70)]), "outside INT64's range"),
        # Past INT64's top beside other integers numpy reads them as float64, not uint64.
        (tensor_body("INT64", [2], [0, 2**63]), r"outside INT64's range -9223372036854775808\.\."),
        (tensor_body("INT64", [2, 1], [[2**63], [-1]]), "outside INT64's range"),
        (tensor_body("UINT64", [2], [-1, 2**63]), r"outside UINT64's range 0\.\."),
        (tensor_body("UINT64", [1], [2**64]), "outside UINT64's range"),
        (tensor_body("FP32", [1], [1], parameters=[]), "'parameters' must be a JSON object"),
        (tensor_body("FP32", [1], [1], parameters=0), "'parameters' must be a JSON object"),
        (tensor_body("FP32", [1], [1], parameters=""), "'parameters' must be a JSON object"),
        (
            tensor_body("FP32", [1], [1], outputs=[{"name": "y", "parameters": []}]),
            "output 'y' parameters must be a JSON object",
        ),
        (tensor_body("BOOL", [1], [1]), "BOOL data must be true/false"),
        (tensor_body("FP32", [2, 3], [[1, 2], [3, 4], [5, 6]]), "nested exactly as shape"),
        (tensor_body("FP32", [2, 2], [[1, 2], [3]]), "nested exactly as shape"),
        (tensor_body("FP32", [1], 5), "'data' must be a list"),
        (tensor_body("FP32", [1] * (MAX_DIMS + 1), [1]), "at most 64"),
        (b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
        (tensor_body("FP32", [1], [1], parameters={"binary_data_output": "yes"}), "true or false"),
        (
            tensor_body(
                "FP32", [1], [1], outputs=[{"name": "y", "parameters": {"binary_data": 1}}]
            ),
            "true or false",
        ),
        (tensor_body("FP32", [1], [1], id=5), "'id' must be a string"),
        (tensor_body("FP32", [1], [1], id=None), "'id' must be a string, got None"),
        (tensor_body("FP32", [1], [1], parameters={"timeout": -1}), "timeout"),
        (tensor_body("FP32", [1], [1], parameters={"timeout": "10"}), "timeout"),
        (tensor_body("BYTES", [2], ["a", 1]), "BYTES data must be strings"),
        (tensor_body("BYTES", [2, 1], [["a", "b"]]), "nested exactly as shape"),
        (
            tensor_body(
                "FP32", [1], [1], outputs=[{"name": "y", "parameters": {"classification": 2}}]
            ),
            "classification",
        ),
    ],
)
def test_data_is_as_strict_as_triton(body: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        decode_request(body, None)


def test_binary_data_size_must_be_an_integer_and_exclusive_with_data() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "parameters": {}}
    for params, extra, message in [
        ({"binary_data_size": True}, {}, "non-negative integer"),
        ({"binary_data_size": 4}, {"data": [1.0]}, "both 'data' and binary_data_size"),
    ]:
        body, length = binary_body(
            {"inputs": [{**tensor, "parameters": params, **extra}]}, bytes(4)
        )
        with pytest.raises(InvalidInput, match=message):
            decode_request(body, length)


def test_nested_data_in_the_shape_and_request_fields_are_taken() -> None:
    request = decode_request(
        tensor_body(
            "FP32",
            [2, 3],
            [[1, 2, 3], [4, 5, float("nan")]],
            id="req-7",
            parameters={"timeout": 2500, "binary_data_output": True},
        ),
        None,
    )
    assert request.inputs["x"].dtype == np.float32 and request.inputs["x"].shape == (2, 3)
    assert np.isnan(request.inputs["x"][1, 2])  # NaN tokens are accepted, as Triton does
    assert (request.id, request.timeout_us, request.binary_default) == ("req-7", 2500, True)
    assert decode_request(tensor_body("UINT8", [0], []), None).inputs["x"].shape == (0,)


def test_bytes_tensors_in_json_and_in_the_binary_extension() -> None:
    as_json = decode_request(tensor_body("BYTES", [2, 1], [["héllo"], [""]]), None).inputs["x"]
    assert as_json.dtype == object and as_json.shape == (2, 1)
    assert as_json.ravel().tolist() == ["héllo".encode(), b""]
    raw = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0)
    tensor = {"name": "x", "datatype": "BYTES", "shape": [2], "parameters": {}}
    body, length = binary_body(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}]}, raw
    )
    assert decode_request(body, length).inputs["x"].tolist() == [b"abc", b""]
    for bad, message in [(raw[:-1], "has no length"), (raw + b"x", "after the last")]:
        body, length = binary_body(
            {"inputs": [{**tensor, "parameters": {"binary_data_size": len(bad)}}]}, bad
        )
        with pytest.raises(InvalidInput, match=message):
            decode_request(body, length)
    out = np.array([b"abc", b""], dtype=object)
    body, length = encode_response("m", {"y": out}, [RequestedOutput("y", True)], False)
    assert length is not None and body[length:] == raw
    body, length = encode_response("m", {"y": out}, None, False)
    assert json.loads(body)["outputs"][0]["data"] == ["abc", ""]
    with pytest.raises(InvalidRequest, match="not UTF-8"):
        encode_response("m", {"y": np.array([b"\xff"], dtype=object)}, None, False)


@pytest.mark.skipif("BF16" not in DATATYPES, reason="ml_dtypes is not installed")
def test_bf16_tensors_decode_and_encode() -> None:
    bf16 = DATATYPES["BF16"]
    x = np.array([1.5, -2.0], dtype=bf16)
    tensor = {"name": "x", "datatype": "BF16", "shape": [2], "parameters": {"binary_data_size": 4}}
    body, length = binary_body({"inputs": [tensor]}, x.tobytes())
    decoded = decode_request(body, length).inputs["x"]
    assert decoded.dtype == bf16 and decoded.astype(np.float32).tolist() == [1.5, -2.0]
    assert decode_request(tensor_body("BF16", [1], [0.25]), None).inputs["x"].dtype == bf16
    body, _ = encode_response("m", {"y": x}, None, False)
    assert json.loads(body)["outputs"][0] == {
        "name": "y",
        "datatype": "BF16",
        "shape": [2],
        "data": [1.5, -2.0],
    }


def test_non_finite_outputs_are_written_as_triton_writes_them() -> None:
    out = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    body, _ = encode_response("m", {"y": out}, None, False, None, "1")
    assert b"[NaN,Infinity,-Infinity,1.0]" in body  # rapidjson's kWriteNanAndInfFlag spelling
    data = json.loads(body)["outputs"][0]["data"]
    assert np.isnan(data[0]) and data[1:] == [np.inf, -np.inf, 1.0]


def test_strict_json_writes_non_finite_outputs_as_strings() -> None:
    out = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    body, _ = encode_response("m", {"y": out}, None, False, None, "1", non_finite="strings")
    data = json.loads(body, parse_constant=lambda token: pytest.fail(f"bare {token}"))
    assert data["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 1.0]
    finite, _ = encode_response("m", {"y": out[3:]}, None, False, None, "1", non_finite="strings")
    assert json.loads(finite)["outputs"][0]["data"] == [1.0]


def test_an_empty_outputs_list_asks_for_every_output_as_over_grpc() -> None:
    outputs = {"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)}
    request = decode_request(tensor_body("FP32", [1], [1], outputs=[]), None)
    body, _ = encode_response("m", outputs, request.outputs, request.binary_default)
    assert [o["name"] for o in json.loads(body)["outputs"]] == ["a", "b"]


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


FP_MAX = {name: float(np.finfo(DATATYPES[name]).max) for name in ("FP16", "FP32")}


def rounding_edges(datatype: str) -> list[float]:
    """The max, and the values around the point where a float64 rounds to inf in ``datatype``."""
    dtype = DATATYPES[datatype].type
    limit = FP_MAX[datatype]
    ulp = limit - float(np.nextafter(dtype(limit), dtype(0)))
    edge = limit + ulp / 2  # ties round to even: the edge itself becomes inf
    return [limit, np.nextafter(edge, 0.0), edge, np.nextafter(edge, np.inf), limit * 2]


near_limits = st.sampled_from(
    [sign * value for name in FP_MAX for value in rounding_edges(name) for sign in (1.0, -1.0)]
)
numbers = st.floats(allow_nan=True, allow_infinity=True) | near_limits | st.integers(-70000, 70000)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(FP_MAX)), st.lists(numbers, min_size=1, max_size=8), st.booleans())
def test_narrow_floats_are_refused_exactly_when_a_finite_value_would_become_infinite(
    datatype: str, values: list[float], long: bool
) -> None:
    data = values * (70 // len(values) + 1) if long else values  # > 64 values: the numpy path
    with np.errstate(over="ignore", invalid="ignore"):
        reference = np.asarray(data, dtype=np.float64).astype(DATATYPES[datatype])
    overflows = bool(np.isfinite(np.asarray(data, dtype=np.float64)[np.isinf(reference)]).any())
    body = tensor_body(datatype, [len(data)], data)
    if overflows:
        with pytest.raises(InvalidInput, match=f"outside {datatype}'s range"):
            decode_request(body, None)
    else:
        np.testing.assert_array_equal(decode_request(body, None).inputs["x"], reference)


def test_every_error_maps_to_an_http_status_and_a_grpc_code() -> None:
    import grpc

    from tidal.runtime import errors

    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, ServingError)
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert 400 <= cls.status <= 599 and cls.grpc_code in grpc.StatusCode.__members__, cls
    assert isinstance(errors.as_serving_error(ConnectionResetError()), errors.ClientDisconnected)
    assert errors.as_serving_error(RecursionError()).status == 400
    unexpected = errors.as_serving_error(KeyError("x"))
    assert (unexpected.status, unexpected.grpc_code) == (500, "INTERNAL")
    assert "internal error" in unexpected.message
