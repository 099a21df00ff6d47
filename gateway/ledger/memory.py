"""The embedded ledger (no Redis): a local journal on disk, totals and records in memory.

For a single gateway process without a Redis URL (the demo, small installs). Each flush
appends the batch to the journal (the spool format: JSON Lines, one ``write`` + ``fsync``)
before it changes anything in memory, so what the reads show survives a restart: ``start``
reads the journal back. Request ids are deduplicated in memory, so the same record written
twice, or a journal read twice, counts once.

Memory grows with the records kept (~0.5 KB each) for ``retention_days``; journal segments
whose records are all past retention are deleted at start. Several processes must not share
one journal directory (each would only see its own records): use Redis for that.
"""

from __future__ import annotations

import os
import time
from datetime import date, timedelta
from typing import TYPE_CHECKING

from gateway.ledger.aggregate import add_record
from gateway.ledger.base import Ledger, LedgerSettings
from gateway.ledger.record import day_of, decode_records
from gateway.ledger.spool import Spool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Mapping

    from gateway.ledger.aggregate import Period
    from gateway.ledger.record import UsageRecord

__all__ = ["MemoryLedger"]

_DAY_MS = 86_400_000


class MemoryLedger(Ledger):
    """Usage records in this process, journaled to ``spool_dir``.

    Args:
        spool_dir: the journal directory; None keeps records in memory only (tests).
        settings: batching and retention (``seen_ttl_days`` is not used: ids are kept as
            long as their records).
    """

    def __init__(
        self,
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        settings: LedgerSettings | None = None,
    ) -> None:
        super().__init__(settings)
        self.journal = (
            Spool(spool_dir, max_segment_bytes=self.settings.spool_segment_bytes, prefix="journal")
            if spool_dir is not None
            else None
        )
        self._seen: dict[str, tuple[str, str]] = {}  # request id -> (tenant, day)
        self._records: dict[tuple[str, str], list[UsageRecord]] = {}
        self._totals: dict[tuple[str, str, str], dict[str, int]] = {}
        self._pruned_day = ""

    def __repr__(self) -> str:
        return (
            f"<MemoryLedger [records: {len(self._seen)} | pending: {self.pending} | "
            f"duplicates: {self.stats.duplicates}]>"
        )

    # -- writing --------------------------------------------------------------------------

    async def _store(self, batch: list[UsageRecord]) -> None:
        fresh = self._fresh(batch)
        if self.journal is not None:
            await self.journal.append(fresh)
        self._apply(fresh)

    def _write_late(self, batch: list[UsageRecord]) -> None:
        fresh = self._fresh(batch)
        if self.journal is not None:
            self.journal.append_sync(fresh)
        self._apply(fresh)

    def _fresh(self, batch: Iterable[UsageRecord]) -> list[UsageRecord]:
        """The records whose request id is new (to the ledger and within the batch)."""
        fresh, ids = [], set()
        for record in batch:
            if record.request_id in self._seen or record.request_id in ids:
                self.stats.duplicates += 1
                continue
            ids.add(record.request_id)
            fresh.append(record)
        return fresh

    def _apply(self, records: Iterable[UsageRecord]) -> None:
        for record in records:
            day = record.day
            self._seen[record.request_id] = (record.tenant, day)
            self._records.setdefault((record.tenant, day), []).append(record)
            add_record(self._totals.setdefault((record.tenant, "d", day), {}), record)
            add_record(self._totals.setdefault((record.tenant, "m", day[:7]), {}), record)
            self.stats.stored += 1
        today = day_of(time.time_ns() // 1_000_000)
        if today != self._pruned_day:
            self._prune(date.fromisoformat(today))
            self._pruned_day = today

    def _prune(self, today: date) -> None:
        """Forget days past ``retention_days`` and months past ``month_retention_days``."""
        day_cut = (today - timedelta(days=self.settings.retention_days)).isoformat()
        month_cut = (today - timedelta(days=self.settings.month_retention_days)).isoformat()[:7]
        for key in [k for k in self._records if k[1] < day_cut]:
            for record in self._records.pop(key):
                self._seen.pop(record.request_id, None)
        for total in list(self._totals):
            _, kind, label = total
            if (kind == "d" and label < day_cut) or (kind == "m" and label < month_cut):
                del self._totals[total]

    async def _start_store(self) -> None:
        """Read the journal back, dropping segments that are wholly past retention."""
        if self.journal is None:
            return
        cutoff = (time.time_ns() // 1_000_000) - (self.settings.retention_days + 1) * _DAY_MS
        for path in self.journal.segment_paths():
            records, _ = decode_records(path.read_bytes())
            if records and max(r.ts_ms for r in records) < cutoff:
                path.unlink()
                continue
            self._apply(self._fresh(records))
        self.stats.stored = 0
        self.stats.duplicates = 0

    async def _close_store(self) -> None:
        if self.journal is not None:
            self.journal.close()

    # -- reading --------------------------------------------------------------------------

    async def tenants(self) -> list[str]:
        return sorted({tenant for tenant, _, _ in self._totals})

    async def _read_totals(self, tenant: str, periods: list[Period]) -> list[Mapping[str, int]]:
        return [dict(self._totals.get((tenant, p.kind, p.label), {})) for p in periods]

    async def _day_records(self, tenant: str, day: str) -> AsyncIterator[UsageRecord]:
        for record in list(self._records.get((tenant, day), ())):
            yield record
