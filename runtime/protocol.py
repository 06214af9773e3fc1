"""Open Inference Protocol v2 wire format: JSON tensors and the binary tensor extension.

Decoding turns a request body into named numpy arrays plus the list of requested outputs;
encoding turns output arrays into a JSON or binary response body.  No I/O here: the server
hands bodies in and gets bytes out.  Every malformed input raises :class:`InvalidRequest` or
:class:`InvalidInput` with a message saying what was expected.

As strict as Triton's HTTP front end: JSON ``data`` must hold values of the tensor's datatype
(no ``null``, no strings for numbers, no floats for integers, nothing out of the datatype's
range such as ``1e39`` for FP32) laid out either flat or nested exactly as ``shape``;
``binary_data_output`` and ``binary_data`` are booleans, ``id`` a string, ``timeout`` an
unsigned integer (microseconds).  Like Triton, JSON numbers may be ``NaN``/``Infinity``/
``-Infinity`` on the way in, and non-finite outputs are written with those tokens (rapidjson's
``kWriteNanAndInfFlag``, what Triton writes); a client whose JSON parser refuses them asks for
binary outputs.

BYTES tensors are lists of strings in JSON and, in the binary extension, each element is a
4-byte little-endian length followed by that many bytes (Triton's layout); numpy holds them as
an object array of ``bytes``.  BF16 needs ``ml_dtypes`` (numpy has no bfloat16); without it a
BF16 tensor is refused naming the datatype.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common import body as common_body
from ..common.body import BodyError
from .errors import InvalidInput, InvalidRequest, PayloadTooLarge

try:  # bfloat16 for numpy; a dependency of onnx, optional here
    import ml_dtypes

    _BF16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_DIMS = 64  # numpy's limit, and Triton's: more is a client error, not a crash

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
    "BYTES": np.dtype(object),
}
if _BF16 is not None:
    DATATYPES["BF16"] = _BF16
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items()}
_FLOAT_MAX: dict[str, float] = {
    "FP16": float(np.finfo(np.float16).max),
    "FP32": float(np.finfo(np.float32).max),
}
if _BF16 is not None:
    _FLOAT_MAX["BF16"] = float(ml_dtypes.finfo(_BF16).max)  # type: ignore[no-untyped-call]
_LENGTH = struct.Struct("<I")  # the length prefix of each BYTES element


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
    timeout_us: int | None = None  # parameters.timeout (Triton: microseconds; 0 = none)


def parse_json(
    raw: bytes, what: str, max_values: int | None = None, limit_name: str = "maxJsonValues"
) -> Any:
    """``json.loads`` whose every failure is a client error (400), nesting depth included;
    more than ``max_values`` values is a 413 before parsing."""
    try:
        return common_body.parse_json(raw, what, max_values, limit_name)
    except BodyError as error:
        if error.status == 413:
            raise PayloadTooLarge(error.message) from None
        raise InvalidRequest(error.message) from None


def _as_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value


def _parameters(value: Any, what: str) -> dict[str, Any]:
    """A ``parameters`` object: absent or null is empty; ``[]``, ``0``, ``""`` are refused."""
    return {} if value is None else _as_dict(value, what)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool_param(params: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where}: {key!r} must be true or false, got {value!r:.40}")
    return value


def _structure_error(name: str, shape: list[int]) -> InvalidInput:
    return InvalidInput(
        f"input {name!r}: 'data' must be a flat list of the shape's element count or lists "
        f"nested exactly as shape {shape}"
    )


def _json_array(
    name: str, data: Any, datatype: str, dtype: np.dtype[Any], shape: list[int], count: int
) -> np.ndarray[Any, Any]:
    """The tensor ``data`` holds, refusing anything Triton would not take for ``datatype``."""
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: 'data' must be a list")
    if datatype == "BYTES":
        return _json_bytes(name, data, shape, count)
    try:
        array = np.asarray(data)  # numpy infers the JSON values' kind: checked below
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise _structure_error(name, shape) from None
    if array.shape != (count,) and list(array.shape) != shape:
        if array.size != count:
            raise InvalidInput(
                f"input {name!r}: shape {shape} needs {count} elements, data has {array.size}"
            )
        raise _structure_error(name, shape)
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    kind = array.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidInput(f"input {name!r}: BOOL data must be true/false values")
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        if kind not in "iu":
            # Integers that no 64-bit type holds together are still integers, only out of range:
            # past 64 bits numpy keeps Python ints (object), and one past INT64's top beside a
            # negative one (or beside any other) makes it float64.
            if kind in "fO" and all(_is_int(v) for v in np.asarray(data, dtype=object).flat):
                raise InvalidInput(
                    f"input {name!r}: a value is outside {datatype}'s range {info.min}..{info.max}"
                )
            raise InvalidInput(f"input {name!r}: {datatype} data must be integers")
        lo, hi = _extremes(data, array)
        if lo < info.min or hi > info.max:
            raise InvalidInput(
                f"input {name!r}: a value is outside {datatype}'s range {info.min}..{info.max}"
            )
    elif kind not in "iuf":
        raise InvalidInput(f"input {name!r}: {datatype} data must be numbers")
    elif datatype in _FLOAT_MAX and array.dtype != dtype:
        # Narrower floats overflow to inf. Below the datatype's max nothing can, and that is
        # checked cheaply; only other values (or NaN, which hides extremes) take the exact test.
        lo, hi = _extremes(data, array)
        if not -_FLOAT_MAX[datatype] < lo <= hi < _FLOAT_MAX[datatype]:
            with np.errstate(over="ignore", invalid="ignore"):
                converted = array.astype(dtype)
            if np.isfinite(array[np.isinf(converted)]).any():
                raise InvalidInput(f"input {name!r}: a value is outside {datatype}'s range")
            return converted.reshape(shape)
    return array.astype(dtype, copy=False).reshape(shape)


def _extremes(data: list[Any], array: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """(min, max) of numeric data; NaN when a NaN hides them (Python's min/max keep a leading
    NaN, numpy's propagate it), so that callers comparing with them take their exact path."""
    if array.ndim == 1 and len(data) <= 64:  # Python's min/max: cheaper than numpy on few values
        return min(data), max(data)
    return array.min(), array.max()


def _json_bytes(name: str, data: list[Any], shape: list[int], count: int) -> np.ndarray[Any, Any]:
    flat: list[Any] = data
    if not all(isinstance(item, str) for item in data):
        try:  # nested lists: numpy finds the layout (at most MAX_DIMS deep)
            layout = np.asarray(data, dtype=object)
        except (ValueError, TypeError):
            raise _structure_error(name, shape) from None
        if list(layout.shape) != shape:
            raise _structure_error(name, shape)
        flat = layout.ravel().tolist()
        if not all(isinstance(item, str) for item in flat):
            raise InvalidInput(f"input {name!r}: BYTES data must be strings")
    if len(flat) != count:
        raise InvalidInput(
            f"input {name!r}: shape {shape} needs {count} elements, data has {len(flat)}"
        )
    array = np.empty(count, dtype=object)
    array[:] = [item.encode() for item in flat]
    return array.reshape(shape)


def _binary_bytes(name: str, raw: memoryview, shape: list[int], count: int) -> np.ndarray[Any, Any]:
    if count * _LENGTH.size > len(raw):
        raise InvalidInput(
            f"input {name!r}: {count} BYTES elements need at least {count * 4} bytes, got "
            f"{len(raw)}"
        )
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + _LENGTH.size > len(raw):
            raise InvalidInput(f"input {name!r}: BYTES element {len(items)} has no length")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + length > len(raw):
            raise InvalidInput(
                f"input {name!r}: BYTES element {len(items)} of {length} bytes runs past "
                "binary_data_size"
            )
        items.append(bytes(raw[offset : offset + length]))
        offset += length
    if offset != len(raw):
        raise InvalidInput(
            f"input {name!r}: {len(raw) - offset} bytes after the last of {count} BYTES elements"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array.reshape(shape)


def _decode_tensor(
    tensor: dict[str, Any], binary: memoryview, offset: int
) -> tuple[str, np.ndarray[Any, Any], int]:
    name = tensor.get("name")
    if not isinstance(name, str):
        raise InvalidRequest("each input needs a string 'name'")
    datatype = tensor.get("datatype")
    if datatype == "BF16" and _BF16 is None:
        raise InvalidInput(f"input {name!r}: BF16 is not supported by this runtime (no ml_dtypes)")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name!r}: datatype {datatype!r:.40} is not supported; "
            f"expected one of {sorted(DATATYPES)}"
        )
    dtype = DATATYPES[datatype]
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InvalidInput(f"input {name!r}: 'shape' must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"input {name!r}: {len(shape)} dimensions; at most {MAX_DIMS}")
    count = math.prod(shape)  # Python ints: a huge shape cannot overflow to a small count
    params = _parameters(tensor.get("parameters"), f"input {name!r} parameters")
    size = params.get("binary_data_size")
    if size is None:
        if "data" not in tensor:
            raise InvalidInput(f"input {name!r} has neither 'data' nor binary_data_size")
        return name, _json_array(name, tensor["data"], datatype, dtype, shape, count), offset
    if not _is_int(size) or size < 0:
        raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer")
    if "data" in tensor:
        raise InvalidInput(f"input {name!r} has both 'data' and binary_data_size")
    if offset + size > len(binary):
        raise InvalidRequest(
            f"input {name!r}: binary_data_size {size} runs past the end of the body"
        )
    raw = binary[offset : offset + size]
    if datatype == "BYTES":
        return name, _binary_bytes(name, raw, shape, count), offset + size
    if size != count * dtype.itemsize:
        raise InvalidInput(
            f"input {name!r}: shape {shape} of {datatype} needs "
            f"{count * dtype.itemsize} bytes, got {size}"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<"))
    return name, array.astype(dtype, copy=False).reshape(shape), offset + size


def decode_request(
    body: bytes, header_length: int | None, max_values: int = common_body.DEFAULT_MAX_JSON_VALUES
) -> InferRequest:
    """Decode an infer request body (``header_length`` from Inference-Header-Content-Length);
    a JSON header of more than ``max_values`` values is a 413 before it is parsed."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InvalidRequest(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
            )
        header_bytes, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        header_bytes, binary = body, memoryview(b"")
    header = _as_dict(parse_json(header_bytes, "the request header", max_values), "the request")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray[Any, Any]] = {}
    offset = 0
    for raw in raw_inputs:
        name, array, offset = _decode_tensor(_as_dict(raw, "each input"), binary, offset)
        if name in inputs:
            raise InvalidInput(f"input {name!r} given twice")
        inputs[name] = array
    if offset != len(binary):
        raise InvalidRequest(
            f"{len(binary) - offset} bytes of binary data are not claimed by any input"
        )
    parameters = _parameters(header.get("parameters"), "'parameters'")
    binary_default = _bool_param(parameters, "binary_data_output", False, "parameters")
    timeout_us = parameters.get("timeout")
    if timeout_us is not None and (not _is_int(timeout_us) or timeout_us < 0):
        raise InvalidRequest(
            "parameters: 'timeout' must be a non-negative integer (microseconds), "
            f"got {timeout_us!r:.40}"
        )
    outputs = _requested_outputs(header.get("outputs"), binary_default)
    request_id = header.get("id")
    if "id" in header and not isinstance(request_id, str):  # the protocol's id is a string
        raise InvalidRequest(f"'id' must be a string, got {request_id!r:.40}")
    return InferRequest(
        inputs=inputs,
        outputs=outputs,
        binary_default=binary_default,
        id=request_id,
        parameters=parameters,
        timeout_us=timeout_us or None,
    )


def _requested_outputs(raw_outputs: Any, binary_default: bool) -> list[RequestedOutput] | None:
    """A request's ``outputs`` (None: every output), each binary or not as asked."""
    if raw_outputs is None:
        return None
    if not isinstance(raw_outputs, list):
        raise InvalidRequest("'outputs' must be a list")
    outputs = []
    for raw in raw_outputs:
        out = _as_dict(raw, "each output")
        out_name = out.get("name")
        if not isinstance(out_name, str):
            raise InvalidRequest("each requested output needs a string 'name'")
        out_params = _parameters(out.get("parameters"), f"output {out_name!r} parameters")
        if "classification" in out_params:
            raise InvalidRequest(
                f"output {out_name!r}: the classification extension is not supported"
            )
        where = f"output {out_name!r}"
        binary_out = _bool_param(out_params, "binary_data", binary_default, where)
        outputs.append(RequestedOutput(out_name, binary_out))
    return outputs


def _bytes_payload(array: np.ndarray[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for item in array.ravel():
        data = item if isinstance(item, bytes) else str(item).encode()
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _bytes_json(name: str, array: np.ndarray[Any, Any]) -> list[str]:
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in array.ravel()]
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"output {name!r} holds bytes that are not UTF-8: ask for it in binary "
            "(binary_data: true)"
        ) from None


def _finite_or_string(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def encode_response(
    model_name: str,
    outputs: dict[str, np.ndarray[Any, Any]],
    requested: list[RequestedOutput] | None,
    binary_default: bool,
    request_id: str | None = None,
    model_version: str = "1",
    non_finite: str = "tokens",
) -> tuple[bytes, int | None]:
    """Encode outputs; returns the body and the JSON header length when binary data follows.

    ``non_finite``: ``tokens`` writes NaN/Infinity/-Infinity as bare tokens (Triton's
    rapidjson does; not strict JSON), ``strings`` as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (strict JSON; the OIP schema allows strings in tensor data)."""
    wanted = (
        requested
        if requested  # none named (absent or []): every output, as over gRPC
        else [RequestedOutput(name, binary_default) for name in outputs]
    )
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for item in wanted:
        array = outputs[item.name]
        datatype = datatype_of(array.dtype)
        entry: dict[str, Any] = {
            "name": item.name,
            "datatype": datatype,
            "shape": list(array.shape),
        }
        if item.binary:
            if datatype == "BYTES":
                raw = _bytes_payload(array)
            else:
                raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            entry["data"] = _bytes_json(item.name, array)
        elif datatype == "BF16":
            entry["data"] = array.astype(np.float32).ravel().tolist()
        else:
            entry["data"] = array.ravel().tolist()
        strict = non_finite == "strings" and "data" in entry and array.dtype.kind == "f"
        if strict and not np.isfinite(array).all():
            entry["data"] = [_finite_or_string(v) for v in entry["data"]]
        tensors.append(entry)
    response: dict[str, Any] = {
        "model_name": model_name,
        "model_version": model_version,
        "outputs": tensors,
    }
    if request_id is not None:
        response["id"] = request_id
    header = json.dumps(response, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
