"""Request bodies as plain data (no I/O, no HTTP library): the error a client is told, JSON.

Imported by :mod:`tidal.common.http` and by the runtime's sans-IO protocol module alike.
"""

from __future__ import annotations

import json
from typing import Any

CLIENT_CLOSED = 499  # nginx's code for a client that went away; nobody receives it


class BodyError(Exception):
    """A request the server cannot read, with the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_json(raw: bytes, what: str) -> Any:
    """``json.loads`` whose every failure is a :class:`BodyError` 400, nesting depth included."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise BodyError(400, f"{what} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(400, f"{what} is not valid JSON: {exc}") from None
