"""Relay a backend response to the client: whole bodies at once, streams chunk by chunk.

A stream is relayed as the bytes arrive (no re-framing, no buffering), so the client sees each
token when the backend sends it. Once the first byte has gone out nothing can be retried; a
stream that breaks later ends with an SSE error event and a clean close.

The request's total deadline (``timeouts.total``, from the attempt that answered) bounds the
relay too: a client that stops reading would otherwise hold the stream, the backend connection
and the backend's ``max_in_flight`` slot for as long as it keeps the socket open. One timer on
the deadline wheel per request (not a timeout per chunk) marks the deadline; if the relay is
then waiting in ``send`` for the client to read, that wait is cancelled. The response is left
unfinished, so the server protocol closes the connection, and the caller's ``finally`` closes
the backend response and releases the slot.

The response's end waits for ``finish`` (the pipeline's meter-and-record step: the usage
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
import time
from typing import TYPE_CHECKING, Any

from gateway.accounting.sse import chat_error_event
from gateway.errors import BackendFailure
from gateway.http.errors import UpstreamError
from gateway.timers.deadlines import wheel
from gateway.upstream.forward import log_error_body, scrub
from gateway.upstream.translate import as_gateway_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.accounting import Scanner
    from gateway.context import RequestContext
    from gateway.types import RawHeaders, Send
    from gateway.upstream.forward import Forwarded

__all__ = ["relay_response"]

_DONE = b"data: [DONE]"
_DEADLINE_ERROR = "total timeout: the client did not read the response in time"


class _Expired(Exception):
    """The request's total deadline passed while relaying."""


class _Guarded:
    """``send`` bounded by a deadline: one wheel timer; a send waiting at the deadline is
    cancelled, and every later send raises :class:`_Expired` at once."""

    __slots__ = ("_handle", "_send", "_task", "_wheel", "deadline", "expired", "sending")

    def __init__(self, send: Send, deadline: float) -> None:
        self._send = send
        self.deadline = deadline
        self._task = asyncio.current_task()
        self.expired = False
        self.sending = False
        self._wheel = wheel()
        self._handle = self._wheel.add(max(0.0, deadline - time.monotonic()), self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self.sending and self._task is not None:
            self._task.cancel()  # only ever while suspended in the send below

    async def __call__(self, message: dict[str, Any]) -> None:
        # the clock too: the wheel ticks coarsely, and past the deadline nothing more is sent
        # (not even an error event or the end of the stream, whose unflushed bytes would keep
        # a client that stopped reading connected)
        if self.expired or time.monotonic() >= self.deadline:
            raise _Expired
        self.sending = True
        try:
            await self._send(message)
        except asyncio.CancelledError:
            if self.expired and self._task is not None and self._task.uncancel() == 0:
                raise _Expired from None
            raise
        finally:
            self.sending = False

    def close(self) -> None:
        self._wheel.cancel(self._handle)


async def relay_response(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: Send,
    extra: RawHeaders,
    scanner: Scanner | None = None,
    finish: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Send the backend's answer to the client; raises GatewayError before the first byte only.

    Returns with the response unfinished when the total deadline passes (the server closes the
    connection); the caller closes ``forwarded.response`` and releases the backend.
    """
    response = forwarded.response
    status = response.status
    ctx.status = status
    if status >= 500:  # not retryable (e.g. 501): report it as a backend failure
        await log_error_body(response, forwarded.backend)
        raise BackendFailure(f"backend '{ctx.backend}' answered {status}")
    guarded = _Guarded(send, forwarded.deadline)
    try:
        if response.is_stream and status < 400:
            await _relay_stream(forwarded, ctx, guarded, extra, scanner, finish)
        else:
            await _relay_whole(forwarded, ctx, guarded, extra, finish)
    except _Expired:
        ctx.outcome, ctx.error = "failed", _DEADLINE_ERROR
    finally:
        guarded.close()


async def _relay_whole(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: _Guarded,
    extra: RawHeaders,
    finish: Callable[[], Awaitable[None]] | None,
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
    if finish is not None:  # the record is durable before any of the answer goes out
        ctx.outcome = "completed"
        ctx.first_token_ns = ctx.finished_ns = time.perf_counter_ns()
        await finish()
    ctx.response_started = True
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if finish is None:
        ctx.first_token_ns = time.perf_counter_ns()
    await send({"type": "http.response.body", "body": body, "more_body": False})
    ctx.finished_ns = time.perf_counter_ns()
    ctx.outcome = "completed"


async def _relay_stream(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: _Guarded,
    extra: RawHeaders,
    scanner: Scanner | None,
    finish: Callable[[], Awaitable[None]] | None,
) -> None:
    response = forwarded.response
    held = b""  # the [DONE] event and what follows it: sent after ``finish``
    ctx.response_started = True
    await send({"type": "http.response.start", "status": response.status,
                "headers": response.headers + extra})
    chunks = 0
    try:
        if forwarded.first_chunk is not None:
            ctx.first_token_ns = time.perf_counter_ns()
            first = scanner.feed(forwarded.first_chunk) if scanner else forwarded.first_chunk
            await send({"type": "http.response.body", "body": first, "more_body": True})
            chunks = 1
        async for chunk in response.chunks():
            if ctx.first_token_ns is None:
                ctx.first_token_ns = time.perf_counter_ns()
            chunks += 1
            out = scanner.feed(chunk) if scanner is not None else chunk
            if finish is not None and (held or (at := out.find(_DONE)) >= 0):
                if held:
                    held += out
                    continue
                out, held = out[:at], out[at:]
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
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
    if finish is not None:
        ctx.finished_ns = ctx.last_chunk_ns
        await finish()
    await send({"type": "http.response.body", "body": held, "more_body": False})
    ctx.finished_ns = time.perf_counter_ns()
