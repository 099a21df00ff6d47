"""A cheap per-key limit on the routes that do work per call without reaching a backend.

``/v1/messages/count_tokens`` tokenises whatever it is sent, a stored response's read decodes
a stored conversation, a usage query scans rollups: none of them is admitted by the quota
(they are not inference and carry no tokens to reserve), so without a bound of their own one
key could keep a worker's counting thread or the ledger busy for every other tenant.

This limit is deliberately not the Redis quota: it guards the gateway's own resources, so a
process-local token bucket per key is enough and costs one dict lookup and no round trip. It
is per worker process (N workers admit up to N times the rate in total), which the operator
sizes with ``server.call_limits``. The bucket holds ``burst`` calls (default: a minute's worth)
and refills at ``rpm`` per minute; a refusal is a 429 with the ``x-ratelimit-*`` request headers
and a ``retry-after``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from gateway.errors import RateLimited
from gateway.quota.ratelimit import format_duration

if TYPE_CHECKING:
    from gateway.config.model import CallLimits
    from gateway.types import RawHeaders

__all__ = ["CallLimiter"]

#: keys tracked at once: past it the fullest buckets are forgotten (a forgotten bucket is a
#: full one, so forgetting never refuses anybody)
_MAX_KEYS = 100_000


class CallLimiter:
    """Token buckets per key id, shared by every rate-limited utility route of one worker."""

    def __init__(self, limits: CallLimits, previous: CallLimiter | None = None) -> None:
        self.limits = limits
        #: key -> (tokens left, monotonic time of that figure)
        self._buckets: dict[str, tuple[float, float]] = (
            previous._buckets if previous is not None else {})

    def take(self, key: str, clock: float | None = None) -> RawHeaders:
        """Spend one call of ``key``: the ``x-ratelimit-*`` headers of the answer, or raise
        :class:`RateLimited` (with those headers and ``retry-after``) when none is left."""
        rpm, burst = self.limits.rpm, self.limits.bucket
        if rpm is None:
            return []
        now = time.monotonic() if clock is None else clock
        rate = rpm / 60.0
        left, at = self._buckets.get(key, (float(burst), now))
        left = min(float(burst), left + (now - at) * rate)
        if left < 1.0:
            wait = (1.0 - left) / rate if rate > 0 else 60.0
            self._remember(key, left, now)
            raise RateLimited(
                f"Too many calls to this route with this key: at most {burst} at once and "
                f"{rpm} per minute per worker; retry in {format_duration(wait)}.",
                headers={**self._headers(left, burst, rate),
                         "retry-after": str(max(1, math.ceil(wait)))})
        left -= 1.0
        self._remember(key, left, now)
        return [(k.encode(), v.encode()) for k, v in self._headers(left, burst, rate).items()]

    def _remember(self, key: str, left: float, now: float) -> None:
        if key not in self._buckets and len(self._buckets) >= _MAX_KEYS:
            self._forget(now)
        self._buckets[key] = (left, now)

    def _forget(self, now: float) -> None:
        """Drop every bucket that has refilled (they hold no information), or, if none has,
        the oldest half."""
        burst, rate = float(self.limits.bucket), (self.limits.rpm or 0) / 60.0
        full = [k for k, (left, at) in self._buckets.items() if left + (now - at) * rate >= burst]
        if not full:
            full = sorted(self._buckets, key=lambda k: self._buckets[k][1])[:_MAX_KEYS // 2]
        for k in full:
            del self._buckets[k]

    @staticmethod
    def _headers(left: float, burst: int, rate: float) -> dict[str, str]:
        refill = (burst - left) / rate if rate > 0 else 0.0
        return {"x-ratelimit-limit-requests": str(burst),
                "x-ratelimit-remaining-requests": str(max(0, math.floor(left))),
                "x-ratelimit-reset-requests": format_duration(refill)}
