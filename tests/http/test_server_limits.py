"""Bounds of the HTTP edge (``server.limits``), over raw sockets, on both server protocols.

uvicorn runs each protocol in a thread in front of a small ASGI app; the client is a plain
socket so that what is sent, and when the answer comes, is visible byte by byte.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from gateway.config.model import ClientLimits
from gateway.http.server import MAX_RAW_HEAD_BYTES
from gateway.http.uvicorn import uvicorn_options
from tests.http.lifespan import run_lifespan

PATIENCE = 30.0  # seconds: generous bound for anything that should happen "soon"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = b"got %d" % len(body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def run_server(protocol: str, limits: ClientLimits) -> Iterator[tuple[str, int]]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, **uvicorn_options(5.0, protocol, limits))  # type: ignore[arg-type]
    srv = uvicorn.Server(config)

    def run() -> None:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(srv.serve(sockets=[sock]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE
    while not srv.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield "127.0.0.1", port
    srv.should_exit = True
    thread.join(PATIENCE)
    sock.close()


@pytest.fixture(params=["native", "uvicorn"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    yield from run_server(request.param, ClientLimits(max_connections=3))


@pytest.fixture()
def native() -> Iterator[tuple[str, int]]:
    limits = ClientLimits(keep_alive_timeout=1.0, header_timeout=2.0, body_timeout=1.0)
    yield from run_server("native", limits)


def connect(addr: tuple[str, int]) -> socket.socket:
    return socket.create_connection(addr, timeout=PATIENCE)


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (or resets after its answer)."""
    data = b""
    while True:
        try:
            part = s.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


def status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def served(addr: tuple[str, int]) -> bool:
    with connect(addr) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return status(read_all(s)) == 200


def test_long_header_line_is_refused_while_it_arrives(server: tuple[str, int]) -> None:
    """An 8 MiB header line sent in pieces gets 431 once the head passes the raw cap, long
    before the line ends (httptools reports a header only when its line is complete; both
    protocols buffered the whole line, copying it at each read); others are served meanwhile."""
    total, piece = 8 * 1024 * 1024, 16 * 1024
    with connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ")
        sent, answer = 0, b""
        while sent < total and not answer:
            try:
                s.sendall(b"a" * piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += piece
            if sent == 2 * piece:
                assert served(server)  # another client, while this head is half sent
            if select.select([s], [], [], 0.01)[0]:
                answer = read_all(s)
        answer = answer or read_all(s)
    assert status(answer) == 431
    assert sent < total
    assert sent <= MAX_RAW_HEAD_BYTES + 64 * piece  # a read or two past the cap, not more
    assert served(server)


def test_headers_under_the_cap_still_pass(server: tuple[str, int]) -> None:
    """The raw cap leaves room for heads the reported-header cap accepts."""
    with connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
                  + b"b" * (60 * 1024) + b"\r\n\r\n")
        assert status(read_all(s)) == 200


def test_request_after_a_large_body_in_one_write_is_parsed(server: tuple[str, int]) -> None:
    """A head and a body far larger than the head cap, in one write, is not a long head."""
    body = b"x" * (1024 * 1024)
    with connect(server) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        answer = read_all(s)
    assert status(answer) == 200 and answer.endswith(b"got 1048576")


def test_malformed_chunked_body_is_answered_400(server: tuple[str, int]) -> None:
    """Bad chunk framing in a body the app is reading: 400, then close (it was a close with no
    answer on the native protocol; uvicorn's answers 400)."""
    with connect(server) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n")
        answer = read_all(s)
    assert status(answer) == 400


def test_connections_beyond_the_limit_are_refused(server: tuple[str, int]) -> None:
    """``max_connections: 3``: three open connections are served; a fourth gets 503."""
    conns = [connect(server) for _ in range(3)]
    try:
        for s in conns:  # each one made a request: the server has surely accepted it
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        with connect(server) as extra:
            extra.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status(read_all(extra)) == 503
    finally:
        for s in conns:
            s.close()
    deadline = time.monotonic() + PATIENCE
    while not served(server):  # the server sees the three close in its own time
        assert time.monotonic() < deadline


def closed_while(s: socket.socket, keep_sending: bytes | None, every: float = 0.3) -> bytes:
    """Send ``keep_sending`` every ``every`` s until the server closes; what it answered."""
    deadline = time.monotonic() + PATIENCE
    data = b""
    while time.monotonic() < deadline:
        if select.select([s], [], [], every)[0]:
            try:
                part = s.recv(65536)
            except ConnectionResetError:
                return data
            if not part:
                return data
            data += part
        elif keep_sending is not None:
            try:
                s.sendall(keep_sending)
            except (BrokenPipeError, ConnectionResetError):
                return data
    raise AssertionError(f"connection still open after {PATIENCE}s; got {data!r}")


def test_crlf_between_requests_is_not_activity(native: tuple[str, int]) -> None:
    """keep_alive_timeout 1 s: a client sending bare CRLFs is still idle and is closed."""
    with connect(native) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert closed_while(s, b"\r\n") == b""


def test_slow_body_gets_408(native: tuple[str, int]) -> None:
    """body_timeout 1 s: one byte of the body every 0.3 s gets 408 and a close."""
    with connect(native) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        answer = closed_while(s, b"x")
    assert status(answer) == 408


def test_slow_head_gets_408(native: tuple[str, int]) -> None:
    """header_timeout 2 s: a head sent a header every 0.3 s gets 408 and a close."""
    with connect(native) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        answer = closed_while(s, b"X-A: b\r\n")
    assert status(answer) == 408
