"""``ledger_durability: journal``: a record is durable in the local journal before the database
has it, the journal's segments go once their records are stored, a dead process's segments are
adopted and replayed (a live one's never), and a journal that fails falls back to the database.
Both SQL ledgers, on real files and a real PostgreSQL; the SIGKILL case is in
``test_durability.py``."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from gateway.app.state import make_ledger
from gateway.config.model import Store
from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger import journal as journal_module
from gateway.ledger.journal import Journal
from gateway.ledger.record import decode_records, encode_lines
from gateway.ledger.sql import open_ledger
from gateway.ledger.sql.store import SqlLedger
from tests.ledger.conftest import RecordFactory
from tests.ledger.postgres import SQL_DIALECTS

#: an fsync's bound: generous, as a loaded box's disk may take seconds
TIMEOUT = 10.0
#: the background flush never comes in these tests unless one asks for it
QUIET = {"flush_interval": 3600.0, "replay_interval": 3600.0}

Opener = Callable[..., Awaitable[SqlLedger]]


@pytest.fixture(params=SQL_DIALECTS)
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


async def test_a_failed_journal_write_leaves_whole_lines_and_the_journal_recovers(
    tmp_path: Path, tenant: str, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails part-way (ENOSPC after some bytes) is cut back to the segment's last
    whole record, the journal pauses, and after ``RETRY_AFTER`` it journals again in a new
    segment; no segment ever holds a torn line."""
    monkeypatch.setattr(journal_module, "RETRY_AFTER", 0.2)
    journal = Journal(tmp_path)
    first = make_record(tenant)
    await asyncio.wait_for(journal.append(first, alone=True), TIMEOUT)
    real_write = os.write

    def torn(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    second = make_record(tenant)
    with mock.patch("os.write", torn):
        pending = journal.append(second, alone=True)
    assert journal.broken and not pending.done()  # it waits for the ledger's store now
    for path in journal_files(tmp_path):
        assert decode_records(path.read_bytes())[1] == 0  # no torn line
    await asyncio.sleep(0.3)
    third = make_record(tenant)
    await asyncio.wait_for(journal.append(third, alone=True), TIMEOUT)  # journaled again
    assert not journal.broken
    journal.stored([first, second, third])
    assert pending.done()
    written = [r.request_id for p in journal_files(tmp_path)
               for r in decode_records(p.read_bytes())[0]]
    assert second.request_id not in written
    await journal.close()


def test_the_file_system_of_a_path_is_its_longest_mount(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "server:/export /srv/share nfs4 rw 0 0\n"
        "tmpfs /srv/share/fast tmpfs rw 0 0\n"
        "server:/x /mnt/with\\040space cifs rw 0 0\n")
    assert journal_module.filesystem_of("/var/spool", str(mounts)) == "ext4"
    assert journal_module.filesystem_of("/srv/share/spool", str(mounts)) == "nfs4"
    assert journal_module.filesystem_of("/srv/share", str(mounts)) == "nfs4"
    assert journal_module.filesystem_of("/srv/share/fast/j", str(mounts)) == "tmpfs"
    assert journal_module.filesystem_of("/srv/sharex", str(mounts)) == "ext4"
    assert journal_module.filesystem_of("/mnt/with space/j", str(mounts)) == "cifs"
    assert journal_module.filesystem_of("/x", str(tmp_path / "missing")) == ""
    assert journal_module.journal_is_local(tmp_path)  # this test's own disk


def test_auto_durability_journals_on_a_local_disk(tmp_path: Path) -> None:
    """The default (``auto``) journals (``process``) where the spool directory is local."""
    store = Store(data_dir=str(tmp_path / "data"), spool_dir=str(tmp_path / "spool"))
    assert store.ledger_durability == "auto"
    assert make_ledger(store).auto_mode == "process"


async def test_write_now_is_in_the_file_before_its_fdatasync(
    tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    """``process`` durability: the record is in the journal file when ``write_now`` returns
    (what a killed process leaves behind), the fdatasync follows in the background, and the
    copy goes once the ledger stores the record."""
    journal = Journal(tmp_path)
    records = [make_record(tenant) for _ in range(5)]
    assert all(journal.write_now(r) for r in records)
    (path,) = journal_files(tmp_path)
    assert [r.request_id for r in decode_records(path.read_bytes())[0]] == [
        r.request_id for r in records]
    for _ in range(100):  # the background fdatasync
        if journal.fsyncs:
            break
        await asyncio.sleep(0.05)
    assert journal.fsyncs >= 1
    journal.stored(records)
    assert journal.unstored == 0
    await journal.close()
    assert journal_files(tmp_path) == []


async def test_write_process_falls_back_to_the_store_when_the_journal_fails(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ledger = await open_sql(tmp_path / "spool", flush_interval=0.05, replay_interval=3600.0)
    ledger.journal = Journal(blocker / "journal")  # every write fails
    record = make_record(tenant)
    waiter = ledger.write_process(record)
    assert waiter is not None  # not written: it waits for the store
    await asyncio.wait_for(waiter, 10)
    assert await stored_ids(ledger, tenant) == [record.request_id]


async def test_amend_corrects_a_record_before_it_is_stored_and_in_the_journal(
    open_sql: Opener, tmp_path: Path, tenant: str, make_record: RecordFactory
) -> None:
    """A record learnt to be undelivered after it was written is replaced, not followed by a
    second: the store gets the correction, and the journal's last line for it is the
    correction (what a crash would replay)."""
    ledger = await open_sql(tmp_path / "spool", flush_interval=3600.0, replay_interval=3600.0)
    record = make_record(tenant, delivered=True)
    assert ledger.write_process(record) is None
    assert ledger.amend(record, delivered=False, sent_output=0)
    (path,) = journal_files(tmp_path / "spool")
    last = decode_records(path.read_bytes())[0][-1]
    assert (last.request_id, last.delivered) == (record.request_id, False)
    await ledger.flush()
    (stored,) = [r async for r in ledger.export(0, 2**62, tenant)]
    assert stored.delivered is False and stored.request_id == record.request_id
    assert not ledger.amend(stored, delivered=True)  # gone to the store: it keeps what it said
