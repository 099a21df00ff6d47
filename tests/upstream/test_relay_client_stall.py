"""``timeouts.client_stall`` bounds how long a client that stops reading holds a stream (issue
34, point 9), on both server protocols: once one write to it has waited that long for the
client to read, the stream is cancelled upstream (the backend sees its connection closed, the
backend's slot is released), the request leaves one usage record, ``cancelled`` like a client
that disconnected and billed for what was relayed, one ``client_stalled`` log line and one
count in ``gateway_client_stalls_total``. Before this bound it held them for ``timeouts.total``.

A client that reads keeps its stream for as long as it lasts, however much longer than
``client_stall``: the bound is on a write waiting, not on the stream's length.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import TEST_KEY, GatewayProcess, policy, wait_usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-client-stall-test"
PATIENCE = 30.0  # seconds; the stall bound is 1 s, the total deadline 600 s
STALL = 1.0
#: ``max_tokens`` the backend reads as: one event then the end / events for READ_FOR seconds
#: then the end / events until the gateway closes the stream
ONE, TIMED, ENDLESS = 1, 2, 1000
READ_FOR = 3.0


class Streaming(BaseHTTPRequestHandler):
    """An SSE stream of 4 KB events as fast as the gateway takes them; records each stream
    the gateway closed on it."""

    protocol_version = "HTTP/1.1"
    cut: list[float] = []

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x " * 2000 + b'"}}]}\n\n'
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        done = b"data: [DONE]\n\n"
        end = b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
        limit = payload.get("max_tokens")
        until = time.monotonic() + (READ_FOR if limit == TIMED else 0 if limit == ONE else 1e9)
        try:
            while True:
                self.wfile.write(chunk)
                self.wfile.flush()
                if time.monotonic() >= until:
                    break
                time.sleep(0.002)
            self.wfile.write(end)
            self.wfile.flush()
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
def gateway(backend: str, tmp_path: Path, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayProcess]:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    data = policy({"chat": [backend]}, http_protocol=request.param)
    data["server"]["timeouts"] = {"total": 600, "client_stall": STALL}
    data["pools"][0]["backends"][0]["max_in_flight"] = 1
    with GatewayProcess(tmp_path, data) as gw:
        yield gw


def stream_request(max_tokens: int) -> bytes:
    body = json.dumps({"model": "chat-model", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + TEST_KEY.encode() + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def records(gw: GatewayProcess, count: int) -> list[dict[str, Any]]:
    """The usage records, once there are ``count`` (or PATIENCE has passed)."""
    return wait_usage_records(gw.url, ADMIN, lambda found: len(found) >= count, within=PATIENCE)


def metric(gw: GatewayProcess, name: str, **labels: str) -> float | None:
    """A sample's value from ``/metrics`` (None: no such series)."""
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        series, _, value = line.rpartition(" ")
        family, _, rest = series.partition("{")
        if family != name or line.startswith("#"):
            continue
        have = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(",") if pair)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return None


def wait_for(check: Any, what: str, gw: GatewayProcess) -> None:
    deadline = time.monotonic() + PATIENCE
    while not check():
        assert time.monotonic() < deadline, f"{what}\n--- gateway output ---\n{gw.output()}"
        time.sleep(0.1)


def test_client_that_stops_reading_is_cut_off_after_client_stall(gateway: GatewayProcess
                                                                  ) -> None:
    """A client that reads nothing (small receive buffer) while the backend streams: after
    ``client_stall`` without progress the gateway closes the backend stream (far before
    ``total``), the backend's only slot serves the next request, and the stalled request has
    one ``cancelled`` record with the output relayed before the stall."""
    cut_before = len(Streaming.cut)
    port = int(gateway.url.rsplit(":", 1)[1])
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port))
    try:
        stalled.sendall(stream_request(ENDLESS))
        wait_for(lambda: len(Streaming.cut) > cut_before, "backend stream still open", gateway)
        stalled.settimeout(PATIENCE)
        received = b""
        while True:  # the client connection ends too (after what was already buffered)
            try:
                part = stalled.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"client connection still open\n{gateway.output()}") from None
            if not part:
                break
            received += part
    finally:
        stalled.close()
    head = received.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 200"), head
    request_id = next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                      if line.startswith("x-request-id:"))

    # the slot is free: the one request the backend takes at a time is served
    wait_for(lambda: metric(gateway, "gateway_inflight", pool="chat") == 0,
             "backend slot still held", gateway)
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=PATIENCE,
                      headers={"authorization": f"Bearer {TEST_KEY}"},
                      json={"model": "chat-model", "stream": True, "max_tokens": ONE,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        assert b"[DONE]" in r.read()

    found = records(gateway, 2)
    mine = [rec for rec in found if rec["request_id"].lower() == request_id]
    assert len(mine) == 1, found
    assert mine[0]["outcome"] == "cancelled", mine[0]
    assert mine[0]["output"] > 0  # billed for what was relayed
    assert mine[0]["cost_micros"] >= 0
    assert len(found) == 2, found
    assert metric(gateway, "gateway_client_stalls_total", pool="chat") == 1.0

    def logged() -> list[str]:
        return [line for line in gateway.output().splitlines() if "client_stalled" in line]

    wait_for(logged, "no client_stalled log line", gateway)
    (line,) = logged()
    assert mine[0]["request_id"] in line and "tenant" in line and "bytes in" in line, line


def test_client_that_reads_keeps_a_stream_longer_than_client_stall(gateway: GatewayProcess
                                                                   ) -> None:
    """A stream of READ_FOR seconds (three times ``client_stall``) to a client that reads it
    is relayed whole: one ``completed`` record, no stall counted."""
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=PATIENCE,
                      headers={"authorization": f"Bearer {TEST_KEY}"},
                      json={"model": "chat-model", "stream": True, "max_tokens": TIMED,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        body = r.read()
    assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
    (record,) = records(gateway, 1)
    assert record["outcome"] == "completed", record
    assert metric(gateway, "gateway_client_stalls_total", pool="chat") is None
