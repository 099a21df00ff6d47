"""Rules of both upstream clients beyond framing: resending, caps, relay mode, error text."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator

import pytest

from gateway.config import Timeouts
from gateway.http.base import ResponseLimits, UpstreamClient, make_upstream
from gateway.http.client import H1Upstream
from gateway.http.errors import (
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
)
from gateway.upstream.failures import as_gateway_error
from tests.http.hostile import HostileBackend, Script, read_request

TIMEOUTS = Timeouts(connect=5, first_token=5, idle=2, total=10)
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
KEY = "sk-backend-secret-0123456789"


@pytest.fixture(params=["native", "aiohttp"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[UpstreamClient]:
    limits = ResponseLimits(max_head=4096, max_headers=16, max_body=1000)
    c = make_upstream(request.param, TIMEOUTS, 8, limits)
    await c.start()
    yield c
    await c.close()


async def _ran_then_died(client: UpstreamClient, headers: list[tuple[bytes, bytes]]) -> int:
    """A backend answers request 1, then reads request 2 on the same connection and closes it
    without a byte (it may have run it). Returns how many times request 2 reached a backend."""
    def script(n: int, _: bytes) -> Script:
        return Script([OK]) if n == 0 else Script([], close=True) if n == 1 else Script([OK])

    backend = HostileBackend(script)
    async with backend as url:
        resp = await client.post(url, b"{}", [])
        await resp.read()
        resp.close()
        try:
            resp = await client.post(url, b"{}", headers)
            await resp.read()
            resp.close()
        except UpstreamProtocolError:
            pass
    return len(backend.served_on) - 1


async def test_plain_post_not_resent_after_reused_connection_died(client: UpstreamClient) -> None:
    """A POST the backend received on a reused connection is not sent again (it may have run)."""
    assert await _ran_then_died(client, []) == 1


async def test_post_with_idempotency_key_resent_once() -> None:
    """With an Idempotency-Key the client declares a duplicate harmless: one resend."""
    c = H1Upstream(TIMEOUTS, 8)
    try:
        assert await _ran_then_died(c, [(b"idempotency-key", b"k1")]) == 2
    finally:
        await c.close()


async def test_idle_connection_closed_by_backend_is_not_used() -> None:
    """The backend closed the idle connection but the loop has not run its EOF callback yet:
    the poll before reuse discards it, so the POST goes on a fresh connection and succeeds."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    closed = threading.Event()
    seen: list[int] = []

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n{}" not in data:
                    data += conn.recv(65536)
                seen.append(n)
                conn.sendall(OK)
                if n == 0:
                    conn.shutdown(socket.SHUT_RDWR)
                    closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    c = H1Upstream(TIMEOUTS, 8)
    url = f"http://127.0.0.1:{port}/v1/x"
    try:
        resp = await c.post(url, b"{}", [])
        assert await resp.read() == b"{}"
        resp.close()
        closed.wait(10)  # blocking on purpose: the loop must not see the EOF first
        # no await between here and the write: the FIN is known only to the kernel
        resp = await c.post(url, b"{}", [])
        assert await resp.read() == b"{}"
        resp.close()
    finally:
        await c.close()
        listener.close()
    assert seen == [0, 1]


async def test_body_over_cap_is_an_error_and_closes(client: UpstreamClient) -> None:
    big = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    big += b"".join(b"64\r\n" + b"x" * 100 + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"
    backend = HostileBackend(lambda n, _: Script([big]) if n == 0 else Script([OK]))
    async with backend as url:
        resp = await client.post(url, b"{}", [])
        with pytest.raises(UpstreamResponseTooLarge):
            await resp.read()
        resp.close()
        resp = await client.post(url, b"{}", [])
        assert await resp.read() == b"{}"
        resp.close()
    if isinstance(client, H1Upstream):  # aiohttp releases a connection itself at the body's end
        assert backend.served_on == [1, 2]


async def test_declared_length_over_cap_is_refused(client: UpstreamClient) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n"
    async with HostileBackend(lambda n, _: Script([head + b"x" * 10])) as url:
        resp = await client.post(url, b"{}", [])
        with pytest.raises(UpstreamResponseTooLarge):
            await resp.read()
        resp.close()


@pytest.mark.parametrize("extra", [
    pytest.param(b"x-big: " + b"a" * 5000 + b"\r\n", id="head-bytes"),
    pytest.param(b"".join(b"x-h%d: v\r\n" % i for i in range(20)), id="header-count"),
])
async def test_head_over_caps_is_an_error(client: UpstreamClient, extra: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + extra + b"content-length: 2\r\n\r\n{}"
    async with HostileBackend(lambda n, _: Script([head])) as url:
        with pytest.raises(UpstreamProtocolError):
            await client.post(url, b"{}", [])


async def test_only_event_streams_are_relayed_as_streams(client: UpstreamClient) -> None:
    """A chunked JSON body is read whole (is_stream False), so a break in it is an error from
    read() that forward can retry, not a truncated answer already relayed (point 10)."""
    chunked = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
               b"transfer-encoding: chunked\r\n\r\n5\r\n{\"a\":")
    async with HostileBackend(lambda n, _: Script([chunked], close=True)) as url:
        resp = await client.post(url, b"{}", [])
        assert not resp.is_stream and not resp.is_event_stream
        with pytest.raises(UpstreamProtocolError):
            await resp.read()
        resp.close()


async def test_client_facing_text_never_carries_the_request(client: UpstreamClient) -> None:
    """A malformed answer's 502 text is built from the error kind: no key, no URL (point 4)."""
    async with HostileBackend(lambda n, _: Script([b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n"],
                                                  close=True)) as url:
        with pytest.raises(UpstreamError) as info:
            await client.post(url, b"{}", [(b"authorization", f"Bearer {KEY}".encode())])
    err = as_gateway_error(info.value, "b0")
    assert err.status == 502
    assert err.message == "backend 'b0' sent an invalid HTTP response"
    for leak in (KEY, "Bearer", "127.0.0.1", "/v1/chat"):
        assert leak not in err.message and leak not in str(info.value)


def test_public_text_is_redacted() -> None:
    """A key shape in a detail never reaches the client's text."""
    exc = UpstreamProtocolError("x", detail=f"Authorization: Bearer {KEY}")
    assert KEY not in as_gateway_error(exc, "b0").message


async def test_request_reaches_backend_framed(client: UpstreamClient) -> None:
    """Sanity for the helpers: the request is what the hostile server parses."""
    got: list[bytes] = []

    def script(n: int, request: bytes) -> Script:
        got.append(request)
        return Script([OK])

    async with HostileBackend(script) as url:
        resp = await client.post(url, b"{}", [])
        await resp.read()
        resp.close()
    assert got[0].endswith(b"\r\n\r\n{}")
    assert read_request is not None
