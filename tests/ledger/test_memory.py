"""The embedded ledger's journal: a restart reads it back, counting each record once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger import MemoryLedger, day_of

if TYPE_CHECKING:
    from tests.ledger.conftest import RecordFactory


async def test_restart_reads_the_journal(tmp_path: Path, make_record: RecordFactory) -> None:
    first = MemoryLedger(tmp_path)
    await first.start()
    records = [make_record("acme") for _ in range(50)]
    for r in records:
        await first.write(r)
    await first.close()

    second = MemoryLedger(tmp_path)
    await second.start()
    for r in records[:10]:  # written again after the restart: still once
        await second.write(r)
    await second.flush()
    day = day_of(records[0].ts_ms)
    (row,) = await second.usage("acme", day, day, group_by=())
    assert row.requests == 50
    assert row.output == sum(r.output for r in records)
    assert await second.reconcile("acme", day) == []
    await second.close()


async def test_journal_is_fsynced_per_flush(tmp_path: Path, make_record: RecordFactory) -> None:
    ledger = MemoryLedger(tmp_path)
    await ledger.start()
    for _ in range(3):
        for _ in range(20):
            await ledger.write(make_record("acme"))
        await ledger.flush()
    assert ledger.journal is not None
    assert (ledger.journal.appended, ledger.journal.fsyncs) == (60, 3)
    await ledger.close()
