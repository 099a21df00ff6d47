"""``ledger_durability: journal``: a record is durable in the local journal before the database
has it, the journal's segments go once their records are stored, a dead process's segments are
adopted and replayed (a live one's never), and a journal that fails falls back to the database.
Both SQL ledgers, on real files and a real PostgreSQL; the SIGKILL case is in
``test_durability.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger.journal import Journal
from gateway.ledger.record import decode_records, encode_lines
from gateway.ledger.sql import open_ledger
from gateway.ledger.sql.store import SqlLedger
from tests.ledger.conftest import RecordFactory

#: an fsync's bound: generous, as a loaded box's disk may take seconds
TIMEOUT = 10.0
#: the background flush never comes in these tests unless one asks for it
QUIET = {"flush_interval": 3600.0, "replay_interval": 3600.0}

Opener = Callable[..., Awaitable[SqlLedger]]


@pytest.fixture(params=["sqlite", "postgresql"])
async def open_sql(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """``await open_sql(spool, **settings)``: a started SQL ledger of the param's kind; every
    one of a test shares the database, like replicas (and may share a spool directory)."""
    url = (str(request.getfixturevalue("postgres_url")) if request.param == "postgresql"
           else f"sqlite:///{tmp_path / 'ledger.db'}")
    made: list[SqlLedger] = []

    async def make(spool: Path, **settings: Any) -> SqlLedger:
        ledger = open_ledger(url, spool_dir=spool, settings=LedgerSettings(**settings),
                             migrate=True)
        await ledger.start()
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        await ledger.close()


def journal_files(spool: Path) -> list[Path]:
    return sorted(spool.glob("journal-*.jsonl"))


async def stored_ids(ledger: SqlLedger, tenant: str) -> list[str]:
    return [r.request_id async for r in ledger.export(0, 2**62, tenant)]


async def test_a_journaled_record_is_on_disk_before_the_database_has_it(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    spool = tmp_path / "spool"
    ledger = await open_sql(spool, **QUIET)
    record = make_record(tenant)
    await asyncio.wait_for(ledger.write_journaled(record), TIMEOUT)
    assert await stored_ids(ledger, tenant) == []  # not flushed: the journal holds it
    (segment,) = journal_files(spool)
    records, bad = decode_records(segment.read_bytes())
    assert [r.request_id for r in records] == [record.request_id] and bad == 0
    await ledger.close()
    reader = await open_sql(tmp_path / "reader", **QUIET)
    assert await stored_ids(reader, tenant) == [record.request_id]
    assert journal_files(spool) == []  # stored by the drain: its copy is gone


async def test_a_record_written_alone_is_fsyncd_on_the_loop(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    """With no other request in flight the write is made before ``write_journaled`` returns
    (no hand-off to the journal's thread), and the segment is the same as the thread's."""
    spool = tmp_path / "spool"
    ledger = await open_sql(spool, **QUIET)
    first, second = make_record(tenant), make_record(tenant)
    done = ledger.write_journaled(first, alone=True)
    assert done.done()
    await asyncio.wait_for(ledger.write_journaled(second), TIMEOUT)  # through the thread
    (segment,) = journal_files(spool)
    records, _ = decode_records(segment.read_bytes())
    assert [r.request_id for r in records] == [first.request_id, second.request_id]
    assert ledger.journal is not None and ledger.journal.fsyncs == 2


async def test_sealed_segments_go_once_their_records_are_stored(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    spool = tmp_path / "spool"
    ledger = await open_sql(spool, **QUIET)
    ledger.journal = Journal(spool, max_segment_bytes=1)  # a segment per record
    records = [make_record(tenant) for _ in range(12)]
    for record in records:
        await asyncio.wait_for(ledger.write_journaled(record), TIMEOUT)
    assert len(journal_files(spool)) == 12
    await ledger.flush()
    for _ in range(1000):  # deleting is the journal thread's, after the flush (10 s at most)
        if len(journal_files(spool)) <= 1:
            break
        await asyncio.sleep(0.01)
    assert len(journal_files(spool)) == 1  # the active one stays open for the next record
    assert sorted(await stored_ids(ledger, tenant)) == sorted(r.request_id for r in records)
    assert ledger.journal.unstored == 0


async def test_a_dead_process_journal_is_adopted_and_replayed_once(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    records = [make_record(tenant) for _ in range(5)]
    ledger = await open_sql(spool, **QUIET)
    await ledger.write(records[0])  # one of them also reached the database
    await ledger.flush()
    # what a SIGKILLed process leaves: a segment nobody holds, a torn last line
    (spool / "journal-00000000000000000001-999999.jsonl").write_bytes(
        encode_lines(records) + b'{"request_id": "torn')
    await ledger.replay()
    assert sorted(await stored_ids(ledger, tenant)) == sorted(r.request_id for r in records)
    assert journal_files(spool) == [] and list(spool.glob("spool-*")) == []


async def test_a_live_journal_is_never_adopted(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    spool = tmp_path / "spool"
    writer = await open_sql(spool, **QUIET)
    record = make_record(tenant)
    await asyncio.wait_for(writer.write_journaled(record), TIMEOUT)
    other = await open_sql(spool, **QUIET)  # a second process on the same spool directory
    await other.replay()
    assert len(journal_files(spool)) == 1 and other.stats.replayed == 0
    assert await stored_ids(other, tenant) == []
    await writer.close()
    assert await stored_ids(other, tenant) == [record.request_id]


async def test_a_failing_journal_falls_back_to_the_database(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ledger = await open_sql(tmp_path / "spool", flush_interval=0.05, replay_interval=3600.0)
    ledger.journal = Journal(blocker / "journal")  # every write fails
    first, second = make_record(tenant), make_record(tenant)
    await asyncio.wait_for(ledger.write_journaled(first), 10)  # completes once stored
    assert ledger.journal.broken
    assert await stored_ids(ledger, tenant) == [first.request_id]
    await asyncio.wait_for(ledger.write_journaled(second), 10)  # write_durable now
    assert sorted(await stored_ids(ledger, tenant)) == sorted(
        [first.request_id, second.request_id])


async def test_records_with_one_request_id_are_two_journal_entries(
    tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    """Two records with one request id (a replayed request) are two journal entries: the
    journal keys records by object, so storing one completes neither the other's writer nor
    lets the other's copy go."""
    a = make_record(tenant)
    b = UsageRecord(**{f: getattr(a, f) for f in a.__struct_fields__})
    journal = Journal(tmp_path)
    fa, fb = journal.append(a), journal.append(b)
    journal.stored([a])
    assert (fa.done(), fb.done(), journal.unstored) == (True, False, 1)
    await asyncio.wait_for(fb, TIMEOUT)  # its own fsync
    await journal.close()
    assert len(journal_files(tmp_path)) == 1  # b was never stored: kept for adoption
