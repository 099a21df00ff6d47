"""A lean HTTP/1.1 client for the proxy hop: asyncio protocols, httptools parsing, keep-alive pools.

Why not aiohttp here: profiled under load on this machine, aiohttp's ``ClientSession._request``
path took ~40% of a gateway worker's CPU (request objects, cookie and header machinery, payload
writers), capping one worker near 3,500 requests/s. This client does only what a proxy hop needs:
one pre-framed write per request, a C parser for the response, body chunks handed over as they
arrive, and connections reused per backend. aiohttp remains available behind the same interface
(``server.upstream_client: aiohttp``).

Per backend origin there is one :class:`_HostPool` of idle connections; a connection carries one
exchange at a time. A request that fails on a reused connection before any response byte (the
backend closed it while idle) is retried once on a fresh connection: nothing was processed.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httptools

from gateway.deadlines import wheel
from gateway.upstream.errors import (
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamFirstByteTimeout,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamTotalTimeout,
)
from gateway.upstream.headers import response_headers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.types import RawHeaders

__all__ = ["H1Response", "H1Upstream"]

_HIGH_WATER = 256 * 1024  # pause reading from the backend when this much is unconsumed
_LOW_WATER = 64 * 1024


class _Exchange:
    """One request's response as it arrives: headers, then body parts, then completion."""

    __slots__ = (
        "buffered",
        "complete",
        "deadline",
        "error",
        "got_bytes",
        "headers",
        "headers_done",
        "keep_alive",
        "parts",
        "status",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self.status = 0
        self.headers: RawHeaders = []
        self.headers_done: asyncio.Future[None] = loop.create_future()
        self.parts: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = deadline

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self.complete or self.error is not None:
            return
        self.error = exc
        if not self.headers_done.done():
            self.headers_done.set_exception(exc)
        self.wake()


class _Connection(asyncio.Protocol):
    """A keep-alive connection to one backend; parser callbacks fill the current exchange."""

    def __init__(self, pool: _HostPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reused = False
        self.paused = False

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # bytes with no request outstanding: the connection is unusable
            self.close()
            return
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.fail(UpstreamProtocolError(f"invalid HTTP from backend: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        ex = self.exchange
        if ex is not None and not ex.complete:
            ex.fail(UpstreamProtocolError("backend closed the connection mid-response"))

    # --- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.exchange is not None
        self.exchange.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        ex.status = self.parser.get_status_code()
        if not ex.headers_done.done():
            ex.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        assert ex is not None
        ex.parts.append(body)
        ex.buffered += len(body)
        if ex.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        ex.keep_alive = self.parser.should_keep_alive()
        ex.complete = True
        ex.wake()

    # --- use
    def send(self, data: bytes, exchange: _Exchange) -> None:
        assert self.transport is not None
        self.exchange = exchange
        self.transport.write(data)

    def consumed(self, n: int) -> None:
        ex = self.exchange
        assert ex is not None
        ex.buffered -= n
        if self.paused and ex.buffered < _LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _HostPool:
    """Idle keep-alive connections to one origin (scheme, host, port)."""

    def __init__(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, keep: int
    ) -> None:
        self.host, self.port, self.ssl = host, port, ssl_context
        self.keep = keep
        self.idle: list[_Connection] = []
        self.open = 0

    async def connect(self, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError as exc:
            raise UpstreamConnectTimeout(f"connecting to backend took over {timeout}s") from exc
        except OSError as exc:
            # the errno's text only: the OS error's own message names the internal address
            reason = exc.strerror or type(exc).__name__
            if "(" in reason:
                reason = reason.split("(")[0].strip()
            raise UpstreamConnectError(f"cannot connect to backend: {reason}") from exc
        self.open += 1
        return conn

    def take_idle(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        conn.exchange = None
        if conn.closed or len(self.idle) >= self.keep:
            conn.close()
        else:
            self.idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self.open -= 1
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()

    def __repr__(self) -> str:
        return f"<_HostPool {self.host}:{self.port} [open: {self.open} | idle: {len(self.idle)}]>"


class _Target:
    """A parsed upstream URL with its request line and Host header pre-encoded."""

    __slots__ = ("head", "pool")

    def __init__(self, pool: _HostPool, head: bytes) -> None:
        self.pool, self.head = pool, head


class H1Response:
    """A backend's response, headers received, body not yet read.

    Per request and not shared. The caller must call :meth:`close` (idempotent) on every path;
    closing before the body is complete closes the connection, which is how the backend learns
    that the client went away. A complete keep-alive exchange returns the connection to its pool.
    """

    __slots__ = ("_closed", "_conn", "_ex", "_idle", "headers", "is_event_stream", "is_stream",
                 "status")

    def __init__(self, conn: _Connection, ex: _Exchange, idle: float) -> None:
        self._conn, self._ex, self._idle = conn, ex, idle
        self._closed = False
        self.status = ex.status
        self.headers = response_headers(ex.headers)
        content_type = b""
        length = False
        for name, value in ex.headers:
            lname = name.lower()
            if lname == b"content-type":
                content_type = value
            elif lname == b"content-length":
                length = True
        self.is_event_stream = content_type.split(b";", 1)[0].strip().lower() == (
            b"text/event-stream"
        )
        self.is_stream = self.is_event_stream or not length

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next body part, None at the end; waits at most ``timeout`` (default: idle)."""
        return await self._next(self._idle if timeout is None else timeout)

    async def _next(self, idle: float) -> bytes | None:
        """The next body part, None at the end; waits at most ``idle`` seconds."""
        ex = self._ex
        while True:
            if ex.parts:
                part = ex.parts.popleft()
                self._conn.consumed(len(part))
                return part
            if ex.error is not None:
                raise ex.error
            if ex.complete:
                return None
            now = time.monotonic()
            wait = min(idle, ex.deadline - now)
            if wait <= 0:
                raise UpstreamTotalTimeout("the request's total time ran out")
            loop = asyncio.get_running_loop()
            ex.waiter = waiter = loop.create_future()
            deadlines = wheel(loop)
            timer = deadlines.add(wait, waiter.cancel)
            try:
                await waiter
            except asyncio.CancelledError:
                if not waiter.cancelled() or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
                if time.monotonic() >= ex.deadline:
                    raise UpstreamTotalTimeout("the request's total time ran out") from None
                raise UpstreamIdleTimeout(f"backend went silent for {idle:g}s") from None
            finally:
                deadlines.cancel(timer)
                ex.waiter = None

    async def read(self) -> bytes:
        """The whole body (non-streaming responses)."""
        parts = []
        while (part := await self._next(self._idle)) is not None:
            parts.append(part)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked framing already removed)."""
        while (part := await self._next(self._idle)) is not None:
            yield part

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ex, conn = self._ex, self._conn
        if ex.complete and ex.keep_alive and ex.error is None and not conn.closed:
            conn.pool.give_back(conn)
        else:
            conn.exchange = None
            conn.close()


class H1Upstream:
    """The process's HTTP/1.1 client for backends (``server.upstream_client: native``)."""

    def __init__(self, timeouts: Timeouts, keepalive_per_backend: int = 256) -> None:
        self._timeouts = timeouts
        self._keep = keepalive_per_backend
        self._pools: dict[tuple[str, str, int], _HostPool] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl: ssl.SSLContext | None = None

    async def start(self) -> None:
        """Nothing to open up front: connections are made on first use and then kept."""

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._targets.clear()

    def _target(self, method: bytes, url: str) -> _Target:
        key = method.decode() + " " + url
        target = self._targets.get(key)
        if target is not None:
            return target
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if secure else 80)
        origin = (parts.scheme, host, port)
        pool = self._pools.get(origin)
        if pool is None:
            if secure and self._ssl is None:
                self._ssl = ssl.create_default_context()
            pool = _HostPool(host, port, self._ssl if secure else None, self._keep)
            self._pools[origin] = pool
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        netloc = host if parts.port is None else f"{host}:{port}"
        head = method + b" " + path.encode() + b" HTTP/1.1\r\nhost: " + netloc.encode() + b"\r\n"
        target = self._targets[key] = _Target(pool, head)
        return target

    async def post(
        self, url: str, body: bytes, headers: RawHeaders, timeouts: Timeouts | None = None
    ) -> H1Response:
        """Send a POST and wait for the response headers.

        Connect errors are :class:`UpstreamConnectError` (safe to retry: nothing was sent);
        no response headers within ``timeouts.first_token`` is :class:`UpstreamFirstByteTimeout`.
        """
        return await self._request(b"POST", url, body, headers, timeouts or self._timeouts)

    async def _request(
        self, method: bytes, url: str, body: bytes, headers: RawHeaders, t: Timeouts
    ) -> H1Response:
        target = self._target(method, url)
        lines = [target.head, b"content-length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        lines += (b"\r\n", body)
        data = b"".join(lines)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + t.total
        pool = target.pool
        for attempt in (0, 1):
            conn = pool.take_idle() or await pool.connect(t.connect)
            ex = _Exchange(loop, deadline)
            conn.send(data, ex)
            deadlines = wheel(loop)
            timer = deadlines.add(min(t.first_token, t.total), ex.headers_done.cancel)
            try:
                await ex.headers_done
            except asyncio.CancelledError:
                conn.exchange = None
                conn.close()
                if ex.headers_done.cancelled() and not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise UpstreamFirstByteTimeout(
                        f"no response from backend within {t.first_token}s"
                    ) from None
                raise
            except UpstreamProtocolError:
                conn.exchange = None
                conn.close()
                if attempt == 0 and conn.reused and not ex.got_bytes:
                    continue  # a stale keep-alive connection: retry once on a fresh one
                raise
            finally:
                deadlines.cancel(timer)
            return H1Response(conn, ex, t.idle)
        raise AssertionError("unreachable")

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """A low-rate GET (health checks, engine metrics): status and body, or UpstreamError."""
        try:
            async with asyncio.timeout(timeout):
                response = await self._request(b"GET", url, b"", [], self._timeouts)
                try:
                    body = await response.read()
                finally:
                    response.close()
        except TimeoutError as exc:
            raise UpstreamFirstByteTimeout(f"GET timed out after {timeout}s") from exc
        return response.status, body

    def __repr__(self) -> str:
        return f"<H1Upstream {list(self._pools.values())!r}>"
