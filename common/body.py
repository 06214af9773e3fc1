"""Request bodies as plain data (no I/O, no HTTP library): the error a client is told, JSON.

Imported by :mod:`tidal.common.http` and by the runtime's sans-IO protocol module alike.

A JSON body's cost is not its size: 64 MiB of ``[[],[],…]`` is 22 million lists (1.5 GiB of
Python objects, ~20 s of ``json.loads`` holding the interpreter), and 64 KB of gzip inflates
to it. :func:`check_json_values` bounds what a parse builds before it starts: every value
(number, string, list, object, ``true``…) counts one and an empty list or object two (they
cost the most), at most ``maxJsonValues`` in all; the count is three ``bytes.count`` passes
(commas and opening brackets), done again with string contents left out only for a body over
the limit by the first count. Nesting is bounded by ``json.loads``
itself (a :class:`RecursionError` within microseconds, answered as a 400).
"""

from __future__ import annotations

import json
import re
from typing import Any

CLIENT_CLOSED = 499  # nginx's code for a client that went away; nobody receives it
# Every value of a JSON text counts one; 4 Mi values cost at most ~300 MiB of Python objects
# (empty objects, the dearest) and a float tensor of 4 Mi elements is 16 MiB in binary.
DEFAULT_MAX_JSON_VALUES = 4 * 2**20
# The control routes' bodies (repository, placement, tier, the gateway's replica list) are
# small objects: parsed in place, within this many values (a parse of at most ~0.5 s).
CONTROL_JSON_VALUES = 2**20
CONTROL_LIMIT = "the control routes' limit"  # what a refusal names
# A JSON text above this many bytes is parsed away from the event loop (tidal.common.offload).
OFFLOAD_BYTES = 2**20

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class BodyError(Exception):
    """A request the server cannot read, with the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple[type[BodyError], tuple[int, str]]:
        return (BodyError, (self.status, self.message))  # raised in a worker process too


def json_values_at_most(raw: bytes) -> int:
    """:func:`json_values`, or more when strings hold commas or brackets."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def json_values(raw: bytes) -> int:
    """The values of the JSON text ``raw``, an empty list or object counting two: its commas
    and opening brackets outside strings, plus one."""
    return json_values_at_most(_STRING.sub(b'""', raw))


def check_json_values(raw: bytes, what: str, limit: int, limit_name: str = "maxJsonValues") -> None:
    """:class:`BodyError` 413 when ``raw`` holds more than ``limit`` JSON values (the
    message names ``limit_name``)."""
    if json_values_at_most(raw) <= limit:
        return
    count = json_values(raw)
    if count > limit:
        advice = ""
        if limit_name == "maxJsonValues":  # an infer request's header
            advice = "; send large tensors in binary (Inference-Header-Content-Length)"
        raise BodyError(
            413,
            f"{what} holds {count} JSON values (an empty list or object counts two), more than "
            f"{limit_name} ({limit}){advice}",
        )


def parse_json(
    raw: bytes, what: str, max_values: int | None = None, limit_name: str = "maxJsonValues"
) -> Any:
    """``json.loads`` whose every failure is a :class:`BodyError` 400, nesting depth included;
    with ``max_values``, a text of more values is a 413 before it is parsed."""
    if max_values is not None:
        check_json_values(raw, what, max_values, limit_name)
    try:
        return json.loads(raw)
    except RecursionError:
        raise BodyError(400, f"{what} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"{what} is not valid JSON: {exc}") from None
