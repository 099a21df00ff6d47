"""Hostile-backend conformance: both upstream clients reach h11's verdict, and never pool a
connection that saw a framing error.

Each case is a scripted answer sent by a real socket server (:mod:`tests.http.hostile`).
For each, the expected outcome class - a response (status, body), a protocol error, or an
incomplete exchange (the client times out) - is computed by h11 over the same bytes, not written
by hand. After each case a follow-up request must get its own answer, and must travel on a fresh
connection whenever h11 says the first one was not reusable (framing error, bytes after the
response, close-delimited body).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from gateway.config import Timeouts
from gateway.http.base import UpstreamClient, make_upstream
from tests.http.hostile import (
    FOLLOW_UP,
    HostileBackend,
    Script,
    client_verdict,
    eventually,
    reference,
)

TIMEOUTS = Timeouts(connect=5, first_token=5, idle=1.0, total=2.5)

OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
OK = OK_HEAD + b"content-length: 9\r\n\r\n{\"a\": 1}\n"
CHUNKED = OK_HEAD + b"transfer-encoding: chunked\r\n\r\n"
SSE = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
       b"transfer-encoding: chunked\r\n")
INJECTED = b"HTTP/1.1 200 OK\r\ncontent-length: 16\r\n\r\n{\"injected\": 1}\n"


def _case(name: str, *writes: bytes, close: bool = False, trickle: bytes = b"") -> object:
    return pytest.param(Script(list(writes), close=close, trickle=trickle), id=name)


CASES = [
    _case("valid-content-length", OK),
    _case("valid-chunked", CHUNKED + b"4\r\n{\"a\"\r\n5\r\n: 1}\n\r\n0\r\n\r\n"),
    _case("valid-split-byte-by-byte", *[bytes([b]) for b in OK[:40]], OK[40:]),
    # point 1: interim responses are skipped, whatever their segmentation
    _case("early-hints-then-200", b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n" + OK),
    _case("continue-in-its-own-segment", b"HTTP/1.1 100 Continue\r\n\r\n", OK),
    _case("several-1xx-split", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 10",
          b"3 Early Hints\r\nlink: </a>\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\n\r\n" + OK[:20],
          OK[20:]),
    _case("switching-protocols-101",
          b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n" + OK),
    # point 3: bytes after a complete response are nobody's answer
    _case("204-then-injected-200-same-write", b"HTTP/1.1 204 No Content\r\n\r\n" + INJECTED),
    _case("injected-200-in-later-segment", OK, INJECTED),
    _case("content-length-shorter-than-body", OK_HEAD + b"content-length: 2\r\n\r\n{}{\"x\": 2}"),
    _case("chunked-trailers", CHUNKED + b"2\r\n{}\r\n0\r\nx-trailer: evil\r\n\r\n"),
    # point 11: close-delimited bodies end at EOF
    _case("http10-close-delimited", b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n",
          b"{\"a\": ", b"1}", close=True),
    _case("connection-close-no-length", OK_HEAD + b"connection: close\r\n\r\n{\"a\": 1}",
          close=True),
    # point 10: a body that breaks is an error, not a short answer
    _case("chunked-broken-mid-body", CHUNKED + b"10\r\n{\"partial\":", close=True),
    _case("content-length-longer-eof", OK_HEAD + b"content-length: 50\r\n\r\n{}", close=True),
    _case("content-length-longer-open", OK_HEAD + b"content-length: 50\r\n\r\n{}"),
    _case("connection-close-mid-stream", SSE + b"connection: close\r\n\r\n"
          b"f\r\ndata: {\"a\": 1}\r\n", close=True),
    # framing
    _case("content-length-and-chunked", OK_HEAD + b"content-length: 2\r\n"
          b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
    _case("two-different-content-lengths", OK_HEAD + b"content-length: 2\r\ncontent-length: 3\r\n"
          b"\r\n{}x"),
    _case("bad-chunk-size", CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n"),
    _case("chunk-longer-than-its-size", CHUNKED + b"2\r\n{}XX\r\n0\r\n\r\n"),
    _case("transfer-encoding-gzip", OK_HEAD + b"transfer-encoding: gzip\r\n\r\nabc", close=True),
    _case("garbage", b"NOT HTTP AT ALL\r\n\r\n"),
    _case("status-line-only-then-eof", b"HTTP/1.1 200 OK\r\n", close=True),
    _case("eof-before-any-byte", close=True),
    # header bytes
    _case("bare-cr-in-header-value", OK_HEAD + b"x-evil: a\rb\r\ncontent-length: 2\r\n\r\n{}"),
    _case("lf-in-header-value", OK_HEAD + b"x-evil: a\nb: c\r\ncontent-length: 2\r\n\r\n{}"),
    _case("obs-fold-header", OK_HEAD + b"x-folded: a\r\n b\r\ncontent-length: 2\r\n\r\n{}"),
    _case("nul-in-header-value", OK_HEAD + b"x-evil: a\x00b\r\ncontent-length: 2\r\n\r\n{}"),
    _case("headers-40kib-under-cap", OK_HEAD + b"x-big: " + b"a" * 40_000 +
          b"\r\ncontent-length: 2\r\n\r\n{}"),
    _case("one-header-line-of-1mib", OK_HEAD + b"x-big: " + b"a" * (1 << 20) +
          b"\r\ncontent-length: 2\r\n\r\n{}"),
    _case("1mib-of-small-headers", OK_HEAD + b"".join(
        b"x-h%05d: %s\r\n" % (i, b"v" * 40) for i in range(20_000)) +
          b"content-length: 2\r\n\r\n{}"),
    # time
    _case("response-that-never-ends", CHUNKED + b"2\r\n{}\r\n", trickle=b"1\r\n \r\n"),
]


#: where a client is stricter than h11 (an error where h11 answers), on purpose; never laxer
STRICTER = {
    # RFC 9112 5.2 lets a gateway refuse obs-fold with a 502 (h11 and aiohttp unfold it)
    ("native", "obs-fold-header"),
    # a bare LF as a line end (RFC 9112 2.2: MAY be accepted): llhttp's switch for it also
    # accepts it after chunk data, so the native client stays strict
    ("native", "lf-in-header-value"),
    # aiohttp fails the exchange when garbage follows it in the same segment (safe: no answer
    # is wrong, the connection is closed); the native client keeps the complete answer
    ("aiohttp", "content-length-shorter-than-body"),
}


@pytest.fixture(params=["native", "aiohttp"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[UpstreamClient]:
    c = make_upstream(request.param, TIMEOUTS, 8)
    await c.start()
    yield c
    await c.close()


def idle_connections(client: UpstreamClient) -> int:
    """Connections the client holds idle for reuse (test-only look at each client's pool)."""
    session = getattr(client, "_session", None)
    if session is not None:  # aiohttp: the connector's idle lists
        conns = session.connector._conns
        return sum(1 for v in conns.values() for proto, _ in v if proto.is_connected())
    return sum(int(n) for n in re.findall(r"idle: (\d+)", repr(client)))


@pytest.mark.parametrize("script", CASES)
async def test_same_verdict_as_h11_and_no_pooled_broken_connection(
    client: UpstreamClient, script: Script, request: pytest.FixtureRequest
) -> None:
    """The client's outcome class equals h11's; a connection h11 would not reuse is not kept,
    and a follow-up request gets its own answer."""
    backend = HostileBackend(lambda n, _: script if n == 0 else Script([FOLLOW_UP]))
    expected, reusable = reference(script.data, script.close)
    kind, case = request.node.callspec.id.split("-", 1)
    if (kind, case) in STRICTER:
        expected, reusable = ("error",), False
    async with backend as url:
        got = await client_verdict(lambda: client.post(url, b"{}", []))
        assert got == expected
        if not reusable:  # once the script's last byte is in, nothing of it sits in the pool
            await eventually(lambda: backend.answered >= 1 or bool(script.trickle))
            assert await eventually(lambda: idle_connections(client) == 0)
        follow = await client_verdict(lambda: client.post(url, b"{}", []))
        assert follow == ("response", 200, b"follow-up!!")
    if reusable:
        assert backend.served_on == [1, 1]  # a clean keep-alive exchange: reused
    else:
        assert backend.served_on[1] != backend.served_on[0]


async def test_trailers_never_become_headers(client: UpstreamClient) -> None:
    """Chunked trailers are dropped: not among the response headers."""
    script = Script([CHUNKED + b"2\r\n{}\r\n0\r\nx-trailer: evil\r\n\r\n"])
    async with HostileBackend(lambda n, _: script) as url:
        resp = await client.post(url, b"{}", [])
        assert await resp.read() == b"{}"
        resp.close()
        assert all(name != b"x-trailer" for name, _ in resp.headers)


async def test_interim_headers_never_become_headers(client: UpstreamClient) -> None:
    """A 103's Link header belongs to the interim response, not to the final one."""
    script = Script([b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n", OK])
    async with HostileBackend(lambda n, _: script) as url:
        resp = await client.post(url, b"{}", [])
        assert resp.status == 200 and await resp.read() == b"{\"a\": 1}\n"
        resp.close()
        assert all(name != b"link" for name, _ in resp.headers)
