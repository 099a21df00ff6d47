"""Relay a backend response to the client: whole bodies at once, streams chunk by chunk.

A stream is relayed as the bytes arrive (no re-framing, no buffering), so the client sees each
token when the backend sends it. Once the first byte has gone out nothing can be retried; a
stream that breaks later ends with an SSE error event and a clean close.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.errors import BackendFailure, error_body
from gateway.upstream.errors import UpstreamError
from gateway.upstream.translate import as_gateway_error

if TYPE_CHECKING:
    from gateway.accounting import StreamScanner
    from gateway.context import RequestContext
    from gateway.types import RawHeaders, Send
    from gateway.upstream.forward import Forwarded

__all__ = ["relay_response"]

_EXCERPT = 300


async def relay_response(
    forwarded: Forwarded,
    ctx: RequestContext,
    send: Send,
    extra: RawHeaders,
    scanner: StreamScanner | None = None,
) -> None:
    """Send the backend's answer to the client; raises GatewayError before the first byte only."""
    response = forwarded.response
    status = response.status
    ctx.status = status
    if status >= 500:  # not retryable (e.g. 501): report it as a backend failure
        try:
            text = (await response.read())[:_EXCERPT].decode("utf-8", "replace")
        except UpstreamError:
            text = ""
        raise BackendFailure(f"backend '{ctx.backend}' answered {status}: {text}".rstrip(": "))
    headers = response.headers + extra
    if not response.is_stream:
        body = forwarded.body
        if body is None:
            try:
                body = await response.read()
            except UpstreamError as exc:
                raise as_gateway_error(exc, ctx.backend or "?") from exc
        headers.append((b"content-length", str(len(body)).encode()))
        ctx.response_started = True
        await send({"type": "http.response.start", "status": status, "headers": headers})
        ctx.first_token_ns = time.perf_counter_ns()
        await send({"type": "http.response.body", "body": body, "more_body": False})
        ctx.finished_ns = time.perf_counter_ns()
        ctx.outcome = "completed"
        return
    ctx.response_started = True
    await send({"type": "http.response.start", "status": status, "headers": headers})
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
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
        if scanner is not None and (tail := scanner.flush()):
            await send({"type": "http.response.body", "body": tail, "more_body": True})
    except UpstreamError as exc:
        ctx.outcome, ctx.error = "failed", str(exc)
        if response.is_event_stream:
            err = as_gateway_error(exc, ctx.backend or "?")
            payload = error_body(err.message, err.type, None, err.error_code)
            await send(
                {"type": "http.response.body", "body": b"data: " + payload + b"\n\n",
                 "more_body": True}
            )
    else:
        ctx.outcome = "completed"
    finally:
        ctx.output_chunks = chunks
        ctx.last_chunk_ns = time.perf_counter_ns()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    ctx.finished_ns = time.perf_counter_ns()
