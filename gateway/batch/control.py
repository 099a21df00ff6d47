"""How many batch lines one process keeps in flight: the pacing rule, as a pure function.

The rule, evaluated before every line starts and whenever one finishes:

1. **Yield to interactive.** If any interactive pool of the batch's model is *pressed* - it has
   a queue, or its in-flight is above ``interactive_share`` of its capacity - the target is
   ``min_in_flight`` (default 1: the batch keeps moving, one line at a time). Lines already in
   flight finish; nothing is cancelled. When the batch pool *is* the model's interactive pool
   (no separate batch pool), this caps batch work at ``interactive_share`` of that pool.
2. **Fill the batch pool's free capacity.** Otherwise the target is the batch pool's capacity
   (``max_in_flight`` summed over its healthy backends) minus what others use there (its
   in-flight and queue, less this process's own batch lines), at least ``min_in_flight`` and
   at most ``batch.max_in_flight``.
3. **Quota back-off (per batch).** A line refused with 429 halves that batch's own cap (never
   below 1) and waits ``retry_after``; each line that completes raises the cap by one again.

Each process sees its own pools' counters, so with N processes each fills up to the capacity
the policy gives its pool state (the same per-process ``max_in_flight`` the forwarder honours).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.routing.pool import PoolState

__all__ = ["PoolLoad", "load_of", "pressed", "target_in_flight"]


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """A pool's figures at one instant."""

    capacity: int
    in_flight: int
    queued: int


def load_of(pool: PoolState, now: float) -> PoolLoad:
    return PoolLoad(pool.capacity(now), pool.in_flight, pool.queued)


def pressed(pool: PoolLoad, share: float) -> bool:
    """Is interactive traffic pressing on this pool (a queue, or in-flight above ``share``)?"""
    return pool.queued > 0 or pool.in_flight > share * pool.capacity


def target_in_flight(
    batch: PoolLoad,
    interactive: Sequence[PoolLoad],
    mine: int,
    *,
    share: float,
    floor: int,
    ceiling: int,
) -> int:
    """Batch lines this process may have in flight on ``batch`` now (rules 1 and 2)."""
    if any(pressed(p, share) for p in interactive):
        return floor
    others = max(0, batch.in_flight + batch.queued - mine)
    return max(floor, min(ceiling, batch.capacity - others))
