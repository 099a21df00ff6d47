"""The flusher's shape: one batch per wake, two flushes in flight, a bounded buffer.

The PostgreSQL cases hold the flushes inside the database (another session holds a ``SHARE``
lock on ``usage_hourly``, which every flush's rollup upsert must wait for), so what is in
flight is seen in ``pg_stat_activity`` rather than guessed from timing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg

from gateway.ledger import Ledger, LedgerSettings
from gateway.ledger.sql.postgres import PostgresLedger

from .conftest import LedgerFactory, RecordFactory
from .usage_data import assert_reads_match, utc_days

#: bound of a wait for a condition (not a timing assertion: the box is shared)
_PATIENCE = 30.0

_WAITING = """
SELECT count(*) FROM pg_stat_activity
WHERE application_name = 'llm-gateway-ledger' AND wait_event_type = 'Lock'
  AND datname = current_database()
"""
#: the activity view is read once per transaction; the blocker asks from inside its own
_FRESH = "SELECT pg_stat_clear_snapshot()"
_ACTIVITY = """
SELECT pid, application_name, state, wait_event_type, wait_event, left(query, 40)
FROM pg_stat_activity WHERE datname = current_database()
"""


async def _until(condition: object, log: list[object] | None = None) -> None:
    try:
        async with asyncio.timeout(_PATIENCE):
            while not await condition():  # type: ignore[operator]
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not reached; last seen: {(log or [None])[-1]}") from None


async def _started(url: str, tmp_path: Path, **settings: float) -> PostgresLedger:
    # a flush held longer than ``deadline`` would go to the spool: hold them for the test
    ledger = PostgresLedger(url, spool_dir=tmp_path / "spool", migrate=True,
                            deadline=_PATIENCE * 2,
                            settings=LedgerSettings(**settings))  # type: ignore[arg-type]
    await ledger.start()
    return ledger


async def test_two_flushes_in_flight_of_one_batch_each(
    postgres_url: str, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """Ten records with batches of four: two flushes of four are in the database at once
    (the loop does not wait for one to commit before sending the next), the last two wait in
    the buffer for a slot, and no flush took more than a batch."""
    ledger = await _started(postgres_url, tmp_path, batch_size=4, flush_interval=60.0)
    blocker = await asyncpg.connect(postgres_url)
    try:
        first = make_record(tenant)
        ledger.write_nowait(first)
        await ledger.flush()  # the day's partition exists: flushes only wait for the lock
        records = [make_record(tenant) for _ in range(10)]
        activity: list[object] = []
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE usage_hourly IN SHARE MODE")
            for r in records:
                ledger.write_nowait(r)

            async def two_waiting() -> bool:
                await blocker.execute(_FRESH)
                if int(await blocker.fetchval(_WAITING)) == 2:
                    return True
                activity.append([tuple(r) for r in await blocker.fetch(_ACTIVITY)])
                return False

            await _until(two_waiting, activity)
            assert ledger.pending == 10
            assert ledger.stats.flushes == 1

        async def two_done() -> bool:
            return ledger.stats.flushes == 3

        await _until(two_done)
        assert ledger.stats.stored == 9
        await ledger.flush()
        assert ledger.stats.stored == 11 and ledger.pending == 0
        await assert_reads_match(ledger, tenant, [first, *records])
    finally:
        await blocker.close()
        await ledger.close()


async def test_a_durable_writer_waits_for_its_own_batch(
    postgres_url: str, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """Group commit across partial batches: a writer's future completes when the flush that
    carries its record commits, not an earlier one."""
    ledger = await _started(postgres_url, tmp_path, batch_size=4, flush_interval=60.0)
    blocker = await asyncpg.connect(postgres_url)
    try:
        await ledger.write_durable(make_record(tenant))
        stored_when_done: dict[int, int] = {}
        futures = []
        activity: list[object] = []
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE usage_hourly IN SHARE MODE")
            for i in range(10):
                future = ledger.write_durable(make_record(tenant))
                future.add_done_callback(
                    lambda _, i=i: stored_when_done.setdefault(i, ledger.stats.stored))
                futures.append(future)

            async def two_waiting() -> bool:
                await blocker.execute(_FRESH)
                if int(await blocker.fetchval(_WAITING)) == 2:
                    return True
                activity.append([tuple(r) for r in await blocker.fetch(_ACTIVITY)])
                return False

            await _until(two_waiting, activity)
            assert not any(f.done() for f in futures)
        async with asyncio.timeout(_PATIENCE):
            await asyncio.gather(*futures)
        assert ledger.stats.stored == 11
        # records 0-7 were in the first two flushes (4 each), 8 and 9 in a third (2) that
        # starts when a slot frees: 8 and 9 are done only once a 4 and their 2 are stored
        assert all(stored_when_done[i] >= 1 + 4 for i in range(8))
        assert stored_when_done[8] >= 1 + 4 + 2 and stored_when_done[9] >= 1 + 4 + 2
    finally:
        await blocker.close()
        await ledger.close()


async def test_a_full_buffer_goes_to_the_spool(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """Writers faster than the store: past ``max_buffer`` the waiting records are handed to
    the spool (nothing dropped, the writes never wait), durable writers complete once their
    spill is fsync'd, and a replay stores every record once."""
    ledger: Ledger = await make_ledger(batch_size=4, max_buffer=8, flush_interval=60.0,
                                       replay_interval=3600.0)
    records = [make_record(tenant) for _ in range(20)]
    futures = [ledger.write_durable(r) for r in records]  # no await: the flusher never ran
    assert ledger.stats.overflowed == 16
    await ledger.flush()
    async with asyncio.timeout(_PATIENCE):
        await asyncio.gather(*futures)
    assert ledger.stats.spooled == 16 and ledger.stats.stored == 4
    assert await ledger.replay() == 16  # type: ignore[attr-defined]
    assert ledger.stats.stored == 20
    for day in utc_days(records):
        assert await ledger.drift(tenant, day) == []
    await assert_reads_match(ledger, tenant, records)
