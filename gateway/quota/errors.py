"""Quota errors: callers catch these, never a redis-py exception.

    QuotaError
    ├── QuotaUnavailable          the shared store gave no usable answer: 503 when fail-closed,
    │   │                         local limits when fail-open
    │   ├── QuotaConnectError     could not connect, or the connection dropped
    │   ├── QuotaTimeout          no answer within the bounded timeout
    │   ├── QuotaBackingOff       a call failed moments ago; not trying again yet
    │   └── QuotaStoreError       Redis answered with an error (OOM, READONLY, CLUSTERDOWN, script)
    └── InvalidQuotaRequest       the request cannot be checked (bad tenant id, negative tokens)

A refusal is not an error: ``reserve`` returns a ``Decision`` saying which limit bound.
``map_redis_errors`` in ``redis.py`` is the one place redis-py errors are translated.
"""

from __future__ import annotations

__all__ = [
    "InvalidQuotaRequest",
    "QuotaBackingOff",
    "QuotaConnectError",
    "QuotaError",
    "QuotaStoreError",
    "QuotaTimeout",
    "QuotaUnavailable",
]


class QuotaError(Exception):
    """Base of every error raised by ``gateway.quota``."""


class QuotaUnavailable(QuotaError):
    """The quota store could not decide in time; nothing is known about the limits."""


class QuotaConnectError(QuotaUnavailable):
    """Redis refused the connection or dropped it mid-call."""


class QuotaTimeout(QuotaUnavailable):
    """Redis did not answer within the store's bounded timeout."""


class QuotaBackingOff(QuotaUnavailable):
    """A recent call failed; the store waits before it tries Redis again."""


class QuotaStoreError(QuotaUnavailable):
    """Redis answered, but with an error (out of memory, read-only replica, cluster down)."""


class InvalidQuotaRequest(QuotaError, ValueError):
    """The request cannot be checked as given; a bug in the caller, not an outage."""
