"""Retry policy: what may be retried, how long to back off, and the retry budget.

The budget keeps a failing fleet from being hit by a retry storm: over the last ``window``
seconds, retries may be at most ``ratio`` of requests plus ``min_per_s`` per second.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Retry

__all__ = ["RETRYABLE_STATUS", "RetryBudget", "backoff"]

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

_SLOTS = 10


class RetryBudget:
    """Requests and retries counted in ``_SLOTS`` time slots covering the window."""

    def __init__(self, config: Retry) -> None:
        self.config = config
        self._slot_s = config.budget_window / _SLOTS
        self._requests = [0] * _SLOTS
        self._retries = [0] * _SLOTS
        self._current = int(time.monotonic() / self._slot_s)

    def _advance(self) -> int:
        now_slot = int(time.monotonic() / self._slot_s)
        gap = now_slot - self._current
        if gap > 0:
            for i in range(1, min(gap, _SLOTS) + 1):
                idx = (self._current + i) % _SLOTS
                self._requests[idx] = 0
                self._retries[idx] = 0
            self._current = now_slot
        return now_slot % _SLOTS

    def on_request(self) -> None:
        self._requests[self._advance()] += 1

    def try_retry(self) -> bool:
        """Spend one retry if the budget allows it."""
        idx = self._advance()
        allowed = (
            self.config.budget_ratio * sum(self._requests)
            + self.config.budget_min_per_s * self.config.budget_window
        )
        if sum(self._retries) + 1 > allowed:
            return False
        self._retries[idx] += 1
        return True

    @property
    def retries(self) -> int:
        self._advance()
        return sum(self._retries)


def backoff(config: Retry, retry: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): exponential, with full jitter."""
    cap = min(config.backoff_max, config.backoff_base * 2 ** (retry - 1))
    return (rng or random).uniform(cap / 2, cap)
