"""Progressive canaries with automatic rollback (issue 19).

A version marked ``progressive`` walks through its traffic steps by itself: the gateway
counts the canary's and the baseline's requests per class in each step's window
(``counts``), judges them with tests that do not flap on small counts (``stats``, ``gates``),
and moves the state machine (``machine``): advance after the hold when every gate holds,
roll back to 0% at once when one fails. ``manager`` runs the loop and gives the router the
version weights; ``base`` / ``memory`` / ``redis`` keep the state (in this process and the
data directory, or in Redis with one deciding replica); ``notify`` logs, counts and posts
each transition.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.rollouts.base import AgreementSource, RolloutStore, RolloutStoreUnavailable
from gateway.rollouts.machine import ACTIONS, InvalidAction, Phase, RolloutState
from gateway.rollouts.manager import Rollouts, UnknownRollout, weights_for
from gateway.rollouts.memory import FILE_NAME, MemoryRolloutStore
from gateway.rollouts.redis import RedisRolloutStore

if TYPE_CHECKING:
    from gateway.config import Store

__all__ = [
    "ACTIONS",
    "AgreementSource",
    "InvalidAction",
    "MemoryRolloutStore",
    "Phase",
    "RedisRolloutStore",
    "RolloutState",
    "RolloutStore",
    "RolloutStoreUnavailable",
    "Rollouts",
    "UnknownRollout",
    "make_rollout_store",
    "weights_for",
]


def make_rollout_store(store: Store, redis_url: str | None) -> RolloutStore:
    """Redis when the policy's store has a URL, else this process and its data directory."""
    if redis_url:
        return RedisRolloutStore.from_url(redis_url, cluster=store.cluster)
    return MemoryRolloutStore(Path(store.data_dir) / FILE_NAME)
