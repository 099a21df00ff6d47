"""The batch state store interface: files' metadata, batches, line leases and line results.

Two implementations share these semantics (``sqlite.py`` without Redis, ``redis.py`` with it):

- **Leases.** A batch's lines are cut into chunks of ``chunk_lines``. ``claim_chunk`` hands a
  process the first chunk that is neither done nor leased (or whose lease expired: its owner
  died), for ``lease_s`` seconds; the owner renews while it works and releases it when every
  line has a result (``done``) or when it stops (the chunk is then free at once).
- **Results.** ``record_results`` keeps the first result of a line index and ignores later
  ones (a line run twice after a lease was lost counts once); the batch's ``completed`` and
  ``failed`` counts move in the same atomic step.
- **Transitions.** ``transition`` changes a batch's fields only if its status is one of
  ``from_status`` (or it is ``finalizing`` under an expired ``final_lease`` when
  ``retake_final`` is set): the compare-and-set that lets one process of many finalize.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Collection

    from gateway.batch.objects import BatchRecord, FileRecord, LineResult

__all__ = ["BatchState"]


class BatchState(abc.ABC):
    """Durable batch state; every method is one atomic step."""

    async def open(self) -> None:
        """Connect or create what is needed (called from the gateway's start)."""
        return None

    async def close(self) -> None:
        """Release connections."""
        return None

    # -- files
    @abc.abstractmethod
    async def put_file(self, record: FileRecord) -> None: ...

    @abc.abstractmethod
    async def get_file(self, file_id: str) -> FileRecord | None: ...

    @abc.abstractmethod
    async def delete_file(self, file_id: str) -> None: ...

    # -- batches
    @abc.abstractmethod
    async def create_batch(self, record: BatchRecord) -> None: ...

    @abc.abstractmethod
    async def get_batch(self, batch_id: str) -> BatchRecord | None: ...

    @abc.abstractmethod
    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        """A tenant's batches, newest first, after the cursor ``after``; and "has more"."""

    @abc.abstractmethod
    async def active_batches(self) -> list[str]:
        """Ids of batches not yet in a final status."""

    @abc.abstractmethod
    async def transition(
        self,
        batch_id: str,
        from_status: Collection[str],
        changes: dict[str, Any],
        *,
        retake_final: bool = False,
        now: float = 0.0,
    ) -> bool:
        """Apply ``changes`` if the status allows (see the module docstring); True if applied."""

    # -- lines
    @abc.abstractmethod
    async def claim_chunk(
        self, batch: BatchRecord, owner: str, lease_s: float, now: float
    ) -> int | None:
        """A chunk to work on, leased to ``owner``; None when none is free."""

    @abc.abstractmethod
    async def renew_chunk(
        self, batch_id: str, chunk: int, owner: str, lease_s: float, now: float
    ) -> bool:
        """Extend the lease; False if ``owner`` no longer holds it."""

    @abc.abstractmethod
    async def release_chunk(self, batch_id: str, chunk: int, owner: str, done: bool) -> None:
        """Give the chunk up: ``done`` (never handed out again) or free for another claim."""

    @abc.abstractmethod
    async def leases_held(self, batch_id: str, now: float) -> int:
        """Chunks under an unexpired lease."""

    @abc.abstractmethod
    async def done_lines(self, batch_id: str, lines: range) -> set[int]:
        """Indexes in ``lines`` that have a result."""

    @abc.abstractmethod
    async def record_results(self, batch_id: str, results: list[LineResult]) -> int:
        """Keep each line's first result, count them; the number newly recorded."""

    @abc.abstractmethod
    async def results(self, batch_id: str) -> list[LineResult]:
        """Every recorded result, by line index."""
