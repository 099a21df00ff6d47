"""Run a planned answer through the engine and send it, whole or streamed, for any API.

A streaming response sends its headers once the request is accepted, then the renderer's opening
events, then the events of each token as the engine emits them, then the closing events. After
the headers an engine failure is reported in-stream (the renderer's ``failure``), as vLLM and the
hosted APIs do; before them it is an HTTP error (:class:`SimHTTPError`) the app renders in the
API's shape.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.sim.asgi import SSE_HEADERS, abort_connection, send_bytes
from gateway.sim.engine import EngineError, QueueFullError, RequestState, RequestTooLargeError
from gateway.sim.errors import (
    BadRequest,
    EngineFailed,
    EngineStopped,
    Overloaded,
    SimHTTPError,
)

if TYPE_CHECKING:
    from gateway.sim.answer import Plan, Renderer
    from gateway.sim.asgi import Send
    from gateway.sim.engine import Engine, SimRequest
    from gateway.sim.faults import FaultConfig
    from gateway.sim.stats import ApiCounters

__all__ = ["Call", "respond"]


@dataclass(slots=True)
class Call:
    """Per-request mutable state shared with the disconnect watcher."""

    disconnected: bool = False
    request: SimRequest | None = None

    def on_disconnect(self) -> None:
        self.disconnected = True
        if self.request is not None:
            self.request.cancel()


def _submit(engine: Engine, plan: Plan) -> SimRequest:
    try:
        return engine.submit(
            plan.prompt_tokens,
            plan.output_tokens,
            cached_tokens=plan.cached_tokens,
            token_ids=plan.token_ids if plan.cache_prompt else None,
            cache_salt=plan.cache_salt,
        )
    except QueueFullError as exc:
        raise Overloaded(str(exc)) from exc
    except RequestTooLargeError as exc:
        raise BadRequest(str(exc), param="max_tokens") from exc
    except EngineError as exc:
        raise Overloaded(str(exc)) from exc


def _settle(plan: Plan, req: SimRequest) -> None:
    """Take the engine's prefix-cache hit (known once it admitted the request) into the usage
    of the APIs that report it."""
    if plan.reports_prefix_cache:
        plan.cached_tokens = max(plan.cached_tokens, req.cached_tokens)


def _count(counters: ApiCounters, plan: Plan, generated: int) -> None:
    counters.add(plan.prompt_tokens, generated, plan.cached_tokens, plan.cache_write_tokens)


async def respond(
    send: Send,
    engine: Engine,
    plan: Plan,
    renderer: Renderer,
    faults: FaultConfig,
    call: Call,
    counters: ApiCounters,
) -> None:
    """Answer a planned request; raises :class:`SimHTTPError` only before headers are sent."""
    if plan.stream:
        await _stream(send, engine, plan, renderer, faults, call, counters)
    else:
        await _whole(send, engine, plan, renderer, faults, call, counters)


async def _whole(
    send: Send,
    engine: Engine,
    plan: Plan,
    renderer: Renderer,
    faults: FaultConfig,
    call: Call,
    counters: ApiCounters,
) -> None:
    if faults.stall_ms > 0:
        await asyncio.sleep(faults.stall_ms / 1000)
    if call.disconnected:
        return
    req = call.request = _submit(engine, plan)
    await req.wait(plan.output_tokens)
    if req.state is not RequestState.FINISHED:
        if not call.disconnected:  # the engine shut down under us
            raise Overloaded("engine stopped before the request finished")
        return
    _settle(plan, req)
    body = renderer.body(req.generated)
    _count(counters, plan, req.generated)
    await send_bytes(send, 200, body)


async def _stream(
    send: Send,
    engine: Engine,
    plan: Plan,
    renderer: Renderer,
    faults: FaultConfig,
    call: Call,
    counters: ApiCounters,
) -> None:
    if engine.num_waiting >= engine.profile.queue_limit:
        raise Overloaded(f"waiting queue full ({engine.profile.queue_limit} requests)")
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    limit = faults.disconnect_after
    if faults.stall_ms > 0:
        await asyncio.sleep(faults.stall_ms / 1000)
    if limit == 0:
        await _abort(send, call)
        return
    if call.disconnected:
        return
    try:
        req = call.request = _submit(engine, plan)
    except SimHTTPError as exc:  # headers are out: report in-stream
        await _send(send, renderer.failure(exc), more=False)
        return
    opening = renderer.opening()
    if opening:
        await _send(send, opening, more=True)
    seen = 0
    tokens = renderer.tokens
    while True:
        n = await req.wait(seen)
        if req.state is RequestState.CANCELLED:
            if not call.disconnected:  # the engine shut down: end the stream cleanly
                await _send(send, renderer.failure(EngineStopped("engine stopped")), more=False)
            return
        if n > seen:
            if limit is not None and n >= limit:
                await _send(send, tokens(seen, limit), more=True)
                await _abort(send, call)
                return
            failing = faults.error_event_after
            if failing is not None and n >= failing:  # the engine fails mid-generation
                await _send(send, tokens(seen, failing), more=True)
                await _send(send, renderer.failure(EngineFailed("the engine failed")),
                            more=False)
                engine.cancel(req)
                return
            body = tokens(seen, n)
            if body:  # a tool call's name takes tokens before its first event
                await send({"type": "http.response.body", "body": body, "more_body": True})
            seen = n
        if req.done:
            break
    _settle(plan, req)
    tail = renderer.closing(req.generated)
    _count(counters, plan, req.generated)
    await _send(send, tail, more=False)


async def _send(send: Send, body: bytes, *, more: bool) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def _abort(send: Send, call: Call) -> None:
    """Break the connection without ending the chunked body, then wait for the server to notice.

    Waiting lets uvicorn mark the request disconnected before the app returns, so it does not log
    "returned without completing response".
    """
    if call.request is not None:
        call.request.cancel()
    if not abort_connection(send):
        raise ConnectionAbortedError("simulated disconnect")  # server without a transport
    for _ in range(100):
        if call.disconnected:
            return
        await asyncio.sleep(0.001)
