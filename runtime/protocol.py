"""Open Inference Protocol v2 wire format: JSON tensors and the binary tensor extension.

Decoding turns a request body into named numpy arrays plus the list of requested outputs;
encoding turns output arrays into a JSON or binary response body.  No I/O here: the server
hands bodies in and gets bytes out.  Every malformed input raises :class:`InvalidRequest` or
:class:`InvalidInput` with a message saying what was expected.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidal.runtime.errors import InvalidInput, InvalidRequest

HEADER_LENGTH = "Inference-Header-Content-Length"

DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: np.dtype[Any]) -> str:
    try:
        return _BY_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise InvalidInput(f"datatype {dtype} has no Open Inference Protocol name") from None


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray[Any, Any]]
    outputs: list[RequestedOutput] | None
    binary_default: bool
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _as_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value


def decode_request(body: bytes, header_length: int | None) -> InferRequest:
    """Decode an infer request body (``header_length`` from Inference-Header-Content-Length)."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InvalidRequest(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
            )
        header_bytes, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        header_bytes, binary = body, memoryview(b"")
    try:
        header = json.loads(header_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request header is not valid JSON: {exc}") from None
    header = _as_dict(header, "the request")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    offset = 0
    for raw in raw_inputs:
        tensor = _as_dict(raw, "each input")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise InvalidRequest("each input needs a string 'name'")
        if name in inputs:
            raise InvalidInput(f"input {name!r} given twice")
        datatype = tensor.get("datatype")
        if datatype not in DATATYPES:
            raise InvalidInput(
                f"input {name!r}: datatype {datatype!r} is not supported; "
                f"expected one of {sorted(DATATYPES)}"
            )
        dtype = DATATYPES[datatype]
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise InvalidInput(f"input {name!r}: 'shape' must be a list of non-negative integers")
        count = math.prod(shape)  # Python ints: a huge shape cannot overflow to a small count
        params = tensor.get("parameters") or {}
        params = _as_dict(params, f"input {name!r} parameters")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative int")
            if offset + size > len(binary):
                raise InvalidRequest(
                    f"input {name!r}: binary_data_size {size} runs past the end of the body"
                )
            if size != count * dtype.itemsize:
                raise InvalidInput(
                    f"input {name!r}: shape {shape} of {datatype} needs "
                    f"{count * dtype.itemsize} bytes, got {size}"
                )
            array = np.frombuffer(binary[offset : offset + size], dtype=dtype.newbyteorder("<"))
            offset += size
            inputs[name] = array.astype(dtype, copy=False).reshape(shape)
            continue
        data = tensor.get("data")
        if data is None:
            raise InvalidInput(f"input {name!r} has neither 'data' nor binary_data_size")
        try:
            array = np.asarray(data, dtype=dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidInput(f"input {name!r}: data is not {datatype}: {exc}") from None
        if array.size != count:
            raise InvalidInput(
                f"input {name!r}: shape {shape} needs {count} elements, data has {array.size}"
            )
        inputs[name] = array.reshape(shape)
    if offset != len(binary):
        raise InvalidRequest(
            f"{len(binary) - offset} bytes of binary data are not claimed by any input"
        )
    parameters = _as_dict(header.get("parameters") or {}, "'parameters'")
    binary_default = bool(parameters.get("binary_data_output", False))
    outputs: list[RequestedOutput] | None = None
    raw_outputs = header.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidRequest("'outputs' must be a list")
        outputs = []
        for raw in raw_outputs:
            out = _as_dict(raw, "each output")
            name = out.get("name")
            if not isinstance(name, str):
                raise InvalidRequest("each requested output needs a string 'name'")
            out_params = _as_dict(out.get("parameters") or {}, f"output {name!r} parameters")
            binary_out = bool(out_params.get("binary_data", binary_default))
            outputs.append(RequestedOutput(name, binary_out))
    request_id = header.get("id")
    return InferRequest(
        inputs=inputs,
        outputs=outputs,
        binary_default=binary_default,
        id=str(request_id) if request_id is not None else None,
        parameters=parameters,
    )


def encode_response(
    model_name: str,
    outputs: dict[str, np.ndarray[Any, Any]],
    requested: list[RequestedOutput] | None,
    binary_default: bool,
    request_id: str | None = None,
) -> tuple[bytes, int | None]:
    """Encode outputs; returns the body and the JSON header length when binary data follows."""
    wanted = (
        requested
        if requested is not None
        else [RequestedOutput(name, binary_default) for name in outputs]
    )
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for item in wanted:
        array = outputs[item.name]
        entry: dict[str, Any] = {
            "name": item.name,
            "datatype": datatype_of(array.dtype),
            "shape": list(array.shape),
        }
        if item.binary:
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        tensors.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if request_id is not None:
        response["id"] = request_id
    header = json.dumps(response, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
