"""A lean HTTP/1.1 client for the proxy hop: asyncio protocols, httptools parsing, keep-alive pools.

Why not aiohttp here: profiled under load on this machine, aiohttp's ``ClientSession._request``
path took ~40% of a gateway worker's CPU (request objects, cookie and header machinery, payload
writers), capping one worker near 3,500 requests/s. This client does only what a proxy hop needs:
one pre-framed write per request, a C parser for the response, body chunks handed over as they
arrive, and connections reused per backend. aiohttp remains available behind the same interface
(``server.upstream_client: aiohttp``).

Per backend origin there is one :class:`_HostPool` of idle connections; a connection carries one
exchange at a time. The invariant that keeps one tenant's answer from reaching another:

    **a connection returns to the pool only at a message boundary with no unread byte.**

It is held by construction, not by special cases:

* interim responses (100, 103, any 1xx but 101) are parsed and skipped: only a final status
  (>= 200) completes the head, and only the final message's end completes the exchange;
  101 (a protocol switch nobody asked for) is a protocol error;
* a byte that arrives after the final message ended - in the same segment (the parser is
  stopped at the next message's first byte) or in a later one, or while the connection sits
  idle - closes the connection; the answer already complete is not touched. (llhttp consumes
  bare CR/LF between messages as padding without a callback; they carry no response and leave
  no unread byte, so they do not count);
* chunked trailers are dropped, never merged into the response headers;
* a close-delimited body (HTTP/1.0, or no Content-Length and no chunked) ends at the backend's
  clean EOF, and such a connection is never pooled; a Transfer-Encoding other than ``chunked``
  is refused (RFC 9112 6.3 would read it to EOF, but a proxy cannot relay a coding it does
  not undo, and h11, our reference parser, refuses it too);
* llhttp runs strict: a bare CR or LF as a line end, obs-fold, control bytes in a header,
  Content-Length with Transfer-Encoding are all refused (its only leniency switch for bare LF
  also accepts it after chunk data, a framing desync; h11 and aiohttp accept a bare LF
  line end, RFC 9112 2.2 allows refusing it);
* caps (:class:`~gateway.http.base.ResponseLimits`) bound the head while it is still
  arriving and a body read whole; over a cap the exchange fails and the connection closes.

Re-sending after a failure on a reused connection. Before reusing an idle connection, a
zero-timeout poll checks that the backend has not closed it (or sent anything) meanwhile: the
event loop may not have run its EOF callback yet. Such a connection is discarded before any byte
is written, so a fresh one is used and nothing can have been processed twice. Once the request
has been written, a failure with no response byte is ambiguous: the backend may have closed an
idle connection just as we wrote (nothing ran), or run the request and died before answering (it
ran, and billed). Go's net/http resolves this the same way: it resends only what it knows was
not processed (``nothingWrittenError``, and ``errServerClosedIdle`` only for replayable
requests). So the request is sent again once on a fresh connection only if it is replayable:
an idempotent method (GET, HEAD) or a request carrying an ``Idempotency-Key`` (or
``X-Idempotency-Key``) header, by which the client says a duplicate is harmless. A plain POST
that fails this way raises :class:`UpstreamConnectionLost`; the retry policy above decides.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.http.base import DEFAULT_LIMITS
from gateway.http.client_conn import _Connection, _Exchange, _HostPool
from gateway.http.errors import (
    UpstreamFirstByteTimeout,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
    UpstreamTotalTimeout,
)
from gateway.http.headers import response_headers
from gateway.timers.deadlines import wheel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.http.base import ResponseLimits
    from gateway.types import RawHeaders

__all__ = ["H1Response", "H1Upstream"]

_REPLAYABLE_METHODS = frozenset({b"GET", b"HEAD"})
_IDEMPOTENCY_HEADERS = frozenset({b"idempotency-key", b"x-idempotency-key"})


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
        for name, value in ex.headers:
            if len(name) == 12 and name.lower() == b"content-type":
                content_type = value
        self.is_event_stream = content_type.split(b";", 1)[0].strip().lower() == (
            b"text/event-stream"
        )
        # only an event stream is relayed as it arrives; any other body is read whole, so a
        # break midway is an error before the client's first byte (see UpstreamResponse)
        self.is_stream = self.is_event_stream

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
                raise UpstreamIdleTimeout(
                    f"backend went silent for {idle:g}s", detail=f"{idle:g}s"
                ) from None
            finally:
                deadlines.cancel(timer)
                ex.waiter = None

    async def read(self) -> bytes:
        """The whole body (non-streaming responses), at most ``ResponseLimits.max_body`` bytes."""
        cap = self._conn.limits.max_body
        if self._ex.length > cap:
            self._too_large(cap)
        parts = []
        size = 0
        while (part := await self._next(self._idle)) is not None:
            size += len(part)
            if size > cap:
                self._too_large(cap)
            parts.append(part)
        return b"".join(parts)

    def _too_large(self, cap: int) -> None:
        exc = UpstreamResponseTooLarge(f"response body over {cap} bytes")
        self._ex.fail(exc)
        self._closed = True
        self._conn.exchange = None
        self._conn.close()  # never reused, even if the rest did arrive
        raise exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked framing already removed)."""
        while (part := await self._next(self._idle)) is not None:
            yield part

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ex, conn = self._ex, self._conn
        # the pool invariant: only a finished keep-alive exchange, on a connection that has
        # seen no byte past its end (such a byte closes it at once), is reused
        if (ex.complete and ex.keep_alive and ex.error is None and not conn.closed
                and conn.exchange is ex):
            conn.pool.give_back(conn)
        else:
            conn.exchange = None
            conn.close()


class H1Upstream:
    """The process's HTTP/1.1 client for backends (``server.upstream_client: native``)."""

    def __init__(
        self,
        timeouts: Timeouts,
        keepalive_per_backend: int = 256,
        limits: ResponseLimits = DEFAULT_LIMITS,
    ) -> None:
        self._timeouts = timeouts
        self._keep = keepalive_per_backend
        self._limits = limits
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
            pool = _HostPool(host, port, self._ssl if secure else None, self._keep, self._limits)
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
                        f"no response from backend within {t.first_token}s",
                        detail=f"{t.first_token:g}s",
                    ) from None
                raise
            except UpstreamProtocolError:
                conn.exchange = None
                conn.close()
                if attempt == 0 and conn.reused and not ex.got_bytes and _replayable(
                    method, headers
                ):
                    continue  # a duplicate is harmless: once more on a fresh connection
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


def _replayable(method: bytes, headers: RawHeaders) -> bool:
    """Safe to send twice: an idempotent method, or the client declared an idempotency key."""
    return method in _REPLAYABLE_METHODS or any(
        name.lower() in _IDEMPOTENCY_HEADERS for name, _ in headers
    )
