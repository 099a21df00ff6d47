"""Waits of the batch runner's loops that a swallowed cancel cannot turn into a hang.

A cancel can be lost below a loop (Python 3.11's ``asyncio.wait_for``, under which redis-py
sends every command); :func:`check_cancelled` raises it anyway, :func:`wait_event` waits on an
event without taking such a cancel for its own timeout, and :func:`wait_until` bounds a wait
on tasks whether or not they honour their cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["check_cancelled", "wait_event", "wait_until"]


def check_cancelled() -> None:
    """Raise the CancelledError of a cancel this task was sent and never received.

    Something below a loop can swallow its cancel. Python 3.11's ``asyncio.wait_for`` returns
    the inner result instead of raising when its task is cancelled in the loop turn between
    the inner awaitable finishing and ``wait_for`` waking up; redis-py sends every command
    under ``asyncio.wait_for(..., socket_timeout)``, so a cancel landing there is lost. The
    task then stays marked "cancelling" with no CancelledError to come, and worse, every
    ``asyncio.timeout`` entered afterwards counts that cancel as its own and turns its expiry
    into a TimeoutError: a loop waiting under a timeout runs forever (#14 point 18: the
    gateway never exited). Every loop calls this between its steps and before it waits. A
    background loop never uncancels, so a non-zero count is always a cancel to honour.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_event(event: asyncio.Event, seconds: float | None) -> None:
    """Wait until ``event`` is set, at most ``seconds`` (None: no bound); a cancel already
    sent (and swallowed below) ends the wait at once instead of being taken for this
    timeout's own."""
    check_cancelled()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def wait_until(
    tasks: set[asyncio.Task[None]], deadline: float, now: Callable[[], float]
) -> set[asyncio.Task[None]]:
    """Wait for ``tasks`` until ``deadline`` (on the loop's clock); the ones still running.

    ``asyncio.wait`` returns at its timeout whether or not the tasks honour a cancel."""
    pending = {t for t in tasks if not t.done()}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - now()))
    return pending

