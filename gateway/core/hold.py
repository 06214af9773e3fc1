"""What the hold decides, as plain data: which requests may be held, for how long, within which
bounds, and when a client that is not served now should come back.

A request is held only while no replica can take it (a service at zero, a cold model), so what
it costs is paid by held requests alone: the forwarded hot path never comes here.

* :func:`check_held_request`: a request no model could serve (empty body, bad JSON, non-UTF-8,
  no ``inputs`` list, a bad ``Inference-Header-Content-Length``, a ``timeout`` that is not a
  non-negative integer) is refused with a 400 at once: it must neither wait for a replica that
  would refuse it anyway nor count as demand that wakes one.  The tensors themselves (shape,
  datatype, data) are the replica's to judge against its model.
* :func:`decoded_body`: a ``gzip``/``deflate`` body is judged as the replica will read it,
  decompressed within ``maxRequestBytes`` (a bomb is a 413, a broken stream a 400); an encoding
  the gateway cannot decode (``br``, ``zstd``, several) is held unjudged: the replica decides.
* :func:`judge_held_request`: both, as one call a worker process can make
  (:class:`tidal.common.offload.Offload`): a large or compressed body is judged there, so that
  its parse never stalls the gateway's event loop; a JSON header of more than ``maxJsonValues``
  values is a 413 before it is parsed (64 KB of gzip can inflate to 22 million empty lists).
* :func:`hold_seconds`: ``holdTimeoutSeconds`` or the request's own ``timeout`` (µs) when
  smaller, for any integer a client may send.
* :func:`admit`: at most ``maxHeldRequests`` requests and ``maxHeldBytes`` body bytes held.
* :func:`retry_after`: the ``Retry-After`` of a 503 on the hold path, from when a replica is
  expected to be routable and, for a full hold, when room is expected.

No clock, no I/O: the shell passes the time in.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from ...common.body import DEFAULT_MAX_JSON_VALUES, BodyError, parse_json

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_RETRY_AFTER_S = 30  # a client told more would rather give up; a wake rarely takes longer


@dataclass(frozen=True)
class HeldRequest:
    """What the hold needs from a request it may hold: its own deadline, if it set one."""

    timeout_us: int | None


def check_held_request(
    body: bytes, header_length: str | None, max_values: int = DEFAULT_MAX_JSON_VALUES
) -> HeldRequest:
    """The request's hold parameters, or :class:`BodyError` 400 saying what no model accepts
    (413 for a JSON header of more than ``max_values`` values)."""
    if not body:
        raise BodyError(400, "the request body is empty; an infer request is a JSON object")
    header = body
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise BodyError(400, f"{HEADER_LENGTH} must be an integer") from None
        if not 0 < length <= len(body):
            raise BodyError(400, f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes")
        header = body[:length]
    request = parse_json(header, "the request header", max_values)
    if not isinstance(request, dict):
        raise BodyError(400, "the request must be a JSON object")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BodyError(400, "'inputs' must be a non-empty list of tensors")
    if not all(isinstance(tensor, dict) for tensor in inputs):
        raise BodyError(400, "each input must be a JSON object")
    parameters: Any = request.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BodyError(400, "'parameters' must be a JSON object")
    timeout_us = parameters.get("timeout")
    if timeout_us is not None and (
        isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us < 0
    ):
        raise BodyError(
            400,
            "parameters: 'timeout' must be a non-negative integer (microseconds), "
            f"got {timeout_us!r:.40}",
        )
    return HeldRequest(timeout_us=timeout_us)


def decoded_body(body: bytes, encoding: str | None, max_bytes: int) -> bytes | None:
    """The body as the replica will read it, or None when the gateway cannot tell (an
    encoding it does not decode: the request is held unjudged).  An encoding the replica does
    not decode either reaches it as is, so it is judged as is, like no encoding."""
    name = (encoding or "").strip().lower()
    if name in ("br", "zstd") or "," in name:
        return None
    if name not in ("gzip", "x-gzip", "deflate"):
        return body
    # gzip: its own header; deflate: a zlib stream, or a raw one from a lenient client.
    modes = (16 + zlib.MAX_WBITS,) if name != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for mode in modes:
        inflater = zlib.decompressobj(mode)
        try:
            data = inflater.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            if mode == modes[-1]:
                raise BodyError(400, f"malformed request body: {name}: {exc}") from None
            continue
        if len(data) > max_bytes or inflater.unconsumed_tail:
            raise BodyError(413, f"request body exceeds maxRequestBytes {max_bytes} once decoded")
        if not inflater.eof:
            raise BodyError(400, f"malformed request body: the {name} stream is cut short")
        return data
    return None  # (unreachable: the last mode returns or raises)


def judge_held_request(
    body: bytes,
    encoding: str | None,
    header_length: str | None,
    max_bytes: int,
    max_values: int = DEFAULT_MAX_JSON_VALUES,
) -> int | None:
    """The request's own timeout (µs) or None, or :class:`BodyError` for what no model
    serves: :func:`decoded_body` then :func:`check_held_request` (nothing to judge when the
    gateway cannot decode the body: the replica judges)."""
    decoded = decoded_body(body, encoding, max_bytes)
    if decoded is None:
        return None
    return check_held_request(decoded, header_length, max_values).timeout_us


def hold_seconds(hold_timeout_s: float, timeout_us: int | None) -> float:
    """How long to hold: ``hold_timeout_s``, or ``timeout_us`` when given (> 0) and smaller.

    The comparison is exact whatever the integer (``1`` followed by 400 zeros is no overflow):
    only a timeout below the hold is ever divided.
    """
    if timeout_us is None or timeout_us <= 0 or timeout_us >= hold_timeout_s * 1e6:
        return hold_timeout_s
    return timeout_us / 1e6


@dataclass(frozen=True)
class HoldLimits:
    max_requests: int
    max_bytes: int


def admit(held_requests: int, held_bytes: int, size: int, limits: HoldLimits) -> str | None:
    """None when one more request of ``size`` body bytes may be held, else why not."""
    if held_requests >= limits.max_requests:
        return f"{limits.max_requests} requests are held already (maxHeldRequests)"
    if size > limits.max_bytes:
        return f"its body of {size} bytes is larger than maxHeldBytes ({limits.max_bytes})"
    if held_bytes + size > limits.max_bytes:
        return (
            f"held bodies take {held_bytes} of maxHeldBytes ({limits.max_bytes}); this one "
            f"needs {size}"
        )
    return None


def retry_after(
    now: float,
    *,
    expected_wake_s: float | None,
    waiting_since: float | None,
    room_at: float | None = None,
) -> int:
    """Seconds a client should wait before it tries again (1 to ``MAX_RETRY_AFTER_S``).

    ``waiting_since``: when the oldest request still waiting for this model was held (the
    age of the hold); ``expected_wake_s``: how long a wake (or a load) took when last measured.
    A replica is expected ``expected_wake_s`` after the hold began; once that has passed (or
    nothing was measured), the wait so far is the best guess of the wait to come, so a client
    backs off as long as it has been waiting (a service down for 20 s is told 20 s, not 1 s:
    no retry storm against it).  ``room_at``: for a full hold, when its oldest request leaves
    at the latest (its deadline): a retry is worth it by then.
    """
    age = max(now - waiting_since, 0.0) if waiting_since is not None else 0.0
    expected = expected_wake_s if expected_wake_s is not None else 0.0
    eta = expected - age if expected > age else age
    if room_at is not None:
        eta = min(eta, max(room_at - now, 0.0))
    if not math.isfinite(eta):
        return MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(eta)))
