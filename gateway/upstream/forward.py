"""Forward a request: attempts on backends until one answers well, before any byte is relayed.

One concern per layer, each calling the next: ``forward`` (attempts, budget, back-off,
fallback) -> ``_attempt`` (one backend: send, judge the answer, wait for the first token).

Retried: connect errors, timeouts before the first token, broken connections before it, and
429/500/502/503/504 answers - on a different backend, then on the pool's fallback pool, with
exponential back-off and jitter, bounded by ``retry.max_attempts``, the request's deadline and
the retry budget. A backend's ``Retry-After`` keeps it out of picks for that long. Nothing is
retried once the first byte has gone to the client: that is the relay's business.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import BackendFailure, GatewayError, NoBackendAvailable, RateLimited
from gateway.routing.errors import NoHealthyBackend, PoolCoolingDown, PoolSaturated
from gateway.routing.retry import RETRYABLE_STATUS, backoff
from gateway.telemetry.spans import NOOP_SPAN
from gateway.upstream.errors import UpstreamError
from gateway.upstream.translate import as_gateway_error

if TYPE_CHECKING:
    from gateway.config import Health, Timeouts
    from gateway.context import RequestContext
    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState
    from gateway.routing.router import Route, Router
    from gateway.telemetry import Metrics, RequestSpan
    from gateway.types import RawHeaders
    from gateway.upstream.base import UpstreamClient, UpstreamResponse

__all__ = ["Forwarded", "forward"]

_EXCERPT = 300


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
) -> Forwarded:
    """Attempt until a backend answers; raises the last failure as a GatewayError."""
    retry = router.policy.routing.retry
    router.budget.on_request()
    pool = route.pool
    fallbacks_used = {pool.name}
    last: GatewayError | None = None
    while ctx.attempts < retry.max_attempts:
        if ctx.attempts:
            if not router.budget.try_retry():
                ctx.retry_budget_exhausted = True
                break
            pause = backoff(retry, ctx.attempts)
            if time.monotonic() + pause > route.deadline:
                break
            await asyncio.sleep(pause)
        try:
            pool, backend = await router.acquire(route, pool, route.tried)
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
            last = last or NoBackendAvailable(
                str(exc), headers={"Retry-After": str(exc.retry_after)}
            )
            break
        route.tried.append(backend)
        ctx.attempts += 1
        ctx.pool, ctx.backend = pool.name, backend.label
        ejected_before = backend.ejections
        try:
            with span.attempt(backend.label, pool.name):
                return await _attempt(upstream, pool, backend, ctx, endpoint, body, headers,
                                      timeouts)
        except _Failed as failed:
            last = failed.error
            pool.release(backend)
            if metrics is not None and backend.ejections > ejected_before:
                metrics.ejection(pool.name, backend.label)
        except BaseException:
            pool.release(backend)
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
) -> Forwarded:
    health = pool.config.health
    send_headers = headers
    if backend.auth_header:
        send_headers = [*headers, (b"authorization", backend.auth_header)]
    sent_ns = time.perf_counter_ns()
    try:
        response = await upstream.post(backend.urls[endpoint], body, send_headers, timeouts)
    except UpstreamError as exc:
        backend.on_failure(health, time.monotonic())
        raise _Failed(as_gateway_error(exc, backend.label)) from exc
    try:
        status = response.status
        if status in RETRYABLE_STATUS:
            raise _Failed(await _judge_failure(response, backend, health))
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
        body_read: bytes | None = None
        if not response.is_stream:
            # read inside the attempt: a backend dying mid-body is still retryable here
            try:
                body_read = await response.read()
            except UpstreamError as exc:
                backend.on_failure(health, time.monotonic())
                raise _Failed(as_gateway_error(exc, backend.label)) from exc
        return Forwarded(response, pool, backend, sent_ns, first, first_ns, body_read)
    except BaseException:
        response.close()
        raise


async def _judge_failure(
    response: UpstreamResponse, backend: BackendState, health: Health
) -> GatewayError:
    """Turn a retryable status into the error a client would see if no retry succeeds."""
    status = response.status
    retry_after = _retry_after(response.headers)
    try:
        text = (await response.read())[:_EXCERPT].decode("utf-8", "replace")
    except UpstreamError:
        text = ""
    now = time.monotonic()
    if status == 429:
        backend.on_retry_after(retry_after or 1.0, now)
        headers = {"Retry-After": str(int(retry_after))} if retry_after else None
        return RateLimited(f"backend '{backend.label}' is rate limiting: {text}".rstrip(": "),
                           headers=headers)
    if retry_after:
        backend.on_retry_after(retry_after, now)
    backend.on_failure(health, now)
    return BackendFailure(f"backend '{backend.label}' answered {status}: {text}".rstrip(": "))


def _retry_after(headers: RawHeaders) -> float | None:
    for name, value in headers:
        if name.lower() == b"retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None
