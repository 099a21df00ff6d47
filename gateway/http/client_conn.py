"""The native client's wire: keep-alive connections to backends and the parsing of answers.

A :class:`_Connection` (an asyncio protocol) feeds a backend's bytes to httptools and fills the
:class:`_Exchange` of the request it carries; :class:`_HostPool` keeps the idle ones of one
origin. Here the pool invariant of :mod:`gateway.http.client` is kept: interim heads skipped,
a byte past the final message closes the connection, trailers dropped, the head capped while
it arrives. The classes keep the private names they had in :mod:`gateway.http.client`: leak
checks (``tests/http/test_stream_teardown.py``) count ``_Connection`` and ``_Exchange`` by name.
"""

from __future__ import annotations

import asyncio
import collections
import select
from typing import TYPE_CHECKING

import httptools

from gateway.http.base import DEFAULT_LIMITS
from gateway.http.errors import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamConnectTimeout,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
)

if TYPE_CHECKING:
    import ssl

    from gateway.http.base import ResponseLimits
    from gateway.types import RawHeaders

__all__ = ["_Connection", "_Exchange", "_HostPool"]

_HIGH_WATER = 256 * 1024  # pause reading from the backend when this much is unconsumed
_LOW_WATER = 64 * 1024
_NONE: tuple[int, ...] = ()


class _Detached:
    """Callbacks of no connection: what a closed connection's parser is replaced with."""


#: a parser bound to no connection, for closed ones (never fed again)
_NO_PARSER = httptools.HttpResponseParser(_Detached())


class _Stop(Exception):
    """Raised in a parser callback to halt httptools at once; the reason is already recorded."""


class _Exchange:
    """One request's response as it arrives: headers, then body parts, then completion.

    ``status`` stays 0 until the *final* response's head is complete (interim 1xx heads leave
    it at 0), which is how the callbacks tell head from body and trailers.
    """

    __slots__ = (
        "buffered",
        "complete",
        "deadline",
        "error",
        "got_bytes",
        "head_bytes",
        "header_bytes",
        "headers",
        "headers_done",
        "keep_alive",
        "length",
        "n_headers",
        "parts",
        "status",
        "te",
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
        self.head_bytes = 0  # raw bytes of segments that ended inside the head
        self.header_bytes = 0  # bytes of header names and values
        self.n_headers = 0
        self.length = -1  # Content-Length, -1 when absent
        self.te: bytes | None = None  # Transfer-Encoding, as sent

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """Record the first failure; a complete exchange keeps its answer."""
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
        self.limits = pool.limits
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.fd: tuple[int, ...] = _NONE
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reused = False
        self.paused = False

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = (sock.fileno(),)

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None or ex.complete:
            # a byte outside an exchange or after its final message: it is nobody's answer,
            # and the connection is no longer at a message boundary
            self.close()
            return
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # invalid bytes, or a callback stopped the parser having recorded why; a complete
            # exchange (extra bytes after its end) keeps its answer, the connection goes
            ex.fail(UpstreamProtocolError(f"invalid HTTP from backend: {exc}"))
            self.close()
            return
        if ex.status == 0 and ex.error is None:
            # still inside the head: bound it while it arrives (one long line included)
            ex.head_bytes += len(data)
            if ex.head_bytes > self.limits.max_head:
                ex.fail(UpstreamResponseTooLarge(
                    f"response head over {self.limits.max_head} bytes"))
                self.close()

    def eof_received(self) -> bool | None:
        ex = self.exchange
        if (ex is not None and ex.status and not ex.complete and ex.error is None
                and ex.length < 0 and ex.te is None):
            # a close-delimited body ends here, cleanly; never pooled (keep_alive False)
            ex.keep_alive = False
            ex.complete = True
            ex.wake()
        return None  # the transport closes; connection_lost fails whatever is incomplete

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # the parser holds bound methods of this connection: break the cycle so a closed
        # connection (and its transport) is freed now, by reference counting, not whenever
        # the cyclic collector next runs a full pass
        self.parser = _NO_PARSER
        self.pool.forget(self)
        ex = self.exchange
        if ex is not None and not ex.complete:
            ex.fail(UpstreamConnectionLost("backend closed the connection mid-response"))
        self.exchange = None

    # --- httptools callbacks
    def on_message_begin(self) -> None:
        ex = self.exchange
        assert ex is not None
        if ex.complete:  # a second message after the final one, in the same segment
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        ex = self.exchange
        assert ex is not None
        if ex.status:  # a chunked trailer: framing metadata, never a response header
            return
        ex.n_headers += 1
        ex.header_bytes += len(name) + len(value)
        limits = self.limits
        if ex.n_headers > limits.max_headers or ex.header_bytes > limits.max_head:
            ex.fail(UpstreamResponseTooLarge(
                f"response head over {limits.max_headers} headers or {limits.max_head} bytes"))
            raise _Stop
        n = len(name)
        if n == 14 and name.lower() == b"content-length":
            ex.length = int(value)  # llhttp has checked it is digits, and that there is one
        elif n == 17 and name.lower() == b"transfer-encoding":
            ex.te = value
        ex.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        status = self.parser.get_status_code()
        if status >= 200:
            if ex.te is not None and ex.te.strip().lower() != b"chunked":
                ex.fail(UpstreamProtocolError("unsupported transfer-encoding from backend"))
                raise _Stop
            ex.status = status
            if not ex.headers_done.done():
                ex.headers_done.set_result(None)
        elif status >= 100 and status != 101:
            # an interim response (100 Continue, 103 Early Hints): skip it, parse on
            ex.headers.clear()
            ex.length, ex.te = -1, None
        else:
            ex.fail(UpstreamProtocolError(f"backend answered status {status}"))
            raise _Stop

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
        if ex.status == 0:  # the end of an interim response: the final one is still to come
            return
        ex.keep_alive = self.parser.should_keep_alive()
        ex.complete = True
        ex.wake()

    # --- use
    def usable(self) -> bool:
        """Idle and untouched: open, and nothing (no EOF, no byte) waiting to be read."""
        if self.closed:
            return False
        try:
            return not select.select(self.fd, _NONE, _NONE, 0)[0]
        except (OSError, ValueError):
            return False

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
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        keep: int,
        limits: ResponseLimits = DEFAULT_LIMITS,
    ) -> None:
        self.host, self.port, self.ssl = host, port, ssl_context
        self.keep = keep
        self.limits = limits
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
            raise UpstreamConnectTimeout(
                f"connecting to backend took over {timeout}s", detail=f"{timeout:g}s"
            ) from exc
        except OSError as exc:
            # the errno's text only: the OS error's own message names the internal address
            reason = exc.strerror or type(exc).__name__
            if "(" in reason:
                reason = reason.split("(")[0].strip()
            raise UpstreamConnectError(
                f"cannot connect to backend: {reason}", detail=f"cannot connect: {reason}"
            ) from exc
        self.open += 1
        return conn

    def take_idle(self) -> _Connection | None:
        """The most recently used idle connection that is still usable; stale ones are closed."""
        while self.idle:
            conn = self.idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        return None

    def give_back(self, conn: _Connection) -> None:
        """Keep ``conn`` for reuse; callers hand it over only at a message boundary."""
        conn.exchange = None
        if conn.closed or len(self.idle) >= self.keep:
            conn.close()
            return
        if conn.paused and conn.transport is not None:  # an unread body was dropped
            conn.paused = False
            conn.transport.resume_reading()
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
