"""The ledger interface, and the write path both stores share: buffer, flusher, drain.

``write_nowait`` never waits on I/O: it appends the record to an in-process list and returns
(a microsecond or two). A background flusher hands the list to the store every
``flush_interval`` seconds, or at once when ``batch_size`` records are waiting. ``close``
stops the flusher and drains what is left, so a normal shutdown (SIGTERM -> lifespan exit)
loses nothing.

``write_durable`` is the group commit: it queues the record the same way and returns a future
that completes once the record is durable (committed to the store, or fsync'd to the spool).
It wakes the flusher at once; records written while a flush is in flight wait for the next
one, so one commit (one fsync) serves every request that finished during the previous one.
The pipeline sends a response's last bytes only after that future completes, so a SIGKILL
can only lose records whose clients did not receive a complete response.

With ``write_nowait`` alone, a record is durable ``flush_interval`` plus one flush after
``write`` (~50-60 ms; ``stats.max_lag_ms`` measures it): a SIGKILL, OOM kill or power loss in
that window loses it. Every other exit path goes through ``close``.

A store implements ``_store`` (make a batch durable somewhere, or raise) and the reads
(``_read_totals``, ``_day_records``, ``tenants``); usage rows, exports and reconciliation are
built here from those, the same way for every store.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING

from gateway.ledger.aggregate import Period, parse_day, plan_periods, rows_from
from gateway.ledger.reconcile import diff_totals, sum_records
from gateway.ledger.record import day_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from gateway.ledger.aggregate import UsageRow
    from gateway.ledger.reconcile import Difference
    from gateway.ledger.record import UsageRecord

__all__ = ["DEFAULT_GROUP_BY", "Ledger", "LedgerSettings", "LedgerStats"]

log = logging.getLogger(__name__)

DEFAULT_GROUP_BY = ("day", "model", "class")
_DAY_MS = 86_400_000


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerSettings:
    """How the ledger batches, retains and replays.

    Args:
        flush_interval: the longest a ``write_nowait`` record waits in memory before its
            batch is flushed (``write_durable`` flushes at once).
        batch_size: flush at once when this many records wait; also the records per
            transaction.
        retention_days: how long raw records are kept after their day (the rollups stay).
        replay_interval: how often the spool is checked for records to replay.
        spool_segment_bytes: a spool file is rotated past this size.
    """

    flush_interval: float = 0.05
    batch_size: int = 256
    retention_days: int = 90
    replay_interval: float = 1.0
    spool_segment_bytes: int = 16 * 1024 * 1024


@dataclass(slots=True)
class LedgerStats:
    """Counters of one ledger since start; ``max_lag_ms`` is the measured durability window."""

    written: int = 0
    stored: int = 0
    duplicates: int = 0
    spooled: int = 0
    replayed: int = 0
    flushes: int = 0
    flush_errors: int = 0
    max_lag_ms: float = 0.0
    last_lag_ms: float = 0.0


class Ledger(abc.ABC):
    """Usage records: ``write`` one per admitted request; read totals, records, differences.

    Lifecycle: ``await start()`` once (in the app lifespan), ``write`` per request, ``await
    close()`` on the way out. ``write`` before ``start`` buffers; after ``close`` it goes
    straight to the spool (blocking, but only on the shutdown path).
    """

    def __init__(self, settings: LedgerSettings | None = None) -> None:
        self.settings = settings or LedgerSettings()
        self.stats = LedgerStats()
        self._buffer: list[UsageRecord] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._oldest_ns = 0
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    # -- the write path -------------------------------------------------------------------

    def write_nowait(self, record: UsageRecord) -> None:
        """Queue one record; no I/O, never raises for store trouble."""
        self.stats.written += 1
        if self._closed:
            self._write_late([record])
            return
        buffer = self._buffer
        if not buffer:
            self._oldest_ns = time.monotonic_ns()
        buffer.append(record)
        if len(buffer) >= self.settings.batch_size:
            self._wake.set()

    def write_durable(self, record: UsageRecord) -> asyncio.Future[None]:
        """Queue one record and flush as soon as the store is free: the future completes
        when the record is durable (never with an error: a store that fails spools)."""
        waiter = asyncio.get_running_loop().create_future()
        self.write_nowait(record)
        if self._closed:  # written to the spool synchronously by write_nowait
            waiter.set_result(None)
        else:
            self._waiters.append(waiter)
            self._wake.set()
        return waiter

    async def write(self, record: UsageRecord) -> None:
        """``write_nowait`` as a coroutine; it never suspends, so a cancelled caller's
        ``finally`` cannot be interrupted inside it."""
        self.write_nowait(record)

    @property
    def pending(self) -> int:
        """Records written but not yet durable."""
        return len(self._buffer)

    async def start(self) -> None:
        """Start the flusher (and the store's own tasks)."""
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._run_flusher(), name="ledger-flusher")
            try:
                await self._start_store()
            except BaseException:  # a refused start (a schema this gateway does not know)
                self._flusher.cancel()
                self._flusher = None
                raise

    async def flush(self) -> None:
        """Make every record written so far durable (stored or spooled) before returning."""
        async with self._flush_lock:
            while self._buffer:
                batch, oldest, waiters = self._buffer, self._oldest_ns, self._waiters
                self._buffer, self._waiters = [], []
                try:
                    await self._store(batch)
                except BaseException:
                    self.stats.flush_errors += 1
                    self._buffer[:0] = batch  # nothing is dropped: next tick tries again
                    self._waiters[:0] = waiters
                    self._oldest_ns = oldest
                    raise
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                lag = (time.monotonic_ns() - oldest) / 1e6
                self.stats.flushes += 1
                self.stats.last_lag_ms = lag
                self.stats.max_lag_ms = max(self.stats.max_lag_ms, lag)

    async def close(self) -> None:
        """Stop the background tasks and drain the buffer; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            async with self._flush_lock:  # never cancel the flusher in the middle of a batch
                self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        try:
            await self.flush()
        except Exception:  # the store failed even to spool: keep the records on disk anyway
            log.exception("ledger drain failed; writing %d records to the spool", self.pending)
            self._write_late(self._buffer)
            self._buffer = []
        for waiter in self._waiters:  # durable now, one way or the other
            if not waiter.done():
                waiter.set_result(None)
        self._waiters = []
        await self._close_store()

    async def _run_flusher(self) -> None:
        interval = self.settings.flush_interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._buffer:
                try:
                    await self.flush()
                except Exception:
                    log.exception("ledger flush failed; %d records kept for retry", self.pending)

    # -- reads ----------------------------------------------------------------------------

    async def usage(
        self,
        tenant: str,
        since_day: date | str,
        until_day: date | str,
        group_by: Sequence[str] = DEFAULT_GROUP_BY,
    ) -> list[UsageRow]:
        """One tenant's totals for the UTC days ``since_day..until_day`` (inclusive), grouped
        by any of day, month, model, class, batch."""
        periods = plan_periods(parse_day(since_day), parse_day(until_day), by_day="day" in group_by)
        totals = await self._read_totals(tenant, periods)
        return rows_from(tenant, zip(periods, totals, strict=True), group_by)

    async def usage_all(
        self,
        since_day: date | str,
        until_day: date | str,
        group_by: Sequence[str] = DEFAULT_GROUP_BY,
    ) -> list[UsageRow]:
        """``usage`` for every tenant with records (admin), rows tagged by tenant."""
        rows: list[UsageRow] = []
        for tenant in await self.tenants():
            rows.extend(await self.usage(tenant, since_day, until_day, group_by))
        return rows

    async def export(
        self, from_ts: int, to_ts: int, tenant: str | None = None
    ) -> AsyncIterator[UsageRecord]:
        """Records with ``from_ts <= ts_ms < to_ts`` (unix ms), one tenant or all; ordered
        by tenant, then day, then arrival. Streams: one day partition in memory at a time."""
        tenants = [tenant] if tenant is not None else await self.tenants()
        # only days that can hold records: retention behind, a day of clock skew ahead
        now = time.time_ns() // 1_000_000
        lo = max(from_ts, now - (self.settings.retention_days + 1) * _DAY_MS)
        hi = min(to_ts, now + _DAY_MS)
        if lo >= hi:
            return
        first, last = day_of(lo), day_of(hi - 1)
        days = _days(date.fromisoformat(first), date.fromisoformat(last))
        for t in tenants:
            for day in days:
                async for record in self._day_records(t, day):
                    if from_ts <= record.ts_ms < to_ts:
                        yield record

    async def reconcile(self, tenant: str, day: date | str) -> list[Difference]:
        """Differences between the day's stored totals and the sum of its records."""
        label = parse_day(day).isoformat()
        (stored,) = await self._read_totals(tenant, [Period("d", label)])
        records = [r async for r in self._day_records(tenant, label)]
        return diff_totals(tenant, label, stored, sum_records(records))

    @abc.abstractmethod
    async def tenants(self) -> list[str]:
        """Tenants that have records (sorted)."""

    # -- what a store provides ------------------------------------------------------------

    @abc.abstractmethod
    async def _store(self, batch: list[UsageRecord]) -> None:
        """Make ``batch`` durable (stored or spooled), or raise and keep nothing half-done
        that a retry could double count."""

    @abc.abstractmethod
    def _write_late(self, batch: list[UsageRecord]) -> None:
        """Durably keep records that arrive after ``close`` (blocking is acceptable)."""

    @abc.abstractmethod
    async def _read_totals(self, tenant: str, periods: list[Period]) -> list[Mapping[str, int]]:
        """The ``{field: int}`` totals of each period, in order (empty when none)."""

    @abc.abstractmethod
    def _day_records(self, tenant: str, day: str) -> AsyncIterator[UsageRecord]:
        """The records of one tenant's day partition, in arrival order."""

    @abc.abstractmethod
    async def _start_store(self) -> None:
        """Start store tasks (spool replay); called once by ``start``."""

    @abc.abstractmethod
    async def _close_store(self) -> None:
        """Release store resources after the final drain."""


def _days(first: date, last: date) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
