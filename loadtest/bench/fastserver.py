"""A trivial streaming server for measuring the load generator's own ceiling.

``python -m loadtest.bench.fastserver --port 9100 [--interval-ms 20]`` answers every POST with an
OpenAI-shaped SSE stream of exactly ``max_tokens`` one-token events (read from the body), a
finish event, a usage event and ``[DONE]``, over HTTP/1.1 keep-alive with chunked encoding. With
``--interval-ms 0`` the events go out at once (the client's parsing rate is the only limit);
with an interval they are paced like an engine's decode steps, to test many slow streams at once.
It does no JSON decoding and no model work, so the client is always the slower side.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import cast

__all__ = ["FastSSE", "main", "serve"]

_MAX_TOKENS = re.compile(rb'"max_(?:completion_)?tokens":\s*(\d+)')
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
_FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _tail(n: int) -> bytes:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\n' % n
    return _chunk(_FINISH + usage + b"data: [DONE]\n\n") + b"0\r\n\r\n"


class FastSSE(asyncio.Protocol):
    """One connection: parse requests (headers + Content-Length body), stream answers."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        m = re.search(rb"content-length:\s*(\d+)", head)
        length = int(m.group(1)) if m else 0
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        mt = _MAX_TOKENS.search(body)
        n = int(mt.group(1)) if mt else 16
        self.busy = True
        if self.interval <= 0:
            self._write(_HEAD + _chunk(_TOKEN * n) + _tail(n))
            self._done()
        else:
            self._write(_HEAD)
            asyncio.get_running_loop().call_later(self.interval, self._paced, n, n)

    def _paced(self, left: int, n: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self._write(_chunk(_TOKEN))
        if left > 1:
            asyncio.get_running_loop().call_later(self.interval, self._paced, left - 1, n)
        else:
            self._write(_tail(n))
            self._done()

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _done(self) -> None:
        self.busy = False
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, interval_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FastSSE(interval_ms / 1000), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.fastserver", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9100, help="port (default 9100)")
    p.add_argument(
        "--interval-ms",
        type=float,
        default=0.0,
        help="pause between token events; 0 sends them at once (default 0)",
    )
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(a.host, a.port, a.interval_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
