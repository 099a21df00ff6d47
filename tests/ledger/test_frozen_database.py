"""A frozen PostgreSQL (SIGSTOP: connections accepted, nothing answered): one flush waits on it,
every later one goes straight to the spool, the database is probed in the background only, and
every record is stored exactly once after it thaws."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.ledger import LedgerSettings
from gateway.ledger.sql.postgres import PostgresLedger
from tests.ledger.test_outage import check_exact, settle

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger import UsageRecord
    from tests.ledger.conftest import RecordFactory
    from tests.ledger.postgres import PostgresServer


class CountingLedger(PostgresLedger):
    """The PostgreSQL ledger, counting the writes and probes it sends to the database."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inserts = 0
        self.probes = 0

    async def _insert(self, batch: Sequence[UsageRecord]) -> int:
        self.inserts += 1
        return await super()._insert(batch)

    async def _probe(self) -> None:
        self.probes += 1
        await super()._probe()


async def test_a_frozen_database_is_tried_once_then_probed_in_the_background(
    own_postgres: PostgresServer, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    ledger = CountingLedger(own_postgres.url, spool_dir=tmp_path / "spool", migrate=True,
                            deadline=1.0, connect_timeout=1.0,
                            settings=LedgerSettings(replay_interval=0.2))
    await ledger.start()
    records = [make_record(tenant) for _ in range(60)]
    try:
        await ledger.write_durable(records[0])  # warm: the pool is connected
        own_postgres.signal_all(signal.SIGSTOP)
        inserts_before = ledger.inserts
        try:
            # six waves of durable writers over ~3 s: each completes (spooled), and only the
            # first wave's flush waited on the frozen server
            for wave in range(6):
                batch = records[1 + wave * 10 : 11 + wave * 10]
                await asyncio.gather(*(ledger.write_durable(r) for r in batch))
                await asyncio.sleep(0.5)
            assert ledger.inserts - inserts_before == 1, ledger
            assert not ledger.database_up
            assert ledger.stats.spooled >= 50
            assert ledger.probes >= 1  # the background replayer kept probing meanwhile
        finally:
            own_postgres.signal_all(signal.SIGCONT)
        await settle(ledger)
        assert ledger.database_up
        await check_exact(ledger, tenant, records)
    finally:
        await ledger.close()
