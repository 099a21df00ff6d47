"""Routing failures.

    RoutingError
    ├── NoHealthyBackend   nothing in the pool can serve the request (all ejected or tried)
    ├── PoolCoolingDown    every backend left asked us to wait (Retry-After)
    └── PoolSaturated      the pool is healthy but cannot start the request in time
        └── RequestShed    refused at once: the prediction says it would start too late
"""

from __future__ import annotations

__all__ = [
    "NoHealthyBackend", "PoolCoolingDown", "PoolSaturated", "RequestShed", "RoutingError",
]


class RoutingError(Exception):
    """Base of routing failures."""


class NoHealthyBackend(RoutingError):
    """Every backend of the pool is ejected, or was already tried for this request."""


class PoolSaturated(RoutingError):
    """Queue full, or the request cannot start before its deadline."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PoolCoolingDown(RoutingError):
    """Every backend that could take the request is inside a Retry-After it sent."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestShed(PoolSaturated):
    """Refused at once: the pool predicts the request would start too late (load shedding).

    ``reason`` says which rule refused it (see :mod:`gateway.routing.shed`); callers that map
    :class:`PoolSaturated` to a 503 with ``Retry-After`` handle it unchanged.
    """

    def __init__(self, message: str, retry_after: int, reason: str) -> None:
        super().__init__(message, retry_after)
        self.reason = reason
