"""A request waiting in a pool's queue: what the fair queue orders and a dispatch completes.

Kept apart from :mod:`gateway.routing.pool` because the pool's state (``pool_figures``) holds
the queue of them and its dispatch (``pool``) serves them: both read this one record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Collection, Sequence

    from gateway.routing.backend import BackendState

__all__ = ["Waiter", "still_waiting"]


class Waiter:
    """A request waiting for a backend of the pool, ordered by its ``key``."""

    __slots__ = (
        "affinity", "counted", "exclude", "flow", "future", "key", "prefix", "pushed_out",
        "tenant", "weight",
    )

    def __init__(
        self,
        key: tuple[int, float, int],
        future: asyncio.Future[BackendState | None],
        exclude: Collection[BackendState],
        affinity: bytes | None,
        prefix: Sequence[int] | None = None,
        tenant: str = "",
        weight: float = 1.0,
        flow: str = "",
    ) -> None:
        self.key, self.future, self.exclude, self.affinity = key, future, exclude, affinity
        self.prefix, self.tenant, self.weight, self.flow = prefix, tenant, weight, flow
        #: counted among its flow's waiters (:meth:`PoolState._join`, :meth:`PoolState._leave`)
        self.counted = False
        #: its place in the full queue went to another tenant's request (:meth:`PoolState._place`)
        self.pushed_out = False

    def __lt__(self, other: Waiter) -> bool:
        return self.key < other.key


def still_waiting(waiter: Waiter) -> bool:
    """Still waiting (not timed out, cancelled or served)."""
    return not waiter.future.done()

