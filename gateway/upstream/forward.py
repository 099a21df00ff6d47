"""Forward a request: attempts on backends until one answers well, before any byte is relayed.

One concern per layer, each calling the next: ``forward`` (attempts, budget, back-off,
fallback) -> ``_attempt`` (one backend: send, judge the answer, wait for the first token).

Retried: connect errors, timeouts before the first token, broken connections before it, and
429/500/502/503/504 answers - on a different backend, then on the pool's fallback pool, with
exponential back-off and jitter, bounded by ``retry.max_attempts``, the request's deadline and
the retry budget. A backend's ``Retry-After`` keeps it out of picks for that long, capped by
``routing.retry.retry_after_max``; it is parsed as RFC 9110 says (delta-seconds, or an
HTTP-date), and anything else (``inf``, ``nan``, ``-1``, ``1.5e9``, garbage) is ignored. Nothing
is retried once the first byte has gone to the client: that is the relay's business.

A backend's error body never reaches the client inside a gateway message: a backend that echoes
request headers would hand out its own API key. The first bytes of it go to the log instead,
through the redactor (which also removes the backend's key); the client's message says which
backend answered which status. A 4xx answer, relayed to the client (its backend key
scrubbed), is first given OpenAI's shape when its engine writes another
(``engines.openai_error``: llama.cpp's ``exceed_context_size_error`` becomes
``context_length_exceeded``).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import BackendFailure, GatewayError, NoBackendAvailable, RateLimited
from gateway.http.errors import UpstreamError
from gateway.routing.errors import NoHealthyBackend, PoolCoolingDown, PoolSaturated, RequestShed
from gateway.routing.retry import RETRYABLE_STATUS, backoff
from gateway.telemetry.redact import Redactor
from gateway.telemetry.spans import NOOP_SPAN
from gateway.upstream.engines import engine_of, openai_error
from gateway.upstream.failures import as_gateway_error

if TYPE_CHECKING:
    from gateway.config import Health, Timeouts
    from gateway.context import RequestContext
    from gateway.http.base import UpstreamClient, UpstreamResponse
    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState
    from gateway.routing.router import Route, Router
    from gateway.telemetry import Metrics, RequestSpan
    from gateway.types import RawHeaders

__all__ = ["Forwarded", "forward", "parse_retry_after"]

log = logging.getLogger("gateway.upstream")

_EXCERPT = 300
#: more digits than this is a wait of over 31 years: the cap applies whatever they say
_MAX_DIGITS = 9


@dataclass(slots=True)
class Forwarded:
    """A backend's good answer, ready to relay; the caller releases ``backend`` in ``pool``."""

    response: UpstreamResponse
    pool: PoolState
    backend: BackendState
    sent_ns: int
    first_chunk: bytes | None  # for streams: the first body chunk, already read
    first_chunk_ns: int | None
    body: bytes | None = None  # for whole (non-stream) responses: the body, already read
    #: monotonic time by which the answer must be relayed (the attempt's start + ``total``)
    deadline: float = math.inf
    #: the longest one write to the client may wait for it to read (``client_stall``)
    client_stall: float = math.inf


