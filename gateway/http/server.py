"""A lean HTTP/1.1 server protocol for uvicorn: the same ASGI app, less work per request.

uvicorn keeps doing what it does well (sockets, workers, signals, lifespan, the date header,
graceful drain); this module replaces only its per-connection protocol class
(``uvicorn.Config(http=GatewayH1Protocol)``). Why: measured on this project's 2-core box with
the proxy pinned to one core, a raw-ASGI hello-world under uvicorn's httptools protocol serves
~34,500 requests/s (29 µs a request) where a bare httptools protocol serves ~95,000 (10 µs). A
gateway request spends ~165 µs in total, so those ~19 µs, plus one ``send`` system call saved
per response (uvicorn writes the status line and headers as soon as the app starts its response,
then the body in a second write; this protocol writes both at once when the body is complete),
are a real share of it. ``server.http_protocol: uvicorn`` switches back.

What it does, per connection: parse with httptools (llhttp, the parser uvicorn uses), cap the
request line and headers (431/414 instead of unbounded buffering: the cap counts raw bytes as
they arrive, so one endless header line is refused after ``MAX_HEAD_BYTES``, not buffered whole
first), run one ASGI task per request
with requests handled strictly in order (pipelined requests wait, and reading pauses), feed the
body through ``receive`` with read back-pressure, frame responses with Content-Length or chunked
encoding, wait on write back-pressure in ``send``, report ``http.disconnect`` when the client
goes, honour keep-alive and ``Connection: close``, answer ``Expect: 100-continue``, and enforce
the bounds of ``server.limits`` (:class:`~gateway.config.model.ClientLimits`): connections idle
past the keep-alive timeout are closed (bytes that start no request, bare CRLFs, are not
activity), a request head or body slower than its timeout gets 408 and a close, and beyond
``max_connections`` a new connection gets 503 and a close. One sweep a second per process checks
the timeouts instead of a timer per request. A request that cannot be parsed, in its head or
its body (bad chunked framing), gets 400 and a close. ``shutdown`` (uvicorn's graceful drain)
closes idle connections at once and the others after their current response; a response the
app leaves unfinished (the relay's total deadline, say) aborts the connection, so a client that
stopped reading cannot keep it open with the unsent rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools

from gateway.config.model import ClientLimits
from gateway.http.head import (
    MAX_HEAD_BYTES,
    MAX_RAW_HEAD_BYTES,
    HeadMeter,
    HeadTooLarge,
    error_response,
)
from gateway.http.server_exchange import _Exchange
from gateway.http.sweeper import Sweeper, sweepers

if TYPE_CHECKING:
    from collections.abc import Callable

    from uvicorn.config import Config
    from uvicorn.server import ServerState

__all__ = [
    "MAX_HEAD_BYTES",
    "MAX_RAW_HEAD_BYTES",
    "GatewayH1Protocol",
    "HeadMeter",
    "HeadTooLarge",
    "error_response",
]

log = logging.getLogger("gateway.http.uvicorn")

#: body bytes buffered ahead of the app before reading pauses
READ_HIGH_WATER = 1024 * 1024
#: pipelined requests parsed ahead of the one running before reading pauses
MAX_PIPELINE = 16

_ASGI = {"version": "3.0", "spec_version": "2.4"}


class _Detached:
    """Callbacks of no connection: what a closed connection's parser is replaced with."""


#: a parser bound to no protocol, for closed connections (never fed: ``data_received``
#: returns early once the connection is lost)
_NO_PARSER = httptools.HttpRequestParser(_Detached())


