"""A bound on failed console sign-ins: at most ``limit`` per client address in a rolling
``window`` (seconds); past it, that address's sign-ins answer 429 with ``Retry-After`` until
its oldest failure leaves the window, whatever they carry (a right key too). Per worker, in
memory: with ``--workers N`` an address gets at most ``N * limit`` tries a window."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FAILED_SIGN_INS", "SignInLimiter"]

#: failed sign-ins an address may make in a minute
FAILED_SIGN_INS = 10
#: addresses tracked at most (the oldest are forgotten past it)
_MAX_ADDRESSES = 10_000


class SignInLimiter:
    """Failed sign-ins per client address in a rolling window."""

    def __init__(self, limit: int = FAILED_SIGN_INS, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}

    def _live(self, address: str, now: float) -> deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again; None when it may now."""
        now = self.clock()
        failures = self._live(address, now)
        if failures is None or len(failures) < self.limit:
            return None
        return max(1, math.ceil(failures[0] + self.window - now))

    def failed(self, address: str) -> None:
        """Count one failed sign-in of ``address``."""
        now = self.clock()
        failures = self._live(address, now)
        if failures is None:
            if len(self._failures) >= _MAX_ADDRESSES:
                self._failures.pop(next(iter(self._failures)))
            failures = self._failures[address] = deque(maxlen=self.limit)
        failures.append(now)

    def __repr__(self) -> str:
        return f"<SignInLimiter [{self.limit}/{self.window:g}s | {len(self._failures)} addresses]>"
