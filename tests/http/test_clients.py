"""Both upstream clients against scripted real servers: framing, reuse, failures, timeouts.

Each server is a real asyncio TCP server answering with scripted bytes, so the tests exercise the
clients' sockets and parsers, not a fake transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.config import Timeouts
from gateway.http.base import UpstreamClient, make_upstream
from gateway.http.errors import (
    UpstreamConnectError,
    UpstreamFirstByteTimeout,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
)
from tests.ports import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        port = free_port()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


@pytest.fixture(params=["native", "aiohttp"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[UpstreamClient]:
    c = make_upstream(request.param, Timeouts(connect=1, first_token=0.5, idle=0.3, total=5), 8)
    await c.start()
    yield c
    await c.close()


async def test_keepalive_reuses_one_connection(client: UpstreamClient) -> None:
    """Sequential requests share one kept-alive connection; the request is framed correctly."""
    server = Server(lambda r, w: _loop_answers(server, r, w))
    async with server as url:
        for _ in range(5):
            resp = await client.post(url, b'{"a":1}', [(b"x-test", b"1")])
            assert resp.status == 200 and await resp.read() == b"{}"
            resp.close()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"x-test: 1\r\n" in first.lower() and first.endswith(b'{"a":1}')


async def _loop_answers(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while True:
        server.requests.append(await _read_request(r))
        w.write(OK)
        await w.drain()


async def test_chunked_stream_relayed_as_it_arrives(client: UpstreamClient) -> None:
    """A chunked event stream yields each part when the server sends it."""
    gate = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        w.write(b"7\r\ndata: 1\r\n")
        await w.drain()
        await gate.wait()
        w.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await w.drain()

    async with Server(handler) as url:
        resp = await client.post(url, b"{}", [])
        assert resp.is_event_stream and resp.is_stream
        it = resp.chunks().__aiter__()
        assert await asyncio.wait_for(it.__anext__(), 1) == b"data: 1"
        gate.set()
        rest = [c async for c in it]
        assert b"".join(rest) == b"data: 2"
        resp.close()


async def test_stale_keepalive_connection_retried(client: UpstreamClient) -> None:
    """The backend closes an idle kept-alive connection; the next request still succeeds."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(OK)
        await w.drain()
        # then close without 'connection: close': the client keeps it as idle

    async with Server(handler) as url:
        for _ in range(3):
            resp = await client.post(url, b"{}", [])
            assert await resp.read() == b"{}"
            resp.close()
            await asyncio.sleep(0.05)


async def test_connect_refused(client: UpstreamClient) -> None:
    with pytest.raises(UpstreamConnectError):
        await client.post(f"http://127.0.0.1:{free_port()}/v1/x", b"{}", [])


async def test_first_token_timeout(client: UpstreamClient) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        await asyncio.sleep(2)

    async with Server(handler) as url:
        with pytest.raises(UpstreamFirstByteTimeout):
            await client.post(url, b"{}", [])


async def test_idle_timeout_mid_stream(client: UpstreamClient) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
        await w.drain()
        await asyncio.sleep(2)

    async with Server(handler) as url:
        resp = await client.post(url, b"{}", [])
        with pytest.raises(UpstreamIdleTimeout):
            async for _ in resp.chunks():
                pass
        resp.close()


async def test_backend_dies_mid_response(client: UpstreamClient) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
        await w.drain()
        w.transport.abort()

    async with Server(handler) as url:
        resp = await client.post(url, b"{}", [])
        with pytest.raises(UpstreamProtocolError):
            async for _ in resp.chunks():
                pass
        resp.close()


async def test_large_body_with_flow_control(client: UpstreamClient) -> None:
    """A 3 MiB body read slowly arrives whole (the native client pauses and resumes reading)."""
    body = bytes(range(256)) * (3 * 4096)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await w.drain()

    async with Server(handler) as url:
        resp = await client.post(url, b"{}", [])
        got = bytearray()
        async for part in resp.chunks():
            got += part
            await asyncio.sleep(0)
        assert bytes(got) == body
        resp.close()


async def test_garbage_response(client: UpstreamClient) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b"NOT HTTP AT ALL\r\n\r\n")
        await w.drain()
        await asyncio.sleep(1)

    async with Server(handler) as url:
        with pytest.raises(UpstreamProtocolError):
            await client.post(url, b"{}", [])
