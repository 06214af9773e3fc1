"""The hold's decisions as plain data (``tidal.gateway.core.hold``): which requests may be held,
for how long, within which bounds, and the ``Retry-After`` of a 503 on the hold path."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.common.body import BodyError
from tidal.gateway.core.hold import (
    MAX_RETRY_AFTER_S,
    HoldLimits,
    admit,
    check_held_request,
    decoded_body,
    hold_seconds,
    retry_after,
)

VALID = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": [0.5]}]}


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("body", "length", "says"),
    [
        (b"", None, "empty"),
        (b"{not json", None, "not valid JSON"),
        (b'{"inputs": "\xff\xfe"}', None, "not valid JSON"),  # not UTF-8
        (b"[" * 1000 + b"]" * 1000, None, "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
        (_json([VALID]), None, "must be a JSON object"),
        (_json({"inputs": []}), None, "'inputs' must be a non-empty list"),
        (_json({"outputs": []}), None, "'inputs' must be a non-empty list"),
        (_json({"inputs": [3]}), None, "each input must be a JSON object"),
        (_json({**VALID, "parameters": [1]}), None, "'parameters' must be a JSON object"),
        (_json({**VALID, "parameters": {"timeout": -1}}), None, "'timeout'"),
        (_json({**VALID, "parameters": {"timeout": 1.5}}), None, "'timeout'"),
        (_json({**VALID, "parameters": {"timeout": "10"}}), None, "'timeout'"),
        (_json({**VALID, "parameters": {"timeout": True}}), None, "'timeout'"),
        (_json(VALID), "x", "must be an integer"),
        (_json(VALID), "0", "but the body has"),
        (_json(VALID), "-3", "but the body has"),
        (_json(VALID), str(10**30), "but the body has"),
        (_json(VALID) + b"\x00" * 4, "5", "not valid JSON"),  # a header cut short
    ],
)
def test_a_request_no_model_could_serve_is_a_400_naming_why(
    body: bytes, length: str | None, says: str
) -> None:
    with pytest.raises(BodyError) as refused:
        check_held_request(body, length)
    assert refused.value.status == 400 and says in refused.value.message, refused.value.message


@pytest.mark.parametrize(
    ("body", "length", "timeout_us"),
    [
        (_json(VALID), None, None),
        (_json({**VALID, "parameters": {"timeout": 0}}), None, 0),
        (_json({**VALID, "parameters": {"timeout": 250_000}}), None, 250_000),
        (b'{"inputs": [{}], "parameters": {"timeout": 1' + b"0" * 400 + b"}}", None, 10**400),
        (_json(VALID) + b"\x01\x02\x03\x04", str(len(_json(VALID))), None),  # binary tensors
    ],
)
def test_a_request_the_hold_may_keep_gives_its_own_timeout(
    body: bytes, length: str | None, timeout_us: int | None
) -> None:
    assert check_held_request(body, length).timeout_us == timeout_us


@pytest.mark.parametrize(
    ("timeout_us", "seconds"),
    [
        (None, 120.0),
        (0, 120.0),  # no timeout given
        (250_000, 0.25),
        (120_000_000, 120.0),
        (10**400, 120.0),  # no OverflowError: compared, never divided
        (2**1024, 120.0),
    ],
)
def test_the_hold_lasts_the_hold_timeout_or_the_requests_own_when_smaller(
    timeout_us: int | None, seconds: float
) -> None:
    assert hold_seconds(120.0, timeout_us) == seconds


def test_the_hold_admits_within_its_count_and_its_bytes() -> None:
    limits = HoldLimits(max_requests=3, max_bytes=1000)
    assert admit(0, 0, 1000, limits) is None
    assert admit(2, 600, 400, limits) is None
    assert "maxHeldRequests" in (admit(3, 0, 1, limits) or "")
    assert "maxHeldBytes" in (admit(1, 600, 401, limits) or "")
    assert "larger than maxHeldBytes" in (admit(0, 0, 1001, limits) or "")


@pytest.mark.parametrize(
    ("expected", "since", "room", "seconds", "why"),
    [
        (None, None, None, 1, "nothing known, nothing waiting: soon"),
        (10.0, None, None, 10, "a wake takes 10 s"),
        (10.0, 96.0, None, 6, "a wake takes 10 s and began 4 s ago"),
        (None, 80.0, None, 20, "waiting for 20 s with nothing measured: back off 20 s"),
        (10.0, 60.0, None, 30, "40 s late: back off, at most 30 s"),
        (10.0, 99.0, 103.5, 4, "full: room when the oldest leaves, before the wake"),
        (10.0, 99.0, 99.0, 1, "full, room now: at least 1 s"),
    ],
)
def test_retry_after_comes_from_the_expected_wake_and_the_age_of_the_hold(
    expected: float | None, since: float | None, room: float | None, seconds: int, why: str
) -> None:
    assert (
        retry_after(100.0, expected_wake_s=expected, waiting_since=since, room_at=room) == seconds
    ), why


@given(
    now=st.floats(0, 1e9),
    expected=st.none() | st.floats(min_value=0, allow_nan=False),
    since=st.none() | st.floats(0, 1e9),
    room=st.none() | st.floats(0, 1e12),
)
def test_retry_after_is_always_between_1_and_the_cap(
    now: float, expected: float | None, since: float | None, room: float | None
) -> None:
    seconds = retry_after(now, expected_wake_s=expected, waiting_since=since, room_at=room)
    assert 1 <= seconds <= MAX_RETRY_AFTER_S


def test_an_encoded_body_is_judged_as_the_replica_reads_it() -> None:
    import gzip
    import zlib

    body = _json(VALID)
    assert decoded_body(body, None, 10**6) == body
    assert decoded_body(gzip.compress(body), "gzip", 10**6) == body
    assert decoded_body(zlib.compress(body), "deflate", 10**6) == body
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decoded_body(raw.compress(body) + raw.flush(), "Deflate", 10**6) == body
    assert decoded_body(body, "br", 10**6) is None  # not decoded here: the replica judges
    assert decoded_body(body, "gzip, br", 10**6) is None
    assert decoded_body(body, "zz", 10**6) == body  # the replica reads it as is, so do we
    with pytest.raises(BodyError) as bomb:
        decoded_body(gzip.compress(b"0" * 10**6), "gzip", 1000)
    assert bomb.value.status == 413
    for broken in (gzip.compress(body)[:20], b"not gzip"):
        with pytest.raises(BodyError) as refused:
            decoded_body(broken, "gzip", 10**6)
        assert refused.value.status == 400, refused.value.message
