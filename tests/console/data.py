"""Records for the console tests: three tenants' usage inside the current UTC month (so the
console's default month shows them), with the ledger helpers of ``tests/ledger``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gateway.console.views import parse_month
from tests.ledger.usage_data import DAY, sample_records

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger import UsageRecord
    from gateway.ledger.sql.store import SqlLedger

__all__ = ["MONTH", "RECORDS", "TENANTS", "seed"]

TENANTS = ("acme", "globex", "initech")
MONTH = parse_month(None)
#: from the 1st of this month to the end of today
_DAYS = datetime.now(UTC).day
RECORDS = sample_records(400, TENANTS, seed=39, start=MONTH.lo, days=_DAYS)
assert all(MONTH.lo <= r.ts_ms < MONTH.lo + _DAYS * DAY for r in RECORDS)


async def seed(ledger: SqlLedger, records: Sequence[UsageRecord] = RECORDS) -> None:
    """Write ``records`` into ``ledger`` and close it."""
    await ledger.start()
    try:
        for r in records:
            ledger.write_nowait(r)
        await ledger.flush()
        assert ledger.stats.stored == len(records)
    finally:
        await ledger.close()
