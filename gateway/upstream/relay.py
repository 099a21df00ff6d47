"""Relay a backend response to the client: whole bodies at once, streams chunk by chunk.

A stream is relayed as the bytes arrive (no re-framing, no buffering), so the client sees each
token when the backend sends it. Once the first byte has gone out nothing can be retried; a
stream that breaks later ends with an SSE error event and a clean close, unless ``resume``
(the pipeline's stream continuation, ``continuation.py``) gives the rest of the answer from
another backend: its bytes then go on into the same stream, through the same scanner.

A stream that may be continued (``resume`` given) breaks too where its engine sends an error
event of its own (``data: {"error": ...}``; a passed-through Messages stream's ``event:
error``): the backend's bytes are looked at before the scanner reads them, what precedes the
event goes out, the event and the rest of the read do not (:class:`_ErrorEvents`). An event
split across reads is found too: a read whose incomplete last line could begin one (a few
bytes: ``d``, ``data: {"err``) is passed on without that line, which joins the next read. A
read that ends with a line break and holds no ``error`` costs one search and one end check.

The request's total deadline (``timeouts.total``, from the attempt that answered) bounds the
relay too: a client that stops reading would otherwise hold the stream, the backend connection
and the backend's ``max_in_flight`` slot for as long as it keeps the socket open. One timer on
the deadline wheel per request (not a timeout per chunk) marks the deadline; if the relay is
then waiting in ``send`` for the client to read, that wait is cancelled. The response is left
unfinished, so the server protocol closes the connection, and the caller's ``finally`` closes
the backend response and releases the slot.

A client that stops reading is cut off sooner by ``timeouts.client_stall``: a ``send`` waits
only while the connection's send buffer is full (the server protocol's write back-pressure,
native or uvicorn's), so one still waiting after ``client_stall`` seconds means the client
took nothing that long. That send is cancelled the same way, and the request ends as a
client disconnect does: outcome ``cancelled``, billed for the output relayed so far, one
usage record, plus a ``client_stalled`` log line (request id, tenant, bytes and chunks sent)
and ``gateway_client_stalls_total{pool}``. The check shares the deadline's wheel entry, moved
earlier by a send when no check is pending, never a timer per chunk (see :class:`_Guarded`).

The response's end waits for its ``Closing`` (the pipeline's meter-and-record step: the usage
record made durable, see ``gateway/ledger/base.py``): a whole body is sent only after it, a
stream's ``data: [DONE]`` event and its final chunk only after it. So a client that received
a complete response has a usage record on disk, whatever happens to the process next.

What of a backend's error answer reaches the client:

* 4xx bodies are relayed (they say what was wrong with the request: a context too long, a bad
  parameter), after :func:`~gateway.upstream.forward.scrub` removes the backend's own key, the
  one secret the gateway sends it, since a backend may echo the request's headers.
* 5xx bodies are not: the client gets a 502 naming the backend and its status, and the first
  bytes of the body go to the log, redacted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import TYPE_CHECKING, Any, Protocol

from gateway.accounting.sse import chat_error_event
from gateway.errors import BackendFailure, GatewayError
from gateway.http.errors import UpstreamError, UpstreamStreamError
from gateway.timers.deadlines import wheel
from gateway.upstream.failures import as_gateway_error
from gateway.upstream.forward import log_error_body, scrub

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from gateway.accounting import Scanner
    from gateway.context import RequestContext
    from gateway.telemetry import Metrics
    from gateway.types import RawHeaders, Send
    from gateway.upstream.forward import Forwarded

__all__ = ["Closing", "relay_response"]

_DONE = b"data: [DONE]"
_DEADLINE_ERROR = "total timeout: the client did not read the response in time"
#: a stream's ``progress`` is reported every this many chunks (and at its first)
PROGRESS_EVERY = 64
_STALL_ERROR = "client stalled: it read nothing of the response for %g s"

log = logging.getLogger("gateway.upstream")


class _Expired(Exception):
    """The request's total deadline passed while relaying."""


class _Stalled(Exception):
    """One write to the client waited longer than ``client_stall`` for it to read."""


