"""Exponential back-off between attempts at a store that just failed (quota store, ledger).

After a failure the store stops calling Redis for a while and then lets a single call through
as a probe; each further failure doubles the pause (with jitter, so replicas do not probe in
step). Without it every request would pay the full connect timeout while Redis is down.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Decides whether the next call may try the network; pure state, no I/O.

    Args:
        initial: pause after the first failure, seconds.
        maximum: the pause never grows past this.
        jitter: the pause is scaled by a random factor in ``[1 - jitter, 1]``.
    """

    __slots__ = ("_clock", "_delay", "_failures", "_initial", "_jitter", "_maximum", "_next")

    def __init__(
        self,
        *,
        initial: float = 0.05,
        maximum: float = 1.0,
        jitter: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._jitter = jitter
        self._clock = clock
        self._failures = 0
        self._delay = 0.0
        self._next = 0.0

    def __repr__(self) -> str:
        if not self._failures:
            return "<Backoff [ok]>"
        wait = max(0.0, self._next - self._clock())
        return f"<Backoff [failures: {self._failures} | next try in {wait:.2f}s]>"

    @property
    def failing(self) -> bool:
        """True between a failure and the next success."""
        return self._failures > 0

    def allow(self) -> bool:
        """May this call go to the network? While failing, one call per pause (the probe)."""
        if not self._failures:
            return True
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._delay  # concurrent callers wait for this probe's outcome
        return True

    def failure(self) -> None:
        """Record a failed call and start (or lengthen) the pause."""
        self._failures += 1
        base = min(self._maximum, self._initial * 2 ** min(self._failures - 1, 30))
        self._delay = base * (1.0 - self._jitter * random.random())
        self._next = self._clock() + self._delay

    def success(self) -> None:
        """Record a call that worked: calls go straight through again."""
        self._failures = 0
