"""Exponential back-off between attempts at a Redis that just failed.

While Redis is down, each flush would otherwise pay the full connect timeout before
spooling; with the back-off, flushes go straight to the spool and only one probe per pause
tries the network. (The quota package has its own copy: stages do not import each other.)
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff"]


class Backoff:
    """Whether the next call may try the network; pure state, no I/O."""

    __slots__ = ("_delay", "_failures", "_initial", "_maximum", "_next")

    def __init__(self, *, initial: float = 0.05, maximum: float = 2.0) -> None:
        self._initial = initial
        self._maximum = maximum
        self._failures = 0
        self._delay = 0.0
        self._next = 0.0

    def __repr__(self) -> str:
        if not self._failures:
            return "<Backoff [ok]>"
        wait = max(0.0, self._next - time.monotonic())
        return f"<Backoff [failures: {self._failures} | next try in {wait:.2f}s]>"

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def allow(self) -> bool:
        """True when not failing, or when the pause is over (this caller is the probe)."""
        if not self._failures:
            return True
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._delay
        return True

    def failure(self) -> None:
        self._failures += 1
        base = min(self._maximum, self._initial * 2 ** min(self._failures - 1, 30))
        self._delay = base * (1.0 - 0.2 * random.random())
        self._next = time.monotonic() + self._delay

    def success(self) -> None:
        self._failures = 0
