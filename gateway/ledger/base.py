"""The ledger interface, and the write path both stores share: buffer, flusher, drain.

``write_nowait`` never waits on I/O: it appends the record to an in-process list and returns
(a microsecond or two). A background flusher takes one batch per wake: it waits for
``batch_size`` records, a durable writer or ``flush_interval``, whichever comes first, takes
at most ``batch_size`` records and flushes them in a task of its own. ``in_flight`` flushes (two)
run at once, so the loop fills and encodes the next batch while the database commits the
previous one; when both are busy, records wait in the buffer and the next batch is full.
The buffer is bounded (``max_buffer``): a write that finds it full hands everything waiting to
the spool (an fsync in a worker thread; replayed later), so a store slower than the writers
costs neither memory without bound, nor a blocked loop, nor a record. ``close`` stops the
flusher and drains what is left, so a normal shutdown (SIGTERM -> lifespan exit) loses nothing.

``write_durable`` is the group commit: it queues the record the same way and returns a future
that completes once the record is durable (committed to the store, or fsync'd to the spool).
It wakes the flusher: the flush starts at once when none is under way; otherwise the
writers gather until that one commits (or a full batch is waiting), so one commit (one fsync)
serves every request that finished meanwhile, and the second flush slot is used by full
batches only.
The pipeline sends a response's last bytes only after that future completes, so a SIGKILL
can only lose records whose clients did not receive a complete response.

``write_journaled`` keeps the same promise at a lower latency where the store has a local
journal (``journal.py``, the SQL stores): the record is buffered as by ``write_nowait`` and
its future completes once a copy is fsync'd to the journal (one fsync per group), or once the
record is stored, whichever is first; the journal's copies go when their records are stored.

With ``write_nowait`` alone, a record is durable ``flush_interval`` plus one flush after
``write`` (~50-60 ms; ``stats.max_lag_ms`` measures it): a SIGKILL, OOM kill or power loss in
that window loses it. Every other exit path goes through ``close``.

A store implements ``_store`` (make a batch durable somewhere, or raise), ``_spill`` (to the
spool) and the reads:
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
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from gateway.ledger.health import Durability
from gateway.ledger.sql.usage_query import DEFAULT_LIMIT

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Coroutine, Sequence
    from datetime import date

    from gateway.ledger.journal import Journal
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
        batch_size: flush at once when this many records wait; also the records one flush
            takes and the records per transaction.
        in_flight: flushes running at once (two: the loop fills the next batch while the
            database commits the previous).
        max_buffer: records kept in memory waiting for a flush; past it, what waits goes to
            the spool (fsync'd in a worker thread) and is replayed from there.
        retention_days: how long raw records are kept after their day (the rollups stay).
        replay_interval: how often the spool is checked for records to replay.
        spool_segment_bytes: a spool file is rotated past this size.
    """

    flush_interval: float = 0.05
    batch_size: int = 256
    in_flight: int = 2
    max_buffer: int = 16_384
    retention_days: int = 90
    replay_interval: float = 1.0
    spool_segment_bytes: int = 16 * 1024 * 1024


@dataclass(slots=True)
class LedgerStats:
    """Counters of one ledger since start; ``max_lag_ms`` is the measured durability window.
    ``overflowed`` counts records sent to the spool because the buffer was full."""

    written: int = 0
    stored: int = 0
    duplicates: int = 0
    spooled: int = 0
    overflowed: int = 0
    replayed: int = 0
    #: spool lines a replay could not parse (a torn tail, never acknowledged; or a bug)
    spool_bad_lines: int = 0
    flushes: int = 0
    flush_errors: int = 0
    max_lag_ms: float = 0.0
    last_lag_ms: float = 0.0


