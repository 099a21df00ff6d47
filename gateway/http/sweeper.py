"""The per-process sweep of the native server's connections: idle, slow head, slow body.

One task per event loop checks every connection's timers about twice per shortest timeout of
``server.limits`` (:meth:`gateway.http.server.GatewayH1Protocol.check_idle`), so a request never
sets or cancels a timer of its own.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING

from gateway.http import memdebug

if TYPE_CHECKING:
    from gateway.config.model import ClientLimits
    from gateway.http.server import GatewayH1Protocol

__all__ = ["Sweeper", "sweepers"]


class Sweeper:
    """Closes connections idle past the keep-alive timeout, or slow to send their head or body;
    one task per process, so a request never sets or cancels a timer of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: ClientLimits) -> None:
        self.connections: weakref.WeakSet[GatewayH1Protocol] = weakref.WeakSet()
        self.interval = 1.0
        self.limits = limits
        self.task = loop.create_task(self._run(loop))
        self.fit(limits)
        memdebug.install(loop)  # nothing unless GATEWAY_MEMDEBUG is set

    def fit(self, limits: ClientLimits) -> None:
        """Sweep often enough for the shortest timeout of ``limits`` (about half of it)."""
        shortest = min(limits.keep_alive_timeout, limits.header_timeout, limits.body_timeout)
        self.interval = min(self.interval, max(0.05, shortest / 2))

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = loop.time()
            for conn in list(self.connections):
                conn.check_idle(now)


sweepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Sweeper] = (
    weakref.WeakKeyDictionary()
)