class GatewayH1Protocol(asyncio.Protocol):
    """uvicorn's HTTP protocol slot, filled by a leaner HTTP/1.1 implementation.

    ``limits`` (the policy's ``server.limits``) is bound with ``functools.partial`` by
    :func:`gateway.http.uvicorn.uvicorn_options`; uvicorn passes the rest.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        limits: ClientLimits | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.app: Callable[..., Any] = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.app_state = app_state
        self.root_path = config.root_path
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "https" if config.is_ssl else "http"
        self.lost = False
        self.closing = False
        self.read_paused = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.active: _Exchange | None = None
        self._parsing: _Exchange | None = None
        self._pipeline: deque[_Exchange] = deque()
        self._discarding: _Exchange | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._head_started: float | None = None
        self._meter = HeadMeter()
        self.limits = limits or ClientLimits(keep_alive_timeout=config.timeout_keep_alive)
        self.last_io = 0.0
        self.idle_since = 0.0  # when the connection last became idle (no request under way)
        self._date_src: object = None
        self._date_head = b""
        sweeper = sweepers.get(self.loop)
        if sweeper is None or sweeper.task.done():
            sweeper = sweepers[self.loop] = Sweeper(self.loop, self.limits)
        elif self.limits is not sweeper.limits:
            sweeper.fit(self.limits)
        self._sweeper = sweeper

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        cap = self.limits.max_connections
        if cap is not None and len(self.server_state.connections) >= cap:
            # over the limit: answer at once, hold nothing (not tracked, never parsed)
            self.lost = True
            self.transport.write(error_response(503, "too many open connections"))
            self.transport.close()
            return
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self._sweeper.connections.add(self)
        self.last_io = self.idle_since = self.loop.time()
        server = transport.get_extra_info("sockname")
        client = transport.get_extra_info("peername")
        self.server = (str(server[0]), int(server[1])) if isinstance(server, tuple) else None
        self.client = (str(client[0]), int(client[1])) if isinstance(client, tuple) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        # the parser holds bound methods of this protocol: a reference cycle that, left in
        # place, only the cyclic collector frees, and with the worker's raised thresholds
        # (``tune_gc``) that is rarely; every closed connection kept its transport, parser and
        # buffers until then (~27 objects, a few KB a connection, growing RSS per cycle)
        self.parser = _NO_PARSER
        self.server_state.connections.discard(self)
        self._sweeper.connections.discard(self)
        for ex in (self.active, self._parsing, *self._pipeline):
            if ex is not None:
                ex.wake()
        self._pipeline.clear()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def eof_received(self) -> None:
        """Half-close from the client: the in-flight response may still be sent."""

    def data_received(self, data: bytes) -> None:
        if self.lost:
            return
        self.last_io = self.loop.time()
        try:
            self._meter.feed(self.parser.feed_data, data)
        except HeadTooLarge as exc:
            self._fail(exc.status, exc.message)
        except httptools.HttpParserUpgrade:
            # no protocol upgrades here: answer the request as plain HTTP/1.1, then close
            for ex in (self.active, *self._pipeline):
                if ex is not None:
                    ex.keep_alive = False
        except httptools.HttpParserError as exc:
            # httptools wraps what a callback raised; ours says which limit was hit
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, HeadTooLarge):
                self._fail(cause.status, cause.message)
            else:
                self._fail(400, f"malformed HTTP request: {str(exc)[:200]}")

    def _fail(self, status: int, message: str) -> None:
        """A request we cannot parse or that broke a limit, in its head or its body: answer it
        (unless its response is already under way) and close. From here the connection counts
        as lost: the app's ``receive`` reports a disconnect, its ``send`` writes nothing."""
        if self.lost:
            return
        active = self.active
        if active is None or not active.head_sent:
            self.transport.write(error_response(status, message))
        self._close()
        self.lost = True
        for ex in (active, self._parsing, *self._pipeline):
            if ex is not None:
                ex.wake()

    def _close(self) -> None:
        if not self.lost and not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        """Close without flushing: what is unsent belongs to a response that cannot finish."""
        if not self.lost:
            self.transport.abort()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self._drain
        if drain is not None:
            self._drain = None
            if not drain.done():
                drain.set_result(None)

    async def drain(self) -> None:
        if self._drain is None:
            self._drain = self.loop.create_future()
        await self._drain

    def resume_reading(self) -> None:
        """Read on, unless a pipelined request is already waiting its turn."""
        if self.read_paused and not self._pipeline and not self.lost:
            self.read_paused = False
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self.read_paused and not self.lost:
            self.read_paused = True
            self.transport.pause_reading()

    def default_head(self) -> bytes:
        """uvicorn's default headers (the ``date`` it refreshes each second), as bytes."""
        src = self.server_state.default_headers
        if src is not self._date_src:
            self._date_src = src
            self._date_head = b"".join(n + b": " + v + b"\r\n" for n, v in src)
        return self._date_head

    def check_idle(self, now: float) -> None:
        """Called by the sweeper: close an idle connection, answer 408 to a slow head or body."""
        if self.lost:
            return
        limits = self.limits
        if self._head_started is not None:
            if now - self._head_started > limits.header_timeout:
                self._fail(408, "request headers not received in time")
            return
        body = self._parsing
        if body is not None and not body.complete:
            if self.read_paused:
                body.body_since = now  # we are not reading: the client is not to blame
            elif now - body.body_since > limits.body_timeout:
                if body is self._discarding:
                    self._close()  # answered already: only the unread rest is late
                else:
                    self._fail(408, "request body not received in time")
            return
        if self.active is None and now - self.idle_since > limits.keep_alive_timeout:
            self._close()

    def shutdown(self) -> None:
        """uvicorn's graceful drain: close when idle, else after the current response."""
        self.closing = True
        if self.active is None:
            self._close()
        else:
            for ex in self._pipeline:
                ex.keep_alive = False
            self.active.keep_alive = False

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._meter.message_done()  # a new head begins here, whatever came before it
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._head_started = self.last_io

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge(414, "request URL too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge(431, "request headers too large")
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._meter.head_done()
        self._head_started = None
        parser = self.parser
        url = self._url
        if url[:1] == b"/":
            raw_path, _, query = url.partition(b"?")
        elif url == b"*":
            raw_path, query = url, b""
        else:  # absolute-form (a client talking to us as to a proxy)
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"/", parsed.query or b""
        text = raw_path.decode("latin-1")
        path = unquote(text) if "%" in text else text
        headers = self._headers
        expect = False
        for name, value in headers:
            if name == b"expect" and value.lower() == b"100-continue":
                expect = True
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": parser.get_http_version(),
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": headers,
            "state": self.app_state.copy(),
        }
        keep_alive = parser.should_keep_alive() and not self.closing
        ex = _Exchange(self, scope, keep_alive, expect)
        self._parsing = ex
        self.server_state.total_requests += 1
        if self.active is None:
            self._start(ex)
        else:
            self._pipeline.append(ex)
            if len(self._pipeline) >= MAX_PIPELINE:
                self._pause_reading()

    def on_body(self, body: bytes) -> None:
        ex = self._parsing
        if ex is None or ex is self._discarding:
            return
        ex.body.append(body)
        ex.buffered += len(body)
        if ex.buffered > READ_HIGH_WATER:
            self._pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        self._meter.message_done()
        ex = self._parsing
        if ex is None:
            return
        self._parsing = None
        ex.complete = True
        if ex is self._discarding:
            self._close()
            return
        ex.wake()
        if self.active is not None and self.active is not ex:
            # a pipelined request is complete: stop reading until its turn comes
            self._pause_reading()

    # -- running requests ------------------------------------------------------------------

    def _start(self, ex: _Exchange) -> None:
        self.active = ex
        # kept referenced by uvicorn's task set, which it cancels when the drain times out
        task = self.loop.create_task(self._run(ex))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, ex: _Exchange) -> None:
        try:
            await self.app(ex.scope, ex.receive, ex.send)
        except asyncio.CancelledError:
            self._close()  # the drain timed out: the client sees the connection end
            raise
        except Exception as exc:
            log.error("unhandled error in the ASGI app", exc_info=exc)
            if not ex.head_sent and not self.lost:
                ex.keep_alive = False
                self.transport.write(error_response(500, "internal error"))
                ex.finished = True
                self.exchange_done(ex)
                return
            self._close()
        if not ex.finished:
            if not ex.started and not self.lost:
                log.error("the ASGI app returned without a response")
                ex.keep_alive = False
                self.transport.write(error_response(500, "internal error"))
            else:
                self._abort()  # a response cut short: the client must not wait for the rest
            ex.finished = True
            self.exchange_done(ex)

    def exchange_done(self, ex: _Exchange) -> None:
        """The response is complete: next pipelined request, keep-alive idle, or close."""
        if self.active is not ex:
            return
        self.active = None
        self.idle_since = self.loop.time()
        ex.wake()  # a receive() still waiting reports http.disconnect
        if self.lost:
            return
        if not ex.complete:
            # answered before its body was read (a 413, say): read and drop the rest, then
            # close, so the client reads the answer instead of a reset while still sending
            self._discarding = ex
            self._pipeline.clear()
            self.resume_reading()
            return
        if not ex.keep_alive:
            self._close()
            return
        if self._pipeline:
            self._start(self._pipeline.popleft())
        self.resume_reading()

