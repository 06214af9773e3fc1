"""A lean HTTP/1.1 client for the gateway's hot path: keep-alive connections to one replica.

Why not :class:`aiohttp.ClientSession` for forwards: measured here, a forward through it cost the
gateway ~350 µs of CPU per request (request/response objects, timers, tracing hooks, header
multidicts), more than the runtime spends serving a small model.  Forwarding needs far less: write
a request line, a few headers and the body bytes on a warm connection; read a status line, a few
headers and ``Content-Length`` bytes (or a chunked body) back.  That is all this module does, on
:class:`asyncio.Protocol` connections pooled per replica (LIFO, so the warmest is reused).

Errors: :class:`UpstreamError` with ``kind`` ``"connect"`` (no connection could be made) or
``"disconnect"`` (the connection broke or the answer was not HTTP) — both before any answer was
handed back, so the caller may retry elsewhere.  The caller bounds a request with
``asyncio.timeout``; a cancelled request closes its connection (a late answer must never be read
as the next request's).
Control traffic (long-polls, loads) still uses aiohttp's client.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

# Response headers handed back to the client, by lower-case name -> the name sent on.
PASSED_BACK = {
    "content-type": "Content-Type",
    "inference-header-content-length": "Inference-Header-Content-Length",
    "content-encoding": "Content-Encoding",
    "retry-after": "Retry-After",
}
MAX_HEAD_BYTES = 64 * 1024
IDLE_LIMIT_S = 15.0  # an idle connection older than this is closed, not reused


class UpstreamError(Exception):
    """No answer came back: ``kind`` is ``connect`` or ``disconnect``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[Answer] | None = None
        self._buffer = bytearray()
        self.answered = False  # a byte of the current request's answer has arrived
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._length = -1  # -1: not known yet; -2: chunked; -3: until the connection closes
        self._body_at = -1
        self._keep_alive = True

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not isinstance-checked: uvloop's transports do not derive from asyncio.Transport.
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a broken or confused peer
            self.close()
            return
        self.answered = True
        self._buffer += data
        try:
            answer = self._parse()
        except ValueError as exc:
            self._fail(UpstreamError("disconnect", f"not an HTTP answer: {exc}"))
            self.close()
            return
        if answer is not None:
            waiter, self._waiter = self._waiter, None
            if not self._keep_alive:
                self.close()
            if not waiter.done():
                waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None:
            return
        if self._length == -3 and self._body_at >= 0:  # the body ends with the connection
            waiter, self._waiter = self._waiter, None
            if not waiter.done():
                body = bytes(self._buffer[self._body_at :])
                waiter.set_result(Answer(self._status, self._headers, body))
            return
        reason = f"{type(exc).__name__}: {exc}" if exc else "closed by the replica"
        self._fail(UpstreamError("disconnect", f"connection lost before the answer ({reason})"))

    # -- requests -----------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._waiter = self.loop.create_future()
        self._buffer.clear()
        self.answered = False
        self._reset()
        if body:
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _parse(self) -> Answer | None:
        buffer = self._buffer
        if self._body_at < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise ValueError("response head larger than 64 KiB")
                return None
            lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(f"status line {lines[0][:80]!r}")
            self._status = int(rest[:3])
            self._keep_alive = version != "HTTP/1.0"
            headers = self._headers
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                value = value.strip()
                if name == "content-length":
                    self._length = int(value)
                elif name == "transfer-encoding" and "chunked" in value.lower():
                    self._length = -2
                elif name == "connection":
                    self._keep_alive = value.lower() != "close"
                else:
                    passed = PASSED_BACK.get(name)
                    if passed is not None:
                        headers[passed] = value
            if self._length == -1:
                no_body = self._status in (204, 304) or 100 <= self._status < 200
                self._length = 0 if no_body else -3
                if self._length == -3:
                    self._keep_alive = False
            self._body_at = end + 4
        start = self._body_at
        if self._length >= 0:
            if len(buffer) - start < self._length:
                return None
            return Answer(self._status, self._headers, bytes(buffer[start : start + self._length]))
        if self._length == -2:
            body = _dechunk(buffer, start)
            return None if body is None else Answer(self._status, self._headers, body)
        return None  # until the connection closes


def _dechunk(buffer: bytearray, start: int) -> bytes | None:
    """The body of a complete chunked message from ``start``, or None while incomplete."""
    parts: list[bytes] = []
    at = start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(buffer[at:line_end]).split(b";", 1)[0].strip() or b"0", 16)
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)
            return None if trailer_end < 0 else b"".join(parts)
        if len(buffer) < at + size + 2:
            return None
        parts.append(bytes(buffer[at : at + size]))
        at += size + 2


class UpstreamPool:
    """Keep-alive connections to one replica, at most ``max_connections`` in use at once."""

    def __init__(self, url: str, max_connections: int) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "localhost"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self._host_header = f"Host: {parts.netloc}\r\n".encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: Iterable[tuple[str, str]],
    ) -> Answer:
        """Send one request and read its answer (callers bound it with ``asyncio.timeout``)."""
        head = bytearray(f"{method} {path} HTTP/1.1\r\n".encode("latin-1"))
        head += self._host_header
        for name, value in headers:
            head += f"{name}: {value}\r\n".encode("latin-1")
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        async with self._slots:
            connection, reused = await self._connection()
            try:
                answer = await connection.send(bytes(head), body)
            except UpstreamError as exc:
                connection.close()
                if not (reused and exc.kind == "disconnect" and not connection.answered):
                    raise
                # A kept-alive connection the replica closed as this request went out (its idle
                # timeout, or a close after an answer whose body it did not read): nothing of
                # an answer came back, so the request is sent once more on a new connection,
                # as HTTP clients do for a stale pooled connection; a replica that is really
                # gone fails the new connection too.
                connection, _ = await self._connection(fresh=True)
                try:
                    answer = await connection.send(bytes(head), body)
                except BaseException:
                    connection.close()
                    raise
            except BaseException:
                connection.close()  # a late answer must not be read as the next one's
                raise
            if not connection.closed:
                connection.idle_since = connection.loop.time()
                self._idle.append(connection)
            return answer

    async def _connection(self, fresh: bool = False) -> tuple[_Connection, bool]:
        """A connection and whether it was reused (kept alive from an earlier request)."""
        loop = asyncio.get_running_loop()
        idle = self._idle
        while idle and not fresh:
            connection = idle.pop()
            if not connection.closed and loop.time() - connection.idle_since < IDLE_LIMIT_S:
                return connection, True
            connection.close()
        try:
            _, protocol = await loop.create_connection(
                lambda: _Connection(loop), self.host, self.port, ssl=self.tls or None
            )
        except OSError as exc:
            raise UpstreamError("connect", f"cannot connect: {exc}") from exc
        return protocol, False

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