class _Failed(Exception):
    """One attempt failed in a way worth retrying elsewhere."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


async def forward(
    router: Router,
    upstream: UpstreamClient,
    route: Route,
    ctx: RequestContext,
    endpoint: str,
    body: bytes,
    headers: RawHeaders,
    timeouts: Timeouts,
    span: RequestSpan = NOOP_SPAN,
    metrics: Metrics | None = None,
    max_attempts: int | None = None,
) -> Forwarded:
    """Attempt until a backend answers; raises the last failure as a GatewayError.

    ``max_attempts``: attempts of this call (default: ``retry.max_attempts`` for the request);
    a stream's continuation (``continuation.py``) gives its own bound, its first attempt is
    made at once, and ``route.tried`` keeps it off the backends tried before."""
    retry = router.policy.routing.retry
    router.budget.on_request()
    pool = route.pool
    fallbacks_used = {pool.name}
    last: GatewayError | None = None
    first = ctx.attempts if max_attempts is not None else 0
    limit = retry.max_attempts if max_attempts is None else first + max_attempts
    while ctx.attempts < limit:
        if ctx.attempts > first:
            if not router.budget.try_retry():  # the pool-wide retry budget is spent
                break
            pause = backoff(retry, ctx.attempts)
            if time.monotonic() + pause > route.deadline:
                break
            await asyncio.sleep(pause)
        try:
            asked = time.monotonic()
            pool, backend = await router.acquire(route, pool, route.tried)
            if metrics is not None:
                metrics.dispatched(pool.name, route.tenant, time.monotonic() - asked,
                                   route.tokens)
        except NoHealthyBackend as exc:
            fallback = pool.config.fallback
            if fallback is not None and fallback not in fallbacks_used:
                fallbacks_used.add(fallback)
                pool = router.pools[fallback]
                ctx.failovers += 1
                continue
            last = last or NoBackendAvailable(str(exc), headers={"Retry-After": "1"})
            break
        except PoolCoolingDown as exc:
            last = last or RateLimited(str(exc), headers={"Retry-After": str(exc.retry_after)})
            break
        except PoolSaturated as exc:
            if metrics is not None and isinstance(exc, RequestShed):
                metrics.shed_request(route.model.name, pool.name, route.request_class.name,
                                     exc.reason)
            last = last or NoBackendAvailable(
                str(exc), headers={"Retry-After": str(exc.retry_after)}
            )
            break
        route.tried.append(backend)
        ctx.attempts += 1
        ctx.pool, ctx.backend = pool.name, backend.label
        try:
            with span.attempt(backend.label, pool.name):
                return await _attempt(upstream, pool, backend, ctx, endpoint, body, headers,
                                      timeouts, retry.retry_after_max)
        except _Failed as failed:
            last = failed.error
            pool.release(backend, route.tenant)
        except BaseException:
            pool.release(backend, route.tenant)
            raise
    if last is None:
        last = NoBackendAvailable("no backend could take the request", headers={"Retry-After": "1"})
    raise last


async def _attempt(
    upstream: UpstreamClient,
    pool: PoolState,
    backend: BackendState,
    ctx: RequestContext,
    endpoint: str,
    body: bytes,
    headers: RawHeaders,
    timeouts: Timeouts,
    retry_after_max: float,
) -> Forwarded:
    """:func:`_exchange`, a streamed one counted in ``backend.prefilling`` until it returns
    (just after its first chunk) or fails: the prefill-aware pick reads it. A request not
    streamed is not counted: its first token is never seen apart from its end."""
    counted = ctx.stream
    started = time.monotonic() if counted else 0.0
    if counted:
        pool.prefill_started(backend, ctx.tenant or "", started)
    try:
        return await _exchange(upstream, pool, backend, ctx, endpoint, body, headers, timeouts,
                               retry_after_max)
    finally:
        if counted:
            pool.prefill_ended(backend, ctx.tenant or "", started)


async def _exchange(
    upstream: UpstreamClient,
    pool: PoolState,
    backend: BackendState,
    ctx: RequestContext,
    endpoint: str,
    body: bytes,
    headers: RawHeaders,
    timeouts: Timeouts,
    retry_after_max: float,
) -> Forwarded:
    """Send the request once; return the answer with its first chunk (streams) or its body."""
    health = pool.config.health
    send_headers = headers
    if backend.auth_header:
        send_headers = [*headers, (b"authorization", backend.auth_header)]
    sent_ns = time.perf_counter_ns()
    if not ctx.stream:  # no first token to learn from: close its start in the predictor
        pool.observe_first_token(backend, None, sent_ns)
    deadline = time.monotonic() + timeouts.total
    try:
        response = await upstream.post(backend.urls[endpoint], body, send_headers, timeouts)
    except UpstreamError as exc:
        backend.on_failure(health, time.monotonic())
        raise _Failed(as_gateway_error(exc, backend.label)) from exc
    try:
        status = response.status
        if status in RETRYABLE_STATUS:
            raise _Failed(await _judge_failure(response, backend, health, retry_after_max))
        first: bytes | None = None
        first_ns: int | None = None
        if status == 200 and ctx.stream and response.is_stream:
            remaining = timeouts.first_token - (time.perf_counter_ns() - sent_ns) / 1e9
            try:
                first = await response.next_chunk(max(0.001, remaining))
            except UpstreamError as exc:
                backend.on_failure(health, time.monotonic())
                raise _Failed(as_gateway_error(exc, backend.label)) from exc
            first_ns = time.perf_counter_ns()
            pool.observe_first_token(backend, (first_ns - sent_ns) / 1e9, sent_ns)
        body_read: bytes | None = None
        if not response.is_stream:
            # read inside the attempt: a backend dying mid-body is still retryable here
            try:
                body_read = await response.read()
            except UpstreamError as exc:
                backend.on_failure(health, time.monotonic())
                raise _Failed(as_gateway_error(exc, backend.label)) from exc
            if status >= 400:  # the engine's error answer, in OpenAI's shape
                body_read = openai_error(engine_of(pool, backend), body_read)
        return Forwarded(response, pool, backend, sent_ns, first, first_ns, body_read, deadline,
                         timeouts.client_stall)
    except BaseException:
        response.close()
        raise


async def _judge_failure(
    response: UpstreamResponse, backend: BackendState, health: Health, retry_after_max: float
) -> GatewayError:
    """Turn a retryable status into the error a client would see if no retry succeeds."""
    status = response.status
    retry_after = _retry_after(response.headers, retry_after_max)
    await log_error_body(response, backend)
    now = time.monotonic()
    if status == 429:
        backend.on_retry_after(retry_after or 1.0, now, retry_after_max)
        headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after else None
        return RateLimited(f"backend '{backend.label}' is rate limiting", headers=headers)
    if retry_after:
        backend.on_retry_after(retry_after, now, retry_after_max)
    backend.on_failure(health, now)
    return BackendFailure(f"backend '{backend.label}' answered {status}")


async def log_error_body(response: UpstreamResponse, backend: BackendState) -> None:
    """Log the first bytes of a backend's error body, redacted (never sent to the client)."""
    try:
        raw = (await response.read())[:_EXCERPT]
    except UpstreamError:
        return
    text = _REDACTOR.text(scrub(raw, backend).decode("utf-8", "replace"))
    log.info("backend %s answered %d: %s", backend.label, response.status, text)