class _Guarded:
    """``send`` bounded by the request's deadline and by the client's write stall, with one
    entry on the deadline wheel per request (never one per chunk).

    The deadline: a send waiting at the deadline is cancelled, and every later send raises
    :class:`_Expired` at once. The stall: a send waits only while the connection's send buffer
    is full (the server protocol's write back-pressure, until the client has read it down to
    the low-water mark), so a send still waiting ``stall`` seconds after it began means no
    progress that long; it is cancelled and raises :class:`_Stalled`, and so does every later
    send. The wheel entry is due at the deadline, or earlier at a stall check: a send arms the
    check when none is pending; a check that finds no send waiting goes back to the deadline
    (the next send arms it again), one that finds a send waiting checks again at that send's
    own bound. A stream that keeps moving so costs one re-arm per ``stall`` seconds at most.
    """

    __slots__ = ("_checking", "_handle", "_send", "_task", "_wheel", "chunks", "deadline",
                 "expired", "sending", "sent", "since", "stall", "stalled")

    def __init__(self, send: Send, deadline: float, stall: float = math.inf) -> None:
        self._send = send
        self.deadline = deadline
        self.stall = stall
        self._task = asyncio.current_task()
        self.expired = False
        self.stalled = False
        self.sending = False
        self.since = 0.0  # when the send under way began
        self.sent = 0  # body bytes the client's connection took
        self.chunks = 0  # body messages it took
        self._wheel = wheel()
        self._checking = False  # the wheel entry is a stall check, due before the deadline
        self._handle: int | None = self._wheel.add(max(0.0, deadline - time.monotonic()),
                                                   self._fire)

    def _arm(self, delay: float, checking: bool) -> None:
        self._checking = checking
        self._handle = self._wheel.add(delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = time.monotonic()
        if now >= self.deadline:
            self.expired = True
            if self.sending and not self.stalled and self._task is not None:
                self._task.cancel()  # only ever while suspended in the send below
            return
        if not self.sending:  # nothing waits: back to the deadline until the next send
            self._arm(self.deadline - now, False)
            return
        due = self.since + self.stall
        if now < due:  # a later send than the one that armed the check: at its own bound
            self._arm(min(due, self.deadline) - now, due < self.deadline)
            return
        self.stalled = True
        if self._task is not None:
            self._task.cancel()  # suspended in the send below (``sending``)

    async def __call__(self, message: dict[str, Any]) -> None:
        # the clock too: the wheel ticks coarsely, and past the deadline nothing more is sent
        # (not even an error event or the end of the stream, whose unflushed bytes would keep
        # a client that stopped reading connected)
        now = time.monotonic()
        if self.expired or now >= self.deadline:
            raise _Expired
        if self.stalled:
            raise _Stalled
        self.sending = True
        self.since = now
        if not self._checking and self.stall < self.deadline - now and \
                self._handle is not None:
            self._wheel.cancel(self._handle)  # the stall check is due before the deadline
            self._arm(self.stall, True)
        try:
            await self._send(message)
        except asyncio.CancelledError:
            if (self.expired or self.stalled) and self._task is not None \
                    and self._task.uncancel() == 0:
                raise (_Stalled if self.stalled else _Expired) from None
            raise
        finally:
            self.sending = False
        body = message.get("body")
        if body is not None:
            self.sent += len(body)
            self.chunks += 1

    def close(self) -> None:
        if self._handle is not None:
            self._wheel.cancel(self._handle)
            self._handle = None



class Closing(Protocol):
    """What a response's end waits for: its last bytes go out only after ``before_last_bytes``
    returns (the pipeline meters the request and makes its usage record durable there)."""

    async def before_last_bytes(self) -> None: ...


async def relay_response(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: Send,
    extra: RawHeaders,
    scanner: Scanner | None = None,
    closing: Closing | None = None,
    metrics: Metrics | None = None,
    progress: Callable[[int], None] | None = None,
    resume: Callable[[UpstreamError], Awaitable[AsyncIterator[bytes] | None]] | None = None,
) -> None:
    """Send the backend's answer to the client; raises GatewayError before the first byte only.

    ``progress``: called with the chunks relayed so far once a stream's first chunk went out
    and every ``PROGRESS_EVERY`` chunks after (the pipeline's provisional record).
    ``resume``: a stream broken after its first byte goes on with what it returns (None: the
    error event ends it).

    Returns with the response unfinished when the total deadline passes or the client stops
    reading for ``client_stall`` (the server closes the connection); the caller closes
    ``forwarded.response`` and releases the backend.
    """
    response = forwarded.response
    status = response.status
    ctx.status = status
    if status >= 500:  # not retryable (e.g. 501): report it as a backend failure
        await log_error_body(response, forwarded.backend)
        raise BackendFailure(f"backend '{ctx.backend}' answered {status}")
    guarded = _Guarded(send, forwarded.deadline, forwarded.client_stall)
    try:
        if response.is_stream and status < 400:
            await _relay_stream(forwarded, ctx, guarded, extra, scanner, closing, progress,
                                resume)
        else:
            await _relay_whole(forwarded, ctx, guarded, extra, closing)
    except _Expired:
        ctx.outcome, ctx.error = "failed", _DEADLINE_ERROR
    except _Stalled:
        # the client left in all but name: billed for what was relayed, like a disconnect
        ctx.outcome = "cancelled"
        ctx.error = _STALL_ERROR % guarded.stall
        log.warning("client_stalled: request %s tenant %s pool %s: no write progress for %g s, "
                    "stream cancelled after %d bytes in %d chunks sent", ctx.request_id,
                    ctx.tenant, forwarded.pool.name, guarded.stall, guarded.sent,
                    guarded.chunks)
        if metrics is not None:
            metrics.client_stall(forwarded.pool.name)
    finally:
        guarded.close()


async def _relay_whole(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: _Guarded,
    extra: RawHeaders,
    closing: Closing | None,
) -> None:
    response = forwarded.response
    status = response.status
    body = forwarded.body
    if body is None:
        try:
            body = await response.read()
        except UpstreamError as exc:
            raise as_gateway_error(exc, ctx.backend or "?") from exc
    headers = response.headers + extra
    if status >= 400:
        body = scrub(body, forwarded.backend)
        headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    if closing is not None:  # the record is durable before any of the answer goes out
        ctx.outcome = "completed"
        ctx.first_token_ns = ctx.finished_ns = time.perf_counter_ns()
        ctx.delivered = True  # presumed on the record; corrected if a send below fails
        await closing.before_last_bytes()
    ctx.delivered = False
    ctx.response_started = True
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if closing is None:
        ctx.first_token_ns = time.perf_counter_ns()
    await send({"type": "http.response.body", "body": body, "more_body": False})
    ctx.delivered = True
    ctx.finished_ns = time.perf_counter_ns()
    ctx.outcome = "completed"


async def _relay_stream(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: _Guarded,
    extra: RawHeaders,
    scanner: Scanner | None,
    closing: Closing | None,
    progress: Callable[[int], None] | None = None,
    resume: Callable[[UpstreamError], Awaitable[AsyncIterator[bytes] | None]] | None = None,
) -> None:
    response = forwarded.response
    held = b""  # the [DONE] event and what follows it: sent after ``before_last_bytes``
    ctx.response_started = True
    await send({"type": "http.response.start", "status": response.status,
                "headers": response.headers + extra})
    chunks = 0
    try:
        failed: UpstreamStreamError | None = None  # the engine's error event in the first chunk
        # a stream that may be continued is watched for the engine's own error event, in the
        # backend's bytes before the scanner reads them (``_ErrorEvents``)
        watch = _ErrorEvents() if resume is not None else None
        if forwarded.first_chunk is not None:
            ctx.first_token_ns = time.perf_counter_ns()
            first = forwarded.first_chunk
            if watch is not None:
                first, broke = watch.take(first)
                if broke:
                    failed = UpstreamStreamError(_ERROR_EVENT_SENT)
            if scanner is not None and first:
                first = scanner.feed(first)
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            chunks = 1
            if progress is not None:
                progress(1)
        source: AsyncIterator[bytes] | None = response.chunks()
        if failed is not None and resume is not None:  # continued at once, or the break
            source = await resume(failed)
            if source is None:
                raise failed
        while source is not None:
            try:
                async for chunk in source:
                    if ctx.first_token_ns is None:
                        ctx.first_token_ns = time.perf_counter_ns()
                    chunks += 1
                    if watch is not None:
                        chunk, broke = watch.take(chunk)
                        if broke:
                            # the engine failed mid-stream: what came before its error event
                            # goes out, the rest is continued elsewhere (or ends as a break)
                            out = scanner.feed(chunk) if scanner is not None and chunk else chunk
                            if out:
                                await send({"type": "http.response.body", "body": out,
                                            "more_body": True})
                            raise UpstreamStreamError(_ERROR_EVENT_SENT)
                    out = scanner.feed(chunk) if scanner is not None and chunk else chunk
                    if closing is not None and (held or (at := out.find(_DONE)) >= 0):
                        if held:
                            held += out
                            continue
                        out, held = out[:at], out[at:]
                    if out:
                        await send({"type": "http.response.body", "body": out,
                                    "more_body": True})
                    if progress is not None and (chunks == 1 or not chunks % PROGRESS_EVERY):
                        progress(chunks)
                source = None
                if watch is not None and (rest := watch.rest()):  # a last line held back
                    out = scanner.feed(rest) if scanner is not None else rest
                    if out:
                        if held:
                            held += out
                        else:
                            await send({"type": "http.response.body", "body": out,
                                        "more_body": True})
            except UpstreamError as exc:
                # broken after the first byte: the rest from another backend, or the error
                if watch is not None:
                    watch.rest()  # the failed backend's held bytes: never sent, dropped
                source = await resume(exc) if resume is not None and not held else None
                if source is None:
                    raise
        if scanner is not None and (tail := scanner.flush()):
            if held:
                held += tail
            else:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
    except UpstreamError as exc:
        ctx.outcome, ctx.error = "failed", str(exc)
        if response.is_event_stream:
            err = as_gateway_error(exc, ctx.backend or "?")
            event = scanner.error_event(err) if scanner is not None else chat_error_event(err)
            await send({"type": "http.response.body", "body": event, "more_body": True})
    else:
        ctx.outcome = "completed"
    finally:
        ctx.output_chunks = chunks
        ctx.last_chunk_ns = time.perf_counter_ns()
    if closing is not None:
        ctx.finished_ns = ctx.last_chunk_ns
        # every chunk of the answer went out: presumed whole on the record, corrected if its
        # last bytes below fail to
        ctx.delivered = ctx.outcome == "completed"
        try:
            await closing.before_last_bytes()
        except GatewayError as exc:  # the record not durable in time: an error, no [DONE]
            ctx.outcome, ctx.error, ctx.delivered = "failed", exc.message, False
            held = b""
            if response.is_event_stream:
                held = scanner.error_event(exc) if scanner is not None else chat_error_event(exc)
    delivered, ctx.delivered = ctx.delivered, False
    await send({"type": "http.response.body", "body": held, "more_body": False})
    ctx.delivered = delivered if closing is not None else ctx.outcome == "completed"
    ctx.finished_ns = time.perf_counter_ns()


#: the message of the break an engine's error event makes
_ERROR_EVENT_SENT = "the backend sent an error event"
#: where an event that is a backend's error starts: a chat engine's error object
#: (``data: {"error": ...}``, vLLM, SGLang) or a named ``error`` event (Anthropic's Messages
#: API, ``event: error``), at the start of a line
_ERROR_EVENT = re.compile(rb'(?:^|\n)(?:data: ?\{[ \t]*"error"[ \t]*:|event: ?error[ \t]*\r?\n)')
#: the longest last line held back as the possible start of an error event
_HOLD_MAX = 48


def _error_event_at(data: bytes) -> int:
    """Where in ``data`` (the backend's bytes) an error event of the backend starts, or -1."""
    if data.find(b"error") < 0:  # the common chunk: one search, no regex
        return -1
    found = _ERROR_EVENT.search(data)
    if found is None:
        return -1
    start = found.start()
    return start + 1 if data[start:start + 1] == b"\n" else start


def _may_open_error(line: bytes) -> bool:
    """Whether ``line``, the incomplete last line of a read, could be the start of an error
    event whose rest is in the next read (``_ERROR_EVENT``, cut short anywhere)."""
    if not line:
        return False
    if line.startswith(b"event:"):
        name = line[6:].removeprefix(b" ")
        return b"error".startswith(name) or name.rstrip(b" \t\r") == b"error"
    if not line.startswith(b"data:"):
        return b"data:".startswith(line) or b"event:".startswith(line)
    rest = line[5:].removeprefix(b" ")
    if not rest:
        return True
    if rest[:1] != b"{":
        return False
    rest = rest[1:].lstrip(b" \t")
    if len(rest) <= 7:
        return b'"error"'.startswith(rest)
    return rest.startswith(b'"error"') and rest[7:].lstrip(b" \t") in (b"", b":")


class _ErrorEvents:
    """Finds a backend's error event in a stream's reads (``take``), also one split across
    two (or more) reads: a read whose incomplete last line could begin one (``data: {"err``,
    ``event: err``, ``d``) is passed on without that line, which waits for the next read
    (at most ``_HOLD_MAX`` bytes; a longer line cannot begin one). The common read ends with
    a line break, or holds no ``error``: one search and one end check, nothing copied."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    def take(self, data: bytes) -> tuple[bytes, bool]:
        """(the bytes to pass on now, whether an error event starts right after them: the
        rest of the read, and of the stream, is the engine's failure)."""
        if self._held:
            data, self._held = self._held + data, b""
        if data.find(b"error") >= 0 and (cut := _error_event_at(data)) >= 0:
            return data[:cut], True
        if data.endswith(b"\n"):  # the common read: no line to hold
            return data, False
        start = data.rfind(b"\n") + 1
        if len(data) - start <= _HOLD_MAX and _may_open_error(data[start:]):
            self._held = data[start:]
            return data[:start], False
        return data, False

    def rest(self) -> bytes:
        """The line held back at the stream's end (then it is no error event's start)."""
        held, self._held = self._held, b""
        return held
