"""Both state stores (SQLite, Redis) under the same tests: leases, first result wins,
compare-and-set transitions, listing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.batch.objects import BatchRecord, LineResult
from gateway.batch.redis import RedisBatchState
from gateway.batch.sqlite import SqliteBatchState
from gateway.batch.state import BatchState
from tests.process_marker import PROCESS
from tests.redis_servers import RedisProc


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=PROCESS)])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchState]:
    if request.param == "redis":
        server: RedisProc = request.getfixturevalue("own_redis")
        yield RedisBatchState.from_url(server.url)
    else:
        yield SqliteBatchState(tmp_path)


def _batch(batch_id: str = "batch_1", total: int = 10, tenant: str = "t") -> BatchRecord:
    return BatchRecord(id=batch_id, tenant=tenant, endpoint="/v1/chat/completions",
                       input_file_id="file-1", completion_window="24h", created_at=1,
                       expires_at=2, total=total, model="m", chunk_lines=4)


def test_leases_results_and_transitions(state: BatchState) -> None:
    async def run() -> None:
        b = _batch()
        await state.create_batch(b)
        assert await state.claim_chunk(b, "p1", 10, now=100) == 0
        assert await state.claim_chunk(b, "p2", 10, now=100) == 1
        assert await state.claim_chunk(b, "p2", 10, now=100) == 2
        assert await state.claim_chunk(b, "p2", 10, now=100) is None  # 3 chunks of 4
        assert await state.leases_held(b.id, now=100) == 3
        # p1 dies: its lease expires and p2 takes the chunk over; p1 can no longer renew
        assert await state.claim_chunk(b, "p2", 10, now=111) == 0
        assert not await state.renew_chunk(b.id, 0, "p1", 10, now=111)
        assert await state.renew_chunk(b.id, 0, "p2", 10, now=111)
        first = [LineResult(0, True, b"a"), LineResult(1, False, b"b")]
        assert await state.record_results(b.id, first) == 2
        assert await state.record_results(b.id, [LineResult(0, False, b"late")]) == 0
        assert await state.done_lines(b.id, range(4)) == {0, 1}
        got = await state.get_batch(b.id)
        assert got is not None and (got.completed, got.failed) == (1, 1)
        assert [r.line for r in await state.results(b.id)] == [b"a", b"b"]
        await state.release_chunk(b.id, 0, "p2", done=True)
        await state.release_chunk(b.id, 1, "p2", done=False)  # free again at once
        assert await state.claim_chunk(b, "p3", 10, now=112) == 1
        assert await state.transition(b.id, ("validating",), {"status": "in_progress"})
        assert not await state.transition(b.id, ("validating",), {"status": "failed"})
        assert await state.transition(b.id, ("in_progress",),
                                      {"status": "finalizing", "final_lease": 50.0})
        assert not await state.transition(b.id, ("in_progress",), {"status": "x"},
                                          retake_final=True, now=40)
        assert await state.transition(b.id, ("in_progress",), {"status": "completed"},
                                      retake_final=True, now=60)
        assert b.id not in await state.active_batches()
        await state.close()

    asyncio.run(run())


def test_list_newest_first_per_tenant(state: BatchState) -> None:
    async def run() -> None:
        for i in range(5):
            await state.create_batch(_batch(f"batch_{i}"))
        await state.create_batch(_batch("batch_other", tenant="u"))
        page, more = await state.list_batches("t", None, 2)
        assert [b.id for b in page] == ["batch_4", "batch_3"] and more
        page, more = await state.list_batches("t", "batch_3", 10)
        assert [b.id for b in page] == ["batch_2", "batch_1", "batch_0"] and not more
        await state.close()

    asyncio.run(run())
