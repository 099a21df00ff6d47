"""A recording reverse proxy between a coding agent and the gateway (tests/agents).

Every request the agent sends is relayed as it comes and its answer relayed back chunk by chunk
(a stream stays a stream); each exchange is kept: method, path, the request's headers
(credentials masked) and body, the answer's status, headers and body (a streamed body in full,
so an error event inside a stream is seen too). A test reads ``exchanges`` to know what the
agent sent, which request ids the gateway answered, and what failed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["Exchange", "RecordingProxy"]

#: headers never relayed either way (hop-by-hop, or set again by the side that sends)
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "content-encoding"}
_SECRET = {"authorization", "x-api-key", "api-key"}


@dataclass
class Exchange:
    """One request of the agent and the gateway's answer."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float = field(default_factory=time.monotonic)
    status: int | None = None
    answer_headers: dict[str, str] = field(default_factory=dict)
    answer: bytearray = field(default_factory=bytearray)
    error: str | None = None

    @property
    def request_id(self) -> str | None:
        """The gateway's ``x-request-id`` for this request."""
        return self.answer_headers.get("x-request-id")

    def json(self) -> Any:
        """The request body as JSON (None when it is not)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def answer_text(self) -> str:
        return self.answer.decode(errors="replace")

    def summary(self, limit: int = 600) -> str:
        """A line for failure messages and reports: what was sent, what came back."""
        text = self.answer_text()
        cut = text if len(text) <= limit else text[:limit] + "..."
        return f"{self.method} {self.path} -> {self.status} {cut!r}"


class RecordingProxy:
    """``with RecordingProxy(target) as proxy:`` point the agent at ``proxy.url``."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def clear(self) -> list[Exchange]:
        """Forget what was recorded (returning it)."""
        with self._lock:
            old, self.exchanges = self.exchanges, []
        return old

    def snapshot(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        shown = {k.lower(): ("***" if k.lower() in _SECRET else v) for k, v in headers.items()}
        ex = Exchange(request.method, request.path_qs, shown, body)
        with self._lock:
            self.exchanges.append(ex)
        try:
            upstream = await self._session.request(
                request.method, self.target + request.path_qs, data=body,
                headers={**headers, "accept-encoding": "identity"}, allow_redirects=False)
        except aiohttp.ClientError as exc:
            ex.status, ex.error = 502, repr(exc)
            return web.Response(status=502, text=f"proxy: {exc!r}")
        async with upstream:
            ex.status = upstream.status
            ex.answer_headers = {k.lower(): v for k, v in upstream.headers.items()}
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    ex.answer += chunk
                    await out.write(chunk)
                await out.write_eof()
            except (aiohttp.ClientError, ConnectionResetError) as exc:
                ex.error = repr(exc)  # the gateway's side broke, or the agent went away
            return out

    def start(self) -> RecordingProxy:
        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_read=300), auto_decompress=False)

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(serve())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="agent-proxy", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def close() -> None:
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
