"""Reading requests over aiohttp the same way in every tidal server: limits, errors, logging.

* :func:`read_body` reads a whole body or raises :class:`BodyError` saying why not: a declared
  ``Content-Length`` over the limit is refused before a byte is read (413), a body that stops
  arriving is answered once the read timeout passes (408), a client that hangs up mid-upload
  is a quiet 499, broken chunking or compression a 400.
* :func:`declared_too_large` is the same 413, for a middleware to apply to every route.
* :func:`parse_json` is ``json.loads`` whose every failure (depth included) is a 400.
* :class:`QuietClientFaults` turns aiohttp's tracebacks for a client's malformed HTTP or a
  reset connection into one DEBUG line (dropped unless DEBUG is on): not the server's fault.
* :class:`JsonErrorRunner` is an ``AppRunner`` whose protocol-level answers (aiohttp's own 400
  for malformed HTTP, sent before any route runs) carry ``{"error": ...}`` like every other;
  its connections call ``request[ON_CLIENT_GONE]`` (when a handler set it) if the client hangs
  up before its answer: a handler that waits (the gateway's hold) learns of it at once, with
  no polling and without cancelling every handler whose client left (aiohttp's
  ``handler_cancellation`` would cancel forwards in flight too).

Each server maps :class:`BodyError` onto its own error type (the runtime's ``ServingError``
tree, the gateway's JSON answers); nothing here knows either of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from tidal.common.body import CLIENT_CLOSED, BodyError, parse_json

__all__ = [
    "CLIENT_CLOSED",
    "ON_CLIENT_GONE",
    "BodyError",
    "JsonErrorRunner",
    "declared_too_large",
    "json_error",
    "parse_json",
    "quiet_logger",
    "read_body",
]


def declared_too_large(request: web.BaseRequest, limit: int) -> BodyError | None:
    """The 413 for a ``Content-Length`` above ``limit`` (checked before reading), else None."""
    length = request.content_length
    if length is not None and length > limit:
        return BodyError(413, f"request body of {length} bytes exceeds maxRequestBytes {limit}")
    return None


async def read_body(request: web.BaseRequest, limit: int, within_s: float) -> bytes:
    """The whole body, or :class:`BodyError` (413, 408, 499 or 400)."""
    refused = declared_too_large(request, limit)
    if refused is not None:
        raise refused
    try:
        if request.content.is_eof():  # already received: no timer needed
            return await request.read()
        async with asyncio.timeout(within_s):
            return await request.read()
    except TimeoutError:
        raise BodyError(408, f"the request body did not arrive within {within_s:g} s") from None
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError too
        raise BodyError(CLIENT_CLOSED, "the client closed the connection mid-upload") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, f"request body exceeds maxRequestBytes {limit}") from None
    except (HttpProcessingError, RequestPayloadError) as exc:  # chunking, compression
        cause = exc.__cause__ if isinstance(exc, RequestPayloadError) else exc
        detail = getattr(cause, "message", None) or str(exc)
        raise BodyError(400, f"malformed request body: {detail}".strip()) from None


CLIENT_FAULTS = (HttpProcessingError, RequestPayloadError, ConnectionResetError)


class QuietClientFaults(logging.Filter):
    """aiohttp logs a client's malformed HTTP (answered 400) or a reset connection as an ERROR
    with a traceback; neither is the server's fault, so each becomes one DEBUG line, dropped
    unless the logger has DEBUG on (the level was checked before this filter ran)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, CLIENT_FAULTS):
            return True
        record.msg, record.args = f"{record.getMessage()}: {exc!r:.200}", None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info = record.exc_text = None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_logger(name: str) -> logging.Logger:
    """The logger to give aiohttp (``handler_args={"logger": ...}``), client faults quieted."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, QuietClientFaults) for f in logger.filters):
        logger.addFilter(QuietClientFaults())
    return logger


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


ON_CLIENT_GONE: web.RequestKey[Callable[[], None]] = web.RequestKey("tidal_on_client_gone")


class _JsonErrorHandler(RequestHandler):
    """aiohttp's protocol handler, answering its own errors (malformed HTTP) in JSON, and
    telling a handler that set ``request[ON_CLIENT_GONE]`` that its client hung up."""

    def connection_lost(self, exc: BaseException | None) -> None:
        request = self._current_request  # the request whose handler runs now, if any
        super().connection_lost(exc)
        on_gone = request.get(ON_CLIENT_GONE) if request is not None else None
        if on_gone is not None:
            on_gone()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs, checks the writer
        if status >= 500:
            text = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        else:
            text = message or (exc and str(exc)) or HTTPStatus(status).phrase
        text = " ".join(str(text).split())  # aiohttp's messages draw carets over lines
        response = json_error(status, f"malformed HTTP request: {text}" if status == 400 else text)
        response.headers.update({k: v for k, v in plain.headers.items() if k == "Allow"})
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer protocol-level errors in JSON too."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state; only the handler factory differs
        return server