_REDACTOR = Redactor()
_REDACTED = b"[REDACTED]"


def scrub(body: bytes, backend: BackendState) -> bytes:
    """``body`` without the backend's own credential, the one secret the gateway sends it (a
    client's credentials never reach a backend). An exact replacement inside what is a JSON
    string in a JSON body, so the body stays valid; the log applies the pattern redactor too."""
    header = backend.auth_header
    if not header:
        return body
    key = header.removeprefix(b"Bearer ")
    return body.replace(key, _REDACTED) if key in body else body


def parse_retry_after(value: bytes, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks for, or None when it is not one (RFC 9110 10.2.3).

    Two forms: delta-seconds (digits only, so ``inf``, ``nan``, ``-1``, ``1e12`` and ``1.5``
    are rejected) and an HTTP-date (a date in the past is 0). ``now`` is wall-clock time.
    """
    text = value.strip()
    if text.isdigit() and text.isascii():
        return float(int(text)) if len(text) <= _MAX_DIGITS else float(10**_MAX_DIGITS)
    try:
        when = email.utils.parsedate_to_datetime(text.decode("latin-1"))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        return None
    wait = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, wait) if math.isfinite(wait) else None


def _retry_after(headers: RawHeaders, cap: float) -> float | None:
    for name, value in headers:
        if name.lower() == b"retry-after":
            wait = parse_retry_after(value)
            return None if wait is None else min(wait, cap)
    return None


def release(forwarded: Forwarded, ctx: RequestContext, outcome: str | None = None) -> None:
    """The answer is over: close it, feed its outcome (``ctx.outcome`` unless given: a stream
    continued elsewhere releases its failed backend while the request goes on) and latencies
    to the backend's health and averages, and give the backend's slot back to its pool."""
    forwarded.response.close()
    backend = forwarded.backend
    outcome = ctx.outcome if outcome is None else outcome
    if outcome == "completed":
        backend.on_success()
    elif outcome == "failed":
        backend.on_failure(forwarded.pool.config.health, time.monotonic())
    if forwarded.first_chunk_ns is not None:
        ttft = (forwarded.first_chunk_ns - forwarded.sent_ns) / 1e9
        tpot = None
        if ctx.output_chunks > 1 and ctx.last_chunk_ns is not None:
            tpot = (ctx.last_chunk_ns - forwarded.first_chunk_ns) / 1e9 / (ctx.output_chunks - 1)
        backend.observe(ttft, tpot)
        forwarded.pool.observe_ttft(ttft)
    forwarded.pool.release(backend, ctx.tenant or "")  # the tenant routed (``route.tenant``)
