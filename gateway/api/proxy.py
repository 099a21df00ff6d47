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
    from collections.abc import Awaitable

    from gateway.context import RequestContext
    from gateway.dialects.shape import Endpoint
    from gateway.pipeline import Pipeline
    from gateway.types import Message, Receive, Scope, Send

__all__ = ["ProxyHandler"]

#: how long a request runs before a disconnect watcher is attached. Requests that finish sooner
#: (most non-streaming ones against a fast backend) never pay for the watcher's task; a client
#: that leaves is noticed within this delay at worst.
WATCH_AFTER_S = 0.02


class _ClientRequest(Inbound):
    """A client's request as the pipeline takes it, and the watch that cancels the request's
    task when the client disconnects (from :meth:`on_body_read` until :meth:`stop`).

    One object per request, built with positional arguments and holding everything the edge
    needs: the pipeline calls its methods, so a request makes no closures and no wrapper
    coroutine for its body. It sets the :class:`Inbound` fields itself and overrides all three
    methods, so the callables :class:`Inbound` keeps for batch lines are never set or read.
    The watch is attached lazily (after :data:`WATCH_AFTER_S`): it needs a task of its own on
    ``receive()``.
    """

    __slots__ = ("_ctx", "_future", "_receive", "_scope", "_task", "_timer", "_watching",
                 "_wheel", "gone")

    def __init__(self, scope: Scope, receive: Receive, endpoint: Endpoint) -> None:
        self.method, self.endpoint, self.headers = scope["method"], endpoint, scope["headers"]
        self.identity = self.request_class = self.request_id = self.batch_id = None
        self._scope, self._receive = scope, receive
        self._watching = self.gone = False
        self._timer: int | None = None
        self._future: asyncio.Task[Message] | None = None

    def read_body(self, limit: int) -> Awaitable[bytes]:
        return read_body(self._scope, self._receive, limit)

    def on_body_read(self, ctx: RequestContext) -> None:
        """Start watching: the request now runs until it is answered."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        self._task, self._ctx = task, ctx
        self._watching = True
        self._wheel = wheel(loop)
        self._timer = self._wheel.add(WATCH_AFTER_S, self._attach)

    def client_gone(self) -> bool:
        return self.gone

    def _attach(self) -> None:
        if self._watching:
            self._future = self._task.get_loop().create_task(
                self._receive())  # type: ignore[arg-type]
            self._future.add_done_callback(self._on_message)

    def _on_message(self, future: asyncio.Future[Message]) -> None:
        if not self._watching or future.cancelled() or future.exception() is not None:
            return
        if self._ctx.finished_ns is not None:  # the response is complete: nothing to cancel
            return
        if future.result().get("type") == "http.disconnect":
            self.gone = True
            self._task.cancel()

    def stop(self) -> None:
        """The request is over: stop watching."""
        self._watching = False
        if self._timer is not None:
            self._wheel.cancel(self._timer)
        if self._future is not None:
            self._future.cancel()


class ProxyHandler:
    """ASGI handler for one OpenAI endpoint."""

    def __init__(self, pipeline: Pipeline, endpoint: Endpoint) -> None:
        self.pipeline = pipeline
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _ClientRequest(scope, receive, self.endpoint)
        try:
            await self.pipeline.run(request, send)
        finally:
            request.stop()
