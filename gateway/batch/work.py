"""This process's share of one batch, and what dispatching its lines looks up.

:class:`Work` is the runner's per-process record of a batch it runs lines of: the input lines,
the chunks (leases) it holds and their lines not yet recorded, the lines ready or delayed for a
retry, the results waiting for the checkpoint, and its own in-flight cap.
:func:`pools_of` and :func:`max_held` are what the dispatch reads of the pools and the
settings; :func:`line_custom_id` is the ``custom_id`` an error line repeats.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.batch.validate import parse_line
from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from gateway.auth.resolver import Identity
    from gateway.batch.objects import BatchRecord, LineResult
    from gateway.config.model import Batch as BatchSettings
    from gateway.routing.pool import PoolState
    from gateway.runtime import Runtime

__all__ = ["Work", "line_custom_id", "max_held", "pools_of"]


@dataclass(eq=False)
class Work:
    """This process's share of one batch (per process, not shared)."""

    record: BatchRecord
    lines: list[bytes]
    identity: Identity
    held: dict[int, set[int]] = field(default_factory=dict)  # chunk -> lines not yet recorded
    ready: deque[int] = field(default_factory=deque)
    delayed: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, line) heap
    results: list[LineResult] = field(default_factory=list)  # waiting for the checkpoint
    saving: int = 0  # results a checkpoint took and has not recorded yet
    in_flight: int = 0
    exhausted: bool = False  # no chunk left to claim (until the next refresh)
    stopping: bool = False  # cancelling or expiring: start nothing new
    cap: float = 0.0  # own in-flight cap (halved on quota refusals)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def idle(self) -> bool:
        """Nothing running and every result recorded: only then may the batch be released or
        finalized (a checkpoint between taking results and recording them is not idle, or a
        finalize would miss those lines while the counts include them)."""
        return self.in_flight == 0 and not self.results and self.saving == 0

    def next_ready(self, now: float) -> int | None:
        if self.delayed and self.delayed[0][0] <= now:
            return heapq.heappop(self.delayed)[1]
        return self.ready.popleft() if self.ready else None

    def drop_chunk(self, chunk: int) -> None:
        lines = self.held.pop(chunk, set())
        self.ready = deque(i for i in self.ready if i not in lines)
        self.delayed = [d for d in self.delayed if d[1] not in lines]
        heapq.heapify(self.delayed)


def max_held(settings: BatchSettings) -> int:
    """Chunks one process holds at once: enough to fill its in-flight ceiling, and one more."""
    return -(-settings.max_in_flight // settings.chunk_lines) + 1


def pools_of(runtime: Runtime, model_name: str) -> tuple[PoolState, list[PoolState]] | None:
    """The batch pool of a model and its interactive pools (which batch work yields to)."""
    model = runtime.models.get(model_name)
    if model is None:
        return None
    pools = runtime.router.pools
    batch_pool = pools[model.pool_for("batch")]
    names = sorted({model.pool, *model.pools.values()})
    interactive = [pools[n] for n in names if pools[n].request_class != "batch"]
    return batch_pool, interactive


def line_custom_id(line: bytes) -> str:
    try:
        return parse_line(line)[0].custom_id
    except InvalidRequest:
        return ""
