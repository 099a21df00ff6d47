"""``server.timeouts.total`` bounds the relay to a client that stops reading, on both server
protocols: the stream, the backend connection and the backend's ``max_in_flight`` slot are
released at the deadline (they were held for as long as the client kept its socket open)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

PATIENCE = 40.0  # seconds; the deadline is 3 s
TOTAL = 3.0


class Streaming(BaseHTTPRequestHandler):
    """An SSE stream that never ends (``max_tokens: 1``: one event and ``[DONE]``); records
    each stream the gateway closed on it."""

    protocol_version = "HTTP/1.1"
    cut: list[float] = []

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 4000 + b'"}}]}\n\n'
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        try:
            if payload.get("max_tokens") == 1:
                done = b"data: [DONE]\n\n"
                self.wfile.write(chunk + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                self.wfile.flush()
                return
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(0.005)
        except OSError:
            Streaming.cut.append(time.monotonic())
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Streaming)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(params=["native", "uvicorn"])
def gateway(backend: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[GatewayProcess]:
    data = policy({"chat": [backend]}, http_protocol=request.param)
    data["server"]["timeouts"] = {"total": TOTAL}
    data["pools"][0]["backends"][0]["max_in_flight"] = 1
    with GatewayProcess(tmp_path, data) as gw:
        yield gw


def stream_request(max_tokens: int) -> bytes:
    body = json.dumps({"model": "chat-model", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + TEST_KEY.encode() + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_client_that_stops_reading_is_cut_off_at_the_deadline(gateway: GatewayProcess) -> None:
    """A client that reads nothing (small receive buffer) while the backend streams: at
    ``total`` the gateway closes the backend stream and the client connection, and the
    backend's only slot (``max_in_flight: 1``) serves the next request."""
    cut_before = len(Streaming.cut)
    port = int(gateway.url.rsplit(":", 1)[1])
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port))
    try:
        stalled.sendall(stream_request(1000))
        deadline = time.monotonic() + PATIENCE
        while len(Streaming.cut) == cut_before:  # the backend sees its stream closed
            assert time.monotonic() < deadline, "backend stream still open"
            time.sleep(0.1)
        stalled.settimeout(PATIENCE)
        received = 0
        while True:  # the client connection ends too (after what was already buffered)
            try:
                part = stalled.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"client connection still open\n{gateway.output()}") from None
            if not part:
                break
            received += len(part)
        assert received > 0
    finally:
        stalled.close()
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=PATIENCE,
                      headers={"authorization": f"Bearer {TEST_KEY}"},
                      json={"model": "chat-model", "stream": True, "max_tokens": 1,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        assert b"[DONE]" in r.read()
