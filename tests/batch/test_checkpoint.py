"""The runner's checkpoint: results it has taken but not yet recorded keep their batch from
being released or finalized, and a failed recording loses no result.

Found under load in the cancel e2e test: a checkpoint had moved 64 results out of the batch's
buffer and was awaiting the state store when the cancel saw "nothing in flight, no results",
released the batch and finalized it: the output file missed those 64 lines while the counts,
recorded a moment later, included them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.auth.resolver import Identity
from gateway.batch.objects import BatchRecord, LineResult
from gateway.batch.output import answer_line
from gateway.batch.runner import BatchRunner, _Work
from gateway.batch.sqlite import SqliteBatchState


class GatedState(SqliteBatchState):
    """SQLite state whose ``record_results`` waits for a gate, or fails, when told to."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.fail = False
        self.recorded: list[tuple[str, int]] = []

    async def record_results(self, batch_id: str, results: list[LineResult]) -> int:
        self.entered.set()
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("state store away")
        self.recorded.append((batch_id, len(results)))
        return len(results)


def work(batch_id: str, n: int) -> _Work:
    record = BatchRecord(id=batch_id, tenant="t", endpoint="/v1/chat/completions",
                         input_file_id="f", completion_window="24h", created_at=0,
                         expires_at=2**40, total=n, model="m", status="cancelling")
    w = _Work(record, [b"{}"] * n, Identity("k", "t"))
    w.results = [answer_line(batch_id, i, f"c{i}", 200, b"{\"ok\": true}") for i in range(n)]
    return w


async def noop() -> None:
    return None


def runner(state: GatedState) -> BatchRunner:
    gateway: Any = SimpleNamespace(ledger=SimpleNamespace(flush=noop))
    return BatchRunner(gateway, SimpleNamespace(state=state), execute=None)  # type: ignore[arg-type]


async def test_stop_waits_for_a_checkpoint_in_progress(tmp_path: Path) -> None:
    state = GatedState(tmp_path)
    r = runner(state)
    w = work("batch_a", 64)
    r._works[w.id] = w
    checkpoint = asyncio.create_task(r._checkpoint())
    await asyncio.wait_for(state.entered.wait(), 5)
    assert not w.results and not w.idle  # taken, not recorded yet
    await r._stop_work(w)  # a cancel arriving now
    assert w.id in r._works  # kept: finalizing now would miss the 64 lines
    state.gate.set()
    await checkpoint
    assert state.recorded == [("batch_a", 64)]
    assert w.id not in r._works  # recorded: now released


async def test_failed_recording_keeps_every_result(tmp_path: Path) -> None:
    state = GatedState(tmp_path)
    state.fail = True
    state.gate.set()
    r = runner(state)
    a, b = work("batch_a", 10), work("batch_b", 7)
    r._works.update({a.id: a, b.id: b})
    with pytest.raises(ConnectionError):
        await r._checkpoint()
    assert (len(a.results), len(b.results)) == (10, 7)  # the next checkpoint tries again
    assert a.saving == b.saving == 0 and not a.idle


async def test_idle_runner_sets_no_timers(tmp_path: Path) -> None:
    """With no batch open on this process, dispatch and checkpoint sleep until one opens
    (an idle gateway does not wake every 50 ms for them); stop() still ends every loop."""
    from gateway.config.model import Batch

    state = GatedState(tmp_path)
    gateway: Any = SimpleNamespace(
        ledger=SimpleNamespace(flush=noop), draining=False,
        runtime=SimpleNamespace(policy=SimpleNamespace(batch=Batch(poll_interval=60.0))))
    r = BatchRunner(gateway, SimpleNamespace(state=state), execute=None)  # type: ignore[arg-type]
    calls = {"dispatch": 0, "checkpoint": 0}

    def counted(name: str, step: Any) -> Any:
        async def run() -> None:
            calls[name] += 1
            await step()
        return run

    r._dispatch = counted("dispatch", r._dispatch)  # type: ignore[method-assign]
    r._checkpoint = counted("checkpoint", r._checkpoint)  # type: ignore[method-assign]
    r.start()
    await asyncio.sleep(0.3)  # six ticks of 50 ms
    assert calls == {"dispatch": 1, "checkpoint": 0}  # dispatch's first look, then asleep
    await asyncio.wait_for(r.stop(timeout=5), 10)
    assert all(t.done() for t in r._loops.values())
