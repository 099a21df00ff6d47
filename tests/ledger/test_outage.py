"""PostgreSQL going away under load: records spool (durably), then replay exactly once when
it is back; a database down at start only means spooling until it answers."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger.sql.postgres import PostgresLedger
from tests.ledger.usage_data import assert_reads_match

if TYPE_CHECKING:
    from tests.ledger.conftest import RecordFactory
    from tests.ledger.postgres import PostgresServer

FAST = LedgerSettings(replay_interval=0.1)


def ledger_for(url: str, spool: Path) -> PostgresLedger:
    return PostgresLedger(url, spool_dir=spool, migrate=True, deadline=1.0,
                          connect_timeout=1.0, settings=FAST)


async def settle(ledger: PostgresLedger, timeout: float = 60.0) -> None:
    """Wait until nothing is buffered or spooled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await ledger.flush()
        await ledger.replay()
        if ledger.pending == 0 and not ledger.spool.segment_paths():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"ledger did not settle: {ledger!r}")


async def check_exact(ledger: PostgresLedger, tenant: str, records: list[UsageRecord]) -> None:
    """The database holds each record exactly once, whole, and the rollups equal their sum:
    ``export`` against the records, ``usage_rows`` against their sums computed in Python,
    ``drift`` empty on each of their days."""
    stored = [r async for r in ledger.export(0, 2**62, tenant)]
    ids = [r.request_id for r in stored]
    assert len(ids) == len(set(ids)), "a record was stored twice"
    assert set(ids) == {r.request_id for r in records}, "a record was lost"
    await assert_reads_match(ledger, tenant, records)


async def test_stopped_under_load(own_postgres: PostgresServer, tmp_path: Path,
                                  make_record: RecordFactory, tenant: str) -> None:
    """Stopped and started again while writers run: every durable write completed
    (spooled while it was away); after replay each record is one row, totals exact."""
    ledger = ledger_for(own_postgres.url, tmp_path / "spool")
    await ledger.start()
    records = [make_record(tenant) for _ in range(900)]
    try:
        await asyncio.gather(*(ledger.write_durable(r) for r in records[:300]))
        await asyncio.to_thread(own_postgres.stop)
        await asyncio.gather(*(ledger.write_durable(r) for r in records[300:600]))
        assert ledger.stats.spooled > 0
        await asyncio.to_thread(own_postgres.start)
        await asyncio.gather(*(ledger.write_durable(r) for r in records[600:]))
        await settle(ledger)
        await check_exact(ledger, tenant, records)
    finally:
        await ledger.close()


async def test_killed_under_load(own_postgres: PostgresServer, tmp_path: Path,
                                 make_record: RecordFactory, tenant: str) -> None:
    """SIGKILL to PostgreSQL while a flush is in flight: a commit it acknowledged survives
    its crash recovery; what it did not acknowledge was spooled; nothing twice."""
    ledger = ledger_for(own_postgres.url, tmp_path / "spool")
    await ledger.start()
    records = [make_record(tenant) for _ in range(1200)]
    try:
        writes = [asyncio.ensure_future(ledger.write_durable(r)) for r in records[:800]]
        await asyncio.sleep(0)
        await asyncio.to_thread(own_postgres.kill)
        await asyncio.gather(*writes)
        await asyncio.gather(*(ledger.write_durable(r) for r in records[800:1000]))
        await asyncio.to_thread(own_postgres.start)
        await asyncio.gather(*(ledger.write_durable(r) for r in records[1000:]))
        await settle(ledger)
        await check_exact(ledger, tenant, records)
    finally:
        await ledger.close()


async def test_unreachable_at_start_spools(own_postgres: PostgresServer, tmp_path: Path,
                                           make_record: RecordFactory, tenant: str) -> None:
    """A database that is down when the gateway starts: it starts anyway, spools, and the
    replayer stores everything once the database answers."""
    first = ledger_for(own_postgres.url, tmp_path / "spool-0")
    await first.start()  # creates the schema
    await first.close()
    await asyncio.to_thread(own_postgres.stop)
    ledger = ledger_for(own_postgres.url, tmp_path / "spool")
    await ledger.start()
    records = [make_record(tenant) for _ in range(200)]
    try:
        await asyncio.gather(*(ledger.write_durable(r) for r in records))
        assert ledger.stats.spooled == 200
        assert await ledger.replay() == 0 and ledger.spool.segment_paths()
        await asyncio.to_thread(own_postgres.start)
        await settle(ledger)
        await check_exact(ledger, tenant, records)
    finally:
        await ledger.close()


async def test_spool_replayed_twice_counts_once(postgres_url: str, tmp_path: Path,
                                                make_record: RecordFactory, tenant: str
                                                ) -> None:
    """A spool left by a process that could not reach the database is replayed at the next
    start; a copy of it replayed again (a crash mid-replay) adds nothing."""
    spool = tmp_path / "spool"
    down = ledger_for("postgresql://nobody@127.0.0.1:9/none", spool)
    await down.start()
    records = [make_record(tenant) for _ in range(700)]
    for r in records:
        await down.write(r)
    await down.close()
    assert down.stats.spooled == 700
    segments = sorted(spool.glob("spool-*.jsonl"))
    assert segments
    backup = tmp_path / "backup"
    backup.mkdir()
    for seg in segments:
        shutil.copy(seg, backup / seg.name)
    dupe = segments[0].with_name(segments[0].name.replace("spool-", "spool-0"))
    shutil.copy(segments[0], dupe)  # the same records twice in one spool

    up = ledger_for(postgres_url, spool)
    await up.start()  # replays the leftover spool
    try:
        await settle(up)
        await check_exact(up, tenant, records)
        for seg in backup.iterdir():
            shutil.copy(seg, spool / seg.name)
        assert await up.replay() == 0  # nothing new
        assert not list(spool.glob("spool-*.jsonl"))
        await check_exact(up, tenant, records)
    finally:
        await up.close()
