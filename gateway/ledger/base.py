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

A store implements ``_store`` (make a batch durable somewhere, or raise) and the reads:
``usage_rows`` (rollup sums, any grouping, keyset pages), ``export`` (records in keyset
chunks), ``drift`` (a day's rollups against its records) and ``tenants``. The stores of record
(``sql/``) answer them in SQL; there is no other way to read usage.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.ledger.sql.usage_query import DEFAULT_LIMIT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from datetime import date

    from gateway.ledger.record import UsageRecord
    from gateway.ledger.sql.drift import Drift
    from gateway.ledger.sql.usage_query import UsagePage

__all__ = ["Ledger", "LedgerSettings", "LedgerStats"]

log = logging.getLogger(__name__)


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
    """Usage records: ``write`` one per admitted request; read rollup rows, records, drift.

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

    # -- reads (the stores of record answer them from their rollups and records) ---------

    @abc.abstractmethod
    async def tenants(self) -> list[str]:
        """Tenants that have records (sorted)."""

    @abc.abstractmethod
    async def usage_rows(self, tenant: str | None, lo_ms: int, hi_ms: int,
                         group_by: Sequence[str], *, limit: int = DEFAULT_LIMIT,
                         after: str | None = None) -> UsagePage:
        """Rollup sums of ``tenant`` (None: every tenant) for the hours starting in
        ``[lo_ms, hi_ms)``, grouped by ``group_by`` (any of ``usage_query.DIMENSIONS``), in
        group order, ``limit`` rows from after the cursor ``after``. Raises
        ``UsageQueryError`` (naming the parameter) for a grouping, limit or cursor it
        cannot answer."""

    @abc.abstractmethod
    def export(
        self, from_ts: int, to_ts: int, tenant: str | None = None, *, chunk: int = 1000
    ) -> AsyncIterator[UsageRecord]:
        """Records with ``from_ts <= ts_ms < to_ts`` (unix ms), one tenant or all; ordered by
        tenant (code point), then time, then request id; read ``chunk`` records at a time."""

    @abc.abstractmethod
    async def drift(self, tenant: str, day: date) -> list[Drift]:
        """Every (hour, group, counter) of ``tenant``'s UTC ``day`` where the rollups differ
        from the sum of the records (empty: the day is consistent)."""

    # -- what a store provides ------------------------------------------------------------

    @abc.abstractmethod
    async def _store(self, batch: list[UsageRecord]) -> None:
        """Make ``batch`` durable (stored or spooled), or raise and keep nothing half-done
        that a retry could double count."""

    @abc.abstractmethod
    def _write_late(self, batch: list[UsageRecord]) -> None:
        """Durably keep records that arrive after ``close`` (blocking is acceptable)."""

    @abc.abstractmethod
    async def _start_store(self) -> None:
        """Start store tasks (spool replay); called once by ``start``."""

    @abc.abstractmethod
    async def _close_store(self) -> None:
        """Release store resources after the final drain."""