@dataclass(slots=True)
class _Batch:
    """Records taken from the buffer together, the durable writers waiting on them, and when
    the oldest was written (for the lag)."""

    records: list[UsageRecord]
    #: (the record's index in ``records``, its writer's future), in index order
    waiters: list[tuple[int, asyncio.Future[None]]]
    oldest_ns: int


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
        #: durable writers: (their record's index in the buffer, the future), in index order
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._oldest_ns = 0
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(self.settings.in_flight)
        #: flushes and overflow spills under way, and how many records they carry
        self._in_flight: set[asyncio.Task[None]] = set()
        self._in_flight_records = 0
        self._flushing = 0  # flushes (not spills) under way
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        #: the local journal of ``write_journaled`` (None: it is ``write_durable``)
        self.journal: Journal | None = None
        #: provisional records of streams under way (``provisional``); None: not kept
        self.inflight: Journal | None = None
        #: whether records can be made durable now (``/readyz``, one log line per change)
        self.durability = Durability()
        #: batches being flushed, and corrections of their records (``amend``) to apply if
        #: the flush fails and they are retried, by ``id`` of the record they replace
        self._flushing_batches: list[_Batch] = []
        self._amended: dict[int, UsageRecord] = {}
        #: ``id`` of a final record -> the provisional records it stands for (``supersede``)
        self._superseding: dict[int, list[UsageRecord]] = {}
        #: what ``ledger_durability: auto`` means for this ledger (``process`` where its
        #: spool directory is on this host's own disk), set by whoever opens it
        self.auto_mode: Literal["commit", "process"] = "commit"

    # -- the write path -------------------------------------------------------------------

    def write_nowait(self, record: UsageRecord) -> None:
        """Queue one record; no I/O, never raises for store trouble."""
        self._append(record)

    def write_durable(self, record: UsageRecord) -> asyncio.Future[None]:
        """Queue one record and flush as soon as a flush slot is free: the future completes
        when the record is durable (never with an error: a store that fails spools)."""
        waiter = asyncio.get_running_loop().create_future()
        index = self._append(record)
        if index < 0:  # written to the spool synchronously (after close)
            waiter.set_result(None)
        else:
            self._waiters.append((index, waiter))
            self._wake.set()
        return waiter

    def write_journaled(self, record: UsageRecord, *, alone: bool = False
                        ) -> asyncio.Future[None]:
        """Queue one record as ``write_nowait`` does; the future completes once it is durable
        in the local journal or in the store (``write_durable`` without a working journal).
        ``alone``: no other request is in flight (``Journal.append``)."""
        journal = self.journal
        if journal is None or not journal.usable() or self._closed:
            return self.write_durable(record)
        self._append(record)
        return journal.append(record, alone=alone)

    def write_process(self, record: UsageRecord) -> asyncio.Future[None] | None:
        """``ledger_durability: process``: write the record to the local journal file now
        (``Journal.write_now``: a killed process cannot lose it; the fdatasync follows in the
        background) and buffer it as ``write_nowait`` does; None once written. Without a
        working journal it is ``write_durable`` (the future to wait for)."""
        journal = self.journal
        if journal is None or self._closed or not journal.write_now(record):
            return self.write_durable(record)
        self._append(record)
        return None

    def amend(self, record: UsageRecord, **changes: Any) -> bool:
        """Correct a record this process has not handed to its store yet (a fact learnt after
        it was made: its answer did not reach the client): the one record is replaced before
        it is written, never followed by a second. A record in a flush under way is replaced
        if that flush fails and is retried. False when it is gone (stored or spooled): it
        keeps what it said. The journal's copy (what a crash would replay) is replaced too."""
        corrected = msgspec.structs.replace(record, **changes)
        if self._superseding and (standing := self._superseding.pop(id(record), None)):
            self._superseding[id(corrected)] = standing
        buffer = self._buffer
        for i in range(len(buffer) - 1, -1, -1):
            if buffer[i] is record:
                buffer[i] = corrected
                if self.journal is not None:
                    self.journal.replaced(record, corrected)
                return True
        if any(record in batch.records for batch in self._flushing_batches):
            self._amended[id(record)] = corrected
            return True
        return False

    def _apply_amendments(self, batch: _Batch) -> None:
        """Put the corrections made while ``batch`` was in a failed flush into it."""
        records = batch.records
        for i, record in enumerate(records):
            corrected = self._amended.pop(id(record), None)
            if corrected is not None:
                records[i] = corrected
                if self.journal is not None:
                    self.journal.replaced(record, corrected)

    def provisional(self, record: UsageRecord) -> bool:
        """Write a provisional record of a stream under way (outcome ``interrupted``, its
        output counted so far) to the local file of such records: a killed process leaves
        it, and the next start replays it unless the request's final record is stored
        (``journal.adopt_orphans``). Written again as the stream goes on (the last counts);
        ``settled`` lets the copies go. False: not kept (no such file, or it failed)."""
        inflight = self.inflight
        return inflight is not None and not self._closed and inflight.write_now(record)

    def supersede(self, final: UsageRecord, provisional: list[UsageRecord]) -> None:
        """``final`` (written) stands for these provisional records of its request: their
        copies go once it is stored (or spooled), not before, so a crash meanwhile still
        finds one of them."""
        self._superseding[id(final)] = provisional

    def _append(self, record: UsageRecord) -> int:
        """Buffer one record; its index in the buffer (-1: spooled at once, after close).
        A full buffer is handed to the spool first (``_overflow``)."""
        self.stats.written += 1
        if self._closed:
            self._write_late([record])
            return -1
        buffer = self._buffer
        n = len(buffer)
        if n >= self.settings.max_buffer:
            self._overflow()
            buffer, n = self._buffer, 0
        buffer.append(record)
        if not n:  # the flusher's interval starts now (it waits untimed on an empty buffer)
            self._oldest_ns = time.monotonic_ns()
            self._wake.set()
        elif n + 1 >= self.settings.batch_size:
            self._wake.set()
        return n

    async def write(self, record: UsageRecord) -> None:
        """``write_nowait`` as a coroutine; it never suspends, so a cancelled caller's
        ``finally`` cannot be interrupted inside it."""
        self.write_nowait(record)

    @property
    def pending(self) -> int:
        """Records written but not yet durable (waiting, or in a flush under way)."""
        return len(self._buffer) + self._in_flight_records

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
        """Make every record written so far durable (stored or spooled) before returning:
        wait for the flushes under way, then drain the buffer (raising if the store does)."""
        while self._in_flight or self._buffer:
            if self._in_flight:
                await asyncio.wait(list(self._in_flight))
                continue
            async with self._slots:
                batch = self._take(len(self._buffer))
                if batch is not None:
                    await self._flush_batch(batch)

    async def close(self) -> None:
        """Stop the background tasks and drain the buffer; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            # the flusher never awaits the store itself (its flushes are tasks of their own),
            # so cancelling it cannot interrupt a batch
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        try:
            await self.flush()
        except Exception as exc:  # the store failed even to spool: keep the records on disk
            log.error("ledger drain failed (%s); writing %d records to the spool", exc,
                      len(self._buffer))
            try:
                self._write_late(self._buffer)
            except Exception as again:  # a full disk: nowhere to keep them but the journal
                self._report_lost(again)
            else:
                if self.journal is not None:
                    self.journal.stored(self._buffer)
            self._buffer = []
        for _, waiter in self._waiters:  # durable now, one way or the other
            if not waiter.done():
                waiter.set_result(None)
        self._waiters = []
        for journal in (self.journal, self.inflight):  # what is left in them: a later start's
            if journal is not None:
                await journal.close()
        await self._close_store()

    def _report_lost(self, exc: BaseException) -> None:
        """At shutdown, neither the store nor the spool took the last records: those with a
        journal copy are replayed by the next start; the others are lost, and said so (the
        request ids, for a reconciliation against the access log)."""
        journaled = self.journal.journaled(self._buffer) if self.journal is not None else set()
        lost = [r.request_id for r in self._buffer if id(r) not in journaled]
        log.error("ledger: %d records could not be kept at shutdown (%s): %d are in the local "
                  "journal and will be replayed at the next start, %d are lost: %s",
                  len(self._buffer), exc, len(self._buffer) - len(lost), len(lost),
                  ",".join(lost[:1000]))

    # -- the flusher ----------------------------------------------------------------------

    async def _run_flusher(self) -> None:
        """One batch per wake: wait for a free flush slot, then for ``batch_size`` records,
        a durable writer (once no flush is under way) or ``flush_interval``, and start a flush
        of at most ``batch_size`` records as a task of its own; the next batch fills while
        it commits."""
        interval = self.settings.flush_interval
        while True:
            await self._slots.acquire()
            try:
                await self._until_due(interval)
                batch = self._take(self.settings.batch_size)
            except BaseException:
                self._slots.release()
                raise
            if batch is None:
                self._slots.release()
                continue
            self._launch(self._flush_quietly(batch), len(batch.records), slot=True)

    async def _until_due(self, interval: float) -> None:
        """Return once a flush is due, or ``interval`` after the oldest buffered record was
        written (a wake that finds nothing due, such as a flush finishing, waits on for the
        rest of it). With nothing buffered there is no timer: an idle gateway's flusher
        sleeps until the first record wakes it."""
        while not self._due():
            self._wake.clear()
            if not self._buffer:
                await self._wake.wait()
                continue
            age = (time.monotonic_ns() - self._oldest_ns) / 1e9
            left = interval - age
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    def _due(self) -> bool:
        """A full batch waits, or a durable writer does and no flush is under way (one that
        is gathers the writers for the next: one commit serves them all)."""
        if len(self._buffer) >= self.settings.batch_size:
            return True
        return bool(self._waiters) and self._flushing == 0

    def _take(self, limit: int) -> _Batch | None:
        """Up to ``limit`` records from the front of the buffer, with the durable writers
        waiting on them (a waiter is kept with its record's index)."""
        buffer = self._buffer
        if not buffer:
            return None
        oldest = self._oldest_ns
        if len(buffer) <= limit:
            self._buffer, waiters, self._waiters = [], self._waiters, []
            return _Batch(buffer, waiters, oldest)
        self._buffer, taken = buffer[limit:], buffer[:limit]
        self._oldest_ns = time.monotonic_ns()  # not kept per record: the next lag errs short
        waiters, kept = [], []
        for index, waiter in self._waiters:
            if index < limit:
                waiters.append((index, waiter))
            else:
                kept.append((index - limit, waiter))
        self._waiters = kept
        return _Batch(taken, waiters, oldest)

    def _put_back(self, batch: _Batch) -> None:
        """A batch that could not be made durable goes back to the front of the buffer."""
        n = len(batch.records)
        if self._buffer:
            self._oldest_ns = min(self._oldest_ns, batch.oldest_ns)
        else:
            self._oldest_ns = batch.oldest_ns
        self._buffer[:0] = batch.records
        self._waiters[:0] = batch.waiters
        self._waiters[len(batch.waiters):] = [(i + n, w) for i, w in
                                              self._waiters[len(batch.waiters):]]
        self._wake.set()  # the flusher may be asleep on an empty buffer: a retry is due

    def _launch(self, coro: Coroutine[Any, Any, None], records: int, *, slot: bool) -> None:
        task = asyncio.create_task(coro, name="ledger-flush")
        self._in_flight.add(task)
        self._in_flight_records += records
        self._flushing += slot

        def finished(done: asyncio.Task[None]) -> None:
            self._in_flight.discard(done)
            self._in_flight_records -= records
            if slot:
                self._flushing -= 1
                self._slots.release()
                self._wake.set()  # durable writers that waited for this flush may go

        task.add_done_callback(finished)

    async def _flush_quietly(self, batch: _Batch) -> None:
        """The flusher's flush: a failure is logged, and the slot is held for one
        ``flush_interval`` so the batch put back is not retried in a tight loop."""
        try:
            await self._flush_batch(batch)
        except Exception as exc:  # kept for retry; logged once per failing spell
            self.durability.failed(exc)
            await asyncio.sleep(self.settings.flush_interval)

    async def _flush_batch(self, batch: _Batch) -> None:
        """Store one batch; on an error put it back at the front of the buffer (nothing is
        dropped: the next flush tries again) and raise."""
        self._flushing_batches.append(batch)
        try:
            await self._store(batch.records)
        except BaseException:
            self.stats.flush_errors += 1
            if self._amended:
                self._apply_amendments(batch)
            self._put_back(batch)
            raise
        finally:
            self._flushing_batches.remove(batch)
        if self._amended:  # stored as it was: corrections that came too late are dropped
            for record in batch.records:
                self._amended.pop(id(record), None)
        self._done(batch)

    def _done(self, batch: _Batch) -> None:
        self.durability.recovered()
        if self._superseding and self.inflight is not None:
            for record in batch.records:
                provisional = self._superseding.pop(id(record), None)
                if provisional is not None:
                    self.inflight.stored(provisional)
        for _, waiter in batch.waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self.journal is not None:
            self.journal.stored(batch.records)
        lag = (time.monotonic_ns() - batch.oldest_ns) / 1e6
        self.stats.flushes += 1
        self.stats.last_lag_ms = lag
        self.stats.max_lag_ms = max(self.stats.max_lag_ms, lag)

    def _overflow(self) -> None:
        """The buffer is full (the store is slower than the writers): hand all of it to the
        spool in a task of its own, so the loop neither blocks nor drops anything."""
        batch = self._take(len(self._buffer))
        if batch is None:
            return
        self.stats.overflowed += len(batch.records)
        self._launch(self._spill_batch(batch), len(batch.records), slot=False)

    async def _spill_batch(self, batch: _Batch) -> None:
        try:
            await self._spill(batch.records)
        except Exception as exc:  # kept for a flush; logged once per failing spell
            self.durability.failed(exc)
            self._put_back(batch)
            return
        self._done(batch)

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
    async def _spill(self, batch: list[UsageRecord]) -> None:
        """Keep ``batch`` durably aside for a later replay (the buffer overflowed), without
        blocking the loop; raise if even that fails."""

    @abc.abstractmethod
    def _write_late(self, batch: list[UsageRecord]) -> None:
        """Durably keep records that arrive after ``close`` (blocking is acceptable)."""

    @abc.abstractmethod
    async def _start_store(self) -> None:
        """Start store tasks (spool replay); called once by ``start``."""

    @abc.abstractmethod
    async def _close_store(self) -> None:
        """Release store resources after the final drain."""
