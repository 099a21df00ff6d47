"""Cancelled streams leave nothing behind in a real gateway process (issue 20, point 3).

A stream whose client disconnects is torn down by cancellation: the client connection, its
request task, the upstream connection to the simulator. Everything it held must be freed at
once by reference counting. A reference cycle is freed only by the cyclic collector, which
the worker runs rarely (``tune_gc`` raises its thresholds), so a cycle per stream grew RSS by
a few KB per cancelled stream: before the fix, each one left its two transports, the server
protocol, the upstream connection and their httptools parsers (the parser holds bound methods
of its protocol) as cyclic garbage.

The gateway runs with ``GATEWAY_MEMDEBUG`` (light mode): on ``SIGUSR2`` it collects with
``gc.DEBUG_SAVEALL`` and writes what the collection found, by type, with live objects and
tasks. Counts of objects and fds are exact; nothing here looks at RSS.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

STREAMS = 24
PATIENCE = 60.0
#: what one stream's teardown must not leave for the cyclic collector
STREAM_TYPES = {"GatewayH1Protocol", "HttpRequestParser", "HttpResponseParser", "_Connection",
                "TCPTransport", "_Exchange", "HeadMeter", "_ClientRequest", "RequestContext",
                "Task", "Future"}
#: of those, the ones with no instance outside a stream (tasks are compared by coroutine, and
#: futures come and go with the background tasks' sleeps)
PER_STREAM_TYPES = STREAM_TYPES - {"Task", "Future", "TCPTransport", "_Connection",
                                   "HttpResponseParser"}


class Gateway:
    """The gateway process and its debug dump file."""

    def __init__(self, proc: GatewayProcess, dump: Path) -> None:
        self.proc, self.dump = proc, dump

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def report(self) -> dict[str, Any]:
        """Ask for a dump and wait for its line."""
        before = self._lines()
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + PATIENCE
        while len(lines := self._lines()) == len(before):
            assert time.monotonic() < deadline, "no memory report from the gateway"
            time.sleep(0.1)
        report: dict[str, Any] = json.loads(lines[-1])
        return report

    def _lines(self) -> list[str]:
        return self.dump.read_text().splitlines() if self.dump.exists() else []


@pytest.fixture(scope="module")
def gateway(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("teardown")
    dump = tmp / "memdebug.jsonl"
    saved = {k: os.environ.get(k) for k in ("GATEWAY_MEMDEBUG", "GATEWAY_MEMDEBUG_MODE",
                                           "GATEWAY_ACCESS_LOG")}
    os.environ.update(GATEWAY_MEMDEBUG=str(dump), GATEWAY_MEMDEBUG_MODE="light",
                      GATEWAY_ACCESS_LOG="off")
    try:
        with GatewayProcess(tmp, policy({"chat": [sim.url]})) as proc:
            yield Gateway(proc, dump)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _request(port: int) -> bytes:
    body = (b'{"model":"chat-model","stream":true,"max_tokens":8000,'
            b'"messages":[{"role":"user","content":"a long answer, please"}]}')
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (port, TEST_KEY.encode(), len(body), body))


def open_streams(gw: Gateway, n: int) -> list[socket.socket]:
    """``n`` streams, each having received its response head and a first event."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", gw.proc.port), timeout=PATIENCE)
        s.sendall(_request(gw.proc.port))
        socks.append(s)
    for s in socks:
        seen = b""
        while b"data:" not in seen:
            part = s.recv(65536)
            assert part, f"stream closed before its first event: {seen[:300]!r}"
            seen += part
        assert seen.startswith(b"HTTP/1.1 200"), seen[:300]
    return socks


def settle(gw: Gateway, fds: int) -> None:
    """Wait until the gateway's fds are back to ``fds`` (its streams are torn down)."""
    deadline = time.monotonic() + PATIENCE
    while gw.fds() > fds and time.monotonic() < deadline:
        time.sleep(0.1)


def _stream_garbage(report: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in report["garbage"].items() if k in STREAM_TYPES}


def test_cancelled_streams_leave_no_garbage_tasks_or_fds(gateway: Gateway) -> None:
    """After rounds of streams whose clients disconnect mid-stream, a full collection finds
    no object of a stream (protocols, parsers, transports, exchanges, tasks) as cyclic
    garbage, the live objects and tasks of those types are back to what they were before, and
    so is the gateway's fd count."""
    for s in open_streams(gateway, 2):  # warm-up: pools, caches and lazy imports filled
        s.close()
    time.sleep(1.0)
    baseline = gateway.report()
    fds = gateway.fds()
    for _ in range(3):
        socks = open_streams(gateway, STREAMS)
        assert gateway.fds() >= fds + STREAMS  # the streams are open on both sides
        for s in socks:
            s.close()
        settle(gateway, fds)
    report = gateway.report()
    assert _stream_garbage(report) == {}, report["garbage"]
    assert gateway.fds() == fds
    assert report["tasks"] == baseline["tasks"]
    live = {k: report["live"].get(k, 0) for k in PER_STREAM_TYPES}
    assert live == dict.fromkeys(PER_STREAM_TYPES, 0)


def test_clients_that_reset_leave_no_garbage(gateway: Gateway) -> None:
    """The same when clients leave with a reset instead of a FIN."""
    fds = gateway.fds()
    baseline = gateway.report()
    socks = open_streams(gateway, STREAMS)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    settle(gateway, fds)
    report = gateway.report()
    assert _stream_garbage(report) == {}, report["garbage"]
    assert gateway.fds() == fds
    assert report["tasks"] == baseline["tasks"]
