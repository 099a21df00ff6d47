"""Counting large inputs off the event loop.

Tokenising is O(bytes) for ordinary text but much slower for long runs without spaces (BPE
merges within one piece): measured here, 1 MiB of words takes ~40 ms and 1 MiB of one repeated
letter ~535 ms. A worker that did that on its event loop would freeze every other client for
as long. tiktoken releases the GIL while it encodes, so a counting thread keeps the loop free.

One thread per process: a flood of huge prompts queues behind itself instead of taking every
core, and small requests (most of them) never leave the loop, where a cache hit costs less than
a thread hand-off. The count cache is shared with the loop; its operations are single dict
calls, so a race can at worst lose an entry (a later count recomputes it).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["OFFLOAD_BYTES", "off_loop"]

T = TypeVar("T")

#: request or response bodies larger than this are counted on the counting thread: a body of
#: this size counts in at most ~10 ms on the loop even in the worst case measured above
OFFLOAD_BYTES = 16 * 1024

_executor: ThreadPoolExecutor | None = None


async def off_loop(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the process's counting thread and wait for it without blocking the loop."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-count")
    return await asyncio.get_running_loop().run_in_executor(_executor, fn)
