"""The proxied OpenAI routes' HTTP edge, as raw ASGI handlers.

One instance per endpoint, shared by all requests. It reads the request line and headers,
hands the pipeline (:mod:`gateway.pipeline`) a way to read the bounded body, and watches for a
client that leaves: a watcher on ``receive`` cancels the request at once, which aborts the
upstream connection so the backend frees its slot. Everything else is the pipeline's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gateway.http.asgi import read_body
from gateway.pipeline import Inbound
from gateway.timers.deadlines import wheel

if TYPE_CHECKING:
    from gateway.context import RequestContext
    from gateway.pipeline import Pipeline
    from gateway.request.parse import Endpoint
    from gateway.types import Message, Receive, Scope, Send

__all__ = ["ProxyHandler"]

#: how long a request runs before a disconnect watcher is attached. Requests that finish sooner
#: (most non-streaming ones against a fast backend) never pay for the watcher's task; a client
#: that leaves is noticed within this delay at worst.
WATCH_AFTER_S = 0.02


class _Watch:
    """Cancels the request's task when the client disconnects, until :meth:`stop`.

    Attached lazily (after :data:`WATCH_AFTER_S`): it needs a task of its own on ``receive()``.
    """

    __slots__ = ("_ctx", "_future", "_receive", "_task", "_timer", "_wheel", "active",
                 "client_gone")

    def __init__(
        self, receive: Receive, loop: asyncio.AbstractEventLoop, ctx: RequestContext
    ) -> None:
        self._ctx = ctx
        task = asyncio.current_task(loop)
        assert task is not None
        self._task = task
        self._receive = receive
        self.active = True
        self.client_gone = False
        self._future: asyncio.Task[Message] | None = None
        self._wheel = wheel(loop)
        self._timer = self._wheel.add(WATCH_AFTER_S, lambda: self._attach(loop))

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.active:
            self._future = loop.create_task(self._receive())  # type: ignore[arg-type]
            self._future.add_done_callback(self._on_message)

    def _on_message(self, future: asyncio.Future[Message]) -> None:
        if not self.active or future.cancelled() or future.exception() is not None:
            return
        if self._ctx.finished_ns is not None:  # the response is complete: nothing to cancel
            return
        if future.result().get("type") == "http.disconnect":
            self.client_gone = True
            self._task.cancel()

    def stop(self) -> None:
        self.active = False
        self._wheel.cancel(self._timer)
        if self._future is not None:
            self._future.cancel()


class ProxyHandler:
    """ASGI handler for one OpenAI endpoint."""

    def __init__(self, pipeline: Pipeline, endpoint: Endpoint) -> None:
        self.pipeline = pipeline
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch: _Watch | None = None

        async def body(limit: int) -> bytes:
            return await read_body(scope, receive, limit)

        def watch_from_now(ctx: RequestContext) -> None:
            nonlocal watch
            watch = _Watch(receive, asyncio.get_running_loop(), ctx)

        inbound = Inbound(
            method=scope["method"], endpoint=self.endpoint, headers=scope["headers"],
            read_body=body, on_body_read=watch_from_now,
            client_gone=lambda: watch is not None and watch.client_gone,
        )
        try:
            await self.pipeline.run(inbound, send)
        finally:
            if watch is not None:
                watch.stop()
