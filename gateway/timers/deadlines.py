"""Coarse deadlines without a timer per wait.

uvloop creates and arms a libuv timer for every ``call_later``; per request (and per stream
chunk) that showed up at several percent of a worker's CPU. Timeouts of the proxy hop are
seconds long, so one task per event loop that checks all registered deadlines every ``TICK``
seconds is precise enough, and registering or cancelling a deadline is a dict operation.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["TICK", "DeadlineWheel", "wheel"]

TICK = 0.02  # seconds: deadlines fire at most this late


class DeadlineWheel:
    """Deadlines of one event loop; callbacks run on that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: dict[int, tuple[float, Callable[[], object]]] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None

    def add(self, delay: float, callback: Callable[[], object]) -> int:
        """Call ``callback`` once, about ``delay`` seconds from now; returns a handle."""
        handle = next(self._ids)
        self._items[handle] = (time.monotonic() + delay, callback)
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())
        return handle

    def cancel(self, handle: int) -> None:
        self._items.pop(handle, None)

    async def _run(self) -> None:
        items = self._items
        while items:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            due = [h for h, (at, _) in items.items() if at <= now]
            for handle in due:
                entry = items.pop(handle, None)
                if entry is not None:
                    entry[1]()

    def __len__(self) -> int:
        return len(self._items)


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DeadlineWheel] = (
    weakref.WeakKeyDictionary()
)


def wheel(loop: asyncio.AbstractEventLoop | None = None) -> DeadlineWheel:
    """The running loop's wheel."""
    loop = loop or asyncio.get_running_loop()
    w = _wheels.get(loop)
    if w is None:
        w = _wheels[loop] = DeadlineWheel(loop)
    return w
