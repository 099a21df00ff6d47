"""The gateway's HTTP/1.1 server protocol, byte for byte over real sockets.

uvicorn runs it (``http=GatewayH1Protocol``) in a thread in front of a small ASGI app; the
client side is a plain socket so framing, pipelining and connection handling are visible.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from gateway.config.model import ClientLimits
from gateway.http.server import MAX_HEAD_BYTES, GatewayH1Protocol
from gateway.http.uvicorn import UvicornH1Protocol, uvicorn_options
from tests.http.lifespan import run_lifespan

EVENTS: list[str] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return
    path = scope["path"]
    if path == "/echo":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        info = {"method": scope["method"], "path": scope["path"],
                "query": scope["query_string"].decode(), "body": body.decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]}}
        out = json.dumps(info).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(int(scope["query_string"] or b"3")):
            await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(),
                        "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    elif path == "/watch":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        first = await receive()  # the (empty) request body
        message = await receive()  # then nothing until the client leaves
        EVENTS.extend([first["type"], message["type"]])
    elif path == "/early":
        out = b'{"error":"too large"}'
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})
    elif path == "/boom":
        raise RuntimeError("app failure")
    else:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options = uvicorn_options(5.0, limits=ClientLimits(keep_alive_timeout=1))
    config = uvicorn.Config(app, **options)  # type: ignore[arg-type]
    srv = uvicorn.Server(config)

    def run() -> None:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(srv.serve(sockets=[sock]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    EVENTS.clear()
    yield "127.0.0.1", port
    srv.should_exit = True
    thread.join(10)
    sock.close()


def connect(addr: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(addr, timeout=5)
    return s


class Reader:
    """Reads HTTP/1.1 responses off a socket (Content-Length and chunked framing)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(self.buf)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(self.buf)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        status = int(self.line().split(b" ")[1])
        headers: dict[str, str] = {}
        while line := self.line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if head or status in (204, 304) or status < 200:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self.line(), 16)
                if size == 0:
                    assert self.line() == b""
                    return status, headers, body
                body += self.exact(size)
                assert self.exact(2) == b"\r\n"
        return status, headers, self.exact(int(headers["content-length"]))

    def closed(self) -> bool:
        self.sock.settimeout(5)
        return self.buf == b"" and not self._fill()


def test_keep_alive_serves_requests_in_turn(server: tuple[str, int]) -> None:
    with connect(server) as s:
        r = Reader(s)
        for i in range(3):
            s.sendall(f"POST /echo?n={i} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                      .encode())
            status, headers, body = r.response()
            info = json.loads(body)
            assert status == 200 and "date" in headers
            assert info["query"] == f"n={i}" and info["body"] == "hello"
            assert info["headers"]["host"] == "x"


def test_pipelined_requests_answer_in_order(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"".join(
            f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{i:02d}".encode()
            for i in range(20)
        ))
        r = Reader(s)
        bodies = [json.loads(r.response()[2])["body"] for _ in range(20)]
        assert bodies == [f"{i:02d}" for i in range(20)]


def test_chunked_request_body_and_percent_path(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"POST /ec%68o HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        status, _, body = Reader(s).response()
        info = json.loads(body)
        assert status == 200 and info["body"] == "abcdefg" and info["path"] == "/echo"


def test_expect_continue(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 4\r\n\r\n")
        r = Reader(s)
        assert r.line() == b"HTTP/1.1 100 Continue"
        assert r.line() == b""
        s.sendall(b"body")
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["body"] == "body"


def test_streamed_response_is_chunked_and_complete(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"GET /stream?5 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = Reader(s).response()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert body == b"".join(f"data: {i}\n\n".encode() for i in range(5))


def test_head_has_no_body_and_204_has_no_framing(server: tuple[str, int]) -> None:
    with connect(server) as s:
        r = Reader(s)
        s.sendall(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = r.response(head=True)
        assert status == 200 and int(headers["content-length"]) > 0
        s.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = r.response()
        assert status == 204 and "content-length" not in headers
        assert "transfer-encoding" not in headers
        # nothing stray on the wire: the next response parses cleanly
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz")
        assert json.loads(r.response()[2])["body"] == "z"


@pytest.mark.parametrize("request_line", [
    b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /echo HTTP/1.0\r\n\r\n",
])
def test_connection_close_and_http10_close_after_the_response(
    server: tuple[str, int], request_line: bytes
) -> None:
    with connect(server) as s:
        s.sendall(request_line)
        r = Reader(s)
        status, headers, _ = r.response()
        assert status == 200 and headers.get("connection") == "close"
        assert r.closed()


def test_oversized_headers_get_431_and_malformed_gets_400(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEAD_BYTES
                  + b"\r\n\r\n")
        r = Reader(s)
        status, headers, body = r.response()
        assert status == 431 and headers["connection"] == "close"
        assert json.loads(body)["error"]["message"] == "request headers too large"
        assert r.closed()
    with connect(server) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        r = Reader(s)
        status, _, body = r.response()
        assert status == 400 and "malformed HTTP request" in json.loads(body)["error"]["message"]
        assert r.closed()


def test_app_failure_is_a_json_500_not_a_traceback(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
        r = Reader(s)
        status, _, body = r.response()
        assert status == 500 and json.loads(body)["error"]["message"] == "internal error"
        assert b"Traceback" not in body
        assert r.closed()


def test_early_answer_is_read_whole_while_the_body_is_still_coming(
    server: tuple[str, int]
) -> None:
    with connect(server) as s:
        size = 4 * 1024 * 1024
        s.sendall(f"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"x" * 65536
        for _ in range(size // len(chunk)):
            s.sendall(chunk)  # the server reads and drops it: no reset mid-upload
        r = Reader(s)
        status, headers, body = r.response()
        assert status == 413 and body == b'{"error":"too large"}'
        assert headers["connection"] == "close"  # the client knows not to send on it again
        assert r.closed()


def test_client_leaving_is_reported_as_disconnect(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"GET /watch HTTP/1.1\r\nHost: x\r\n\r\n")
        r = Reader(s)
        assert r.line().startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 5
    while not EVENTS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert EVENTS == ["http.request", "http.disconnect"]


def test_idle_keep_alive_connection_is_closed(server: tuple[str, int]) -> None:
    with connect(server) as s:
        s.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        r = Reader(s)
        assert r.response()[0] == 204
        started = time.monotonic()
        assert r.closed()  # keep-alive timeout is 1 s in this fixture
        assert 0.5 < time.monotonic() - started < 4


def test_policy_can_choose_uvicorns_own_protocol() -> None:
    native = uvicorn_options(5.0)["http"]
    assert isinstance(native, functools.partial) and native.func is GatewayH1Protocol
    assert uvicorn_options(5.0, "uvicorn")["http"] is UvicornH1Protocol
