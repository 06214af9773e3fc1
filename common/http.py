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
  for malformed HTTP, sent before any route runs) carry ``{"error": ...}`` like every other,
  whose connections must deliver each request's header block within a time limit (aiohttp has
  no such limit: a client that sends half a header block would hold its connection forever),
  and which call ``request[ON_CLIENT_GONE]`` (when a handler set it) if the client hangs up
  before its answer: a handler that waits (the gateway's hold) learns of it at once, with no
  polling and without cancelling every handler whose client left (aiohttp's
  ``handler_cancellation`` would cancel forwards in flight too).

Each server maps :class:`BodyError` onto its own error type (the runtime's ``ServingError``
tree, the gateway's JSON answers); nothing here knows either of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from .body import CLIENT_CLOSED, BodyError, parse_json

__all__ = [
    "CLIENT_CLOSED",
    "DEFAULT_HEADER_READ_TIMEOUT_S",
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


DEFAULT_HEADER_READ_TIMEOUT_S = 30.0
ON_CLIENT_GONE: web.RequestKey[Callable[[], None]] = web.RequestKey("tidal_on_client_gone")


class _JsonErrorHandler(RequestHandler):
    """aiohttp's protocol handler, answering its own errors (malformed HTTP) in JSON, and
    closing a connection whose request header block does not complete in time, and telling a
    handler that set ``request[ON_CLIENT_GONE]`` that its client hung up.

    The header clock starts when the connection opens (its first request) or, on a kept-alive
    connection, at the first byte of the next request: an idle kept-alive connection is
    aiohttp's ``keepalive_timeout``'s business, not this one's. Body bytes never start it
    (``requestReadTimeoutSeconds`` bounds a body). When it runs out, the client is told 408 in
    JSON if it sent part of a request (once the previous one is answered), and the connection
    is closed. One case is left to ``keepalive_timeout``: the start of a next request that
    arrived in the same read as the end of the previous one's body, then stalled.
    """

    header_read_timeout: float | None = None
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = False  # part of a request's header block has arrived
    _last_payload: Any = None  # the body of the last request whose header block came in

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        completed = self._request_count
        payload = self._last_payload
        after_body = payload is None or payload.is_eof()  # so these bytes start a request
        super().data_received(data)
        if self._request_count != completed:  # a header block (or a malformed one) is in
            self._last_payload = self._messages[-1][1] if self._messages else None
            self._disarm_header_timer()
        elif data and (after_body or self._waiting_for_request()):
            self._header_bytes = True
            if self._header_timer is None:
                self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        self._last_payload = None
        request = self._current_request  # the request whose handler runs now, if any
        super().connection_lost(exc)
        on_gone = request.get(ON_CLIENT_GONE) if request is not None else None
        if on_gone is not None:
            on_gone()

    def _waiting_for_request(self) -> bool:
        """No header block in yet, or between requests (none queued or being handled)."""
        if self._request_count == 0:
            return True
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._messages

    def _arm_header_timer(self, delay: float | None = None) -> None:
        if self.header_read_timeout is not None and self.transport is not None:
            self._header_timer = self._loop.call_later(
                self.header_read_timeout if delay is None else delay,
                self._on_header_timeout,
                self._request_count,
            )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = None
        self._header_bytes = False

    def _on_header_timeout(self, completed: int) -> None:
        self._header_timer = None
        timeout = self.header_read_timeout
        transport = self.transport
        if transport is None or timeout is None or self._request_count != completed:
            return
        if not self._waiting_for_request():  # the previous request is still being answered
            self._arm_header_timer(min(timeout, 1.0))
            return
        if self._header_bytes:  # a client that sent nothing is not sent an answer it never asked
            message = f"the request header did not arrive within {timeout:g} s"
            body = json.dumps({"error": message}).encode()
            transport.write(
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
        self.force_close()

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
    header_read_timeout: float | None = None

    def __call__(self) -> RequestHandler:
        handler = _JsonErrorHandler(self, loop=self._loop, **self._kwargs)
        handler.header_read_timeout = self.header_read_timeout
        return handler


class JsonErrorRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer protocol-level errors in JSON too, and are
    closed when a request's header block takes longer than ``header_read_timeout`` seconds
    (None: no limit)."""

    def __init__(
        self,
        app: web.Application,
        *,
        header_read_timeout: float | None = DEFAULT_HEADER_READ_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.header_read_timeout = header_read_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same state; only the handler factory differs
        assert isinstance(server, _JsonErrorServer)
        server.header_read_timeout = self.header_read_timeout
        server.request_handler = _json_http_errors(server.request_handler)
        return server


def _json_http_errors(
    handle: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """The application's handler, with the HTTP errors aiohttp raises before the middlewares
    run (an ``Expect`` other than ``100-continue``: 417) answered in JSON too."""

    async def handle_in_json(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handle(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            text = " ".join((exc.text or exc.reason or "").split())
            if exc.status == 417:
                text += "; only 'Expect: 100-continue' is supported"
            kept = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
            return json_error(exc.status, text, kept)

    return handle_in_json


_BODY_HEADERS = {"content-type", "content-length", "content-encoding"}
