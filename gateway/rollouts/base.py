"""Where rollout state and counts live: the interface, apart from its two implementations
(``memory.py``: this process and a JSON file in the data directory; ``redis.py``: shared by
every replica, with a lease so one of them decides at a time).

States are written over the revision they were read at (:meth:`RolloutStore.save` is a
compare-and-set), so an operator's action and the decider's tick never overwrite each other:
the loser reads again and re-decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.rollouts.machine import RolloutState

__all__ = ["AgreementSource", "RolloutStore", "RolloutStoreUnavailable"]


class RolloutStoreUnavailable(RuntimeError):
    """The shared store (Redis) did not answer; the caller keeps its last state."""


class RolloutStore(Protocol):
    """Rollout states by model, per-replica counts by (model, epoch), and the lease."""

    #: ``memory`` or ``redis``, for reprs and ``/admin/rollouts``
    kind: str

    async def load(self, model: str) -> RolloutState | None:
        """The model's state, or None when it has no rollout."""

    async def save(self, state: RolloutState, expected: int | None) -> bool:
        """Write ``state`` if the stored one is still at revision ``expected`` (None: no state
        stored); False when another writer came first."""

    async def publish(self, model: str, epoch: int, replica: str, window: dict[str, Any],
                      ttl: float) -> None:
        """This replica's counts of the model's window ``epoch`` (replacing its last ones)."""

    async def gather(self, model: str, epoch: int) -> list[dict[str, Any]]:
        """Every replica's counts of that window."""

    async def lead(self, replica: str, ttl: float) -> bool:
        """Take or renew the deciding lease for ``ttl`` seconds; whether ``replica`` holds it."""

    async def resign(self, replica: str) -> None:
        """Give the lease up, if held (shutdown)."""

    async def aclose(self) -> None: ...


class AgreementSource(Protocol):
    """Shadow comparison results (issue 19, point 4), read by the ``shadow_agreement`` gate
    and by a shadow stage: any object on the gateway with these methods
    (``Gateway.shadow_compare``) serves."""

    def agreement(self, model: str, version: str) -> tuple[int, int] | None:
        """(answers that agreed, answers compared) of ``version`` of ``model`` against the
        primary, or None when nothing was compared."""

    def ttfts(self, model: str, version: str, since: float
              ) -> tuple[list[float], list[float]]:
        """(primary, shadow) times to first token in seconds of ``version``'s comparisons
        since wall-clock ``since``."""
