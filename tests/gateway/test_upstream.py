"""The gateway's keep-alive client (gateway/upstream.py) against real sockets: a pooled
connection that the replica closed as a request went out is not a dead replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tidal.gateway.upstream import UpstreamError, UpstreamPool

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return head + await reader.readexactly(length)


async def serve(handler: Handler) -> tuple[asyncio.Server, int, list[int]]:
    """A server whose ``handler(reader, writer, n)`` gets each connection's number ``n``."""
    connections: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer, connections[-1])
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


async def test_a_stale_pooled_connection_is_replaced_and_the_request_answered() -> None:
    """The first connection answers one request, then the replica closes it when the next
    request arrives, unanswered (as a server does whose keep-alive timer fired): the request is
    answered on a new connection instead of failing (which the gateway took for a dead replica
    and answered 503: tests/runtime/test_fuzz_http.py failed about 1 run in 6)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)
        if n == 0:
            return  # the second request on the first connection: closed unanswered
        writer.write(OK)
        await writer.drain()

    server, port, connections = await serve(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{port}", max_connections=4)
    try:
        first = await pool.request("POST", "/a", b"{}", [])
        second = await pool.request("POST", "/b", b"{}", [])
    finally:
        pool.close()
        server.close()
    assert (first.status, first.body) == (200, b"ok")
    assert (second.status, second.body) == (200, b"ok")
    assert len(connections) == 2, connections


async def test_a_replica_that_answers_nothing_still_fails_once_retried() -> None:
    """A replica that closes every connection unanswered: the request fails (``disconnect``)
    after one new connection, not in a loop."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        if n == 0:
            writer.write(OK)  # the first request is answered, so its connection is pooled
            await writer.drain()
            await read_request(reader)

    server, port, connections = await serve(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{port}", max_connections=4)
    try:
        assert (await pool.request("GET", "/", b"", [])).status == 200
        with pytest.raises(UpstreamError) as error:
            await pool.request("GET", "/", b"", [])
    finally:
        pool.close()
        server.close()
    assert error.value.kind == "disconnect"
    assert len(connections) == 2, connections  # the pooled one, then exactly one new one


async def test_a_new_connection_that_breaks_is_not_retried() -> None:
    """Only a reused connection is retried: on a fresh one the replica saw the request."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    server, port, connections = await serve(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{port}", max_connections=4)
    try:
        with pytest.raises(UpstreamError, match="connection lost before the answer"):
            await pool.request("POST", "/", b"{}", [])
    finally:
        pool.close()
        server.close()
    assert len(connections) == 1, connections


async def test_a_partial_answer_is_not_sent_again() -> None:
    """Bytes of an answer arrived, then the connection broke: the replica acted on the
    request, so it is not sent a second time."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart")
        await writer.drain()

    server, port, connections = await serve(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{port}", max_connections=4)
    try:
        assert (await pool.request("GET", "/", b"", [])).status == 200
        with pytest.raises(UpstreamError, match="connection lost before the answer"):
            await pool.request("GET", "/", b"", [])
    finally:
        pool.close()
        server.close()
    assert len(connections) == 1, connections
