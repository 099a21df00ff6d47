"""What the SQL stores share: into the database or the spool, replay, retention, the reads.

A flush is one transaction: the batch's records are inserted with ``ON CONFLICT DO NOTHING``
on ``(day, request_id)`` and the hourly rollups grow by the records that were new, so a record
that reaches the database twice (a replayed spool, a retried batch line, two replicas) is one
row and is counted once. When the database cannot be reached (refused, reset, no answer within
``deadline``), the batch goes to the local spool (fsync'd: durable all the same) and the
back-off keeps the next flushes from waiting on a dead server; a background task replays the
spool once the database answers, and once at start for whatever a crashed process left. A
batch the database refuses for its content (not an outage: a bug) is retried record by record
and the records it still refuses are quarantined in the spool directory, never dropped.

Reads answer from ``usage_hourly`` (``usage_daily`` too, for the compacted days of a read of
whole days not grouped by hour: ``compact.py``, run by the hourly maintenance task): the
totals of a day or a month are one indexed range of a tenant's rollup rows, whatever the number
of records behind them (``usage_rows``: any grouping, keyset pages, see ``usage_query.py``).
``export`` streams records in keyset chunks (one chunk in memory at a time, no transaction held
between chunks); ``drift`` compares one tenant's day of rollups with the sum of its records,
both read in one snapshot.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import time
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.ledger.base import Ledger, LedgerSettings
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.journal import INFLIGHT_PREFIX, Journal, adopt_orphans
from gateway.ledger.record import UsageRecord
from gateway.ledger.spool import Spool
from gateway.ledger.sql.compact import THROUGH
from gateway.ledger.sql.drift import compare, daily_statement, day_statements
from gateway.ledger.sql.migrations import SchemaMismatch, verdict
from gateway.ledger.sql.params import Params, ordered
from gateway.ledger.sql.schema import RECORD_COLUMNS, quoted
from gateway.ledger.sql.usage_query import DEFAULT_LIMIT, UsageQuery
from gateway.timers.backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence

    from gateway.ledger.sql.drift import Drift
    from gateway.ledger.sql.migrations import Dialect
    from gateway.ledger.sql.usage_query import UsagePage

    #: one read statement and its values, in the dialect's placeholders
    Statement = tuple[str, Sequence[Any]]

__all__ = ["SqlLedger", "Statement"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

_DAY_MS = 86_400_000
#: the part of ``deadline`` kept for the spool's write after a database that did not answer
_SPOOL_RESERVE = 0.25
#: how often retention runs (and the next days' partitions are made)
_MAINTAIN_EVERY = 3600.0
#: how often the rollups are compacted (closed days, closed hours' tenant rollups)
_COMPACT_EVERY = 60.0


class SqlLedger(Ledger):
    """The shared part of the SQLite and PostgreSQL ledgers.

    Args:
        spool_dir: where records wait while the database is away (local disk).
        settings: batching, retention and replay.
        deadline: ``store.ledger_timeout``: a flush whose records are not committed
            within it (less a quarter second kept for the spool's write) goes to the spool,
            so a response waiting for its record waits at most this long.
        migrate: apply missing migrations at start instead of refusing to start.
        insert_deadline: bound of one insert transaction before it is abandoned and the
            database marked down, seconds (plus 1 ms per record); default ``deadline``.
    """

    dialect: Dialect

    def __init__(
        self,
        *,
        spool_dir: str | os.PathLike[str],
        settings: LedgerSettings | None = None,
        deadline: float = 2.0,
        migrate: bool = False,
        insert_deadline: float | None = None,
    ) -> None:
        super().__init__(settings)
        self.spool = Spool(spool_dir, max_segment_bytes=self.settings.spool_segment_bytes)
        self.journal = Journal(spool_dir)  # no file until the first ``write_journaled``
        self.inflight = Journal(spool_dir, prefix=INFLIGHT_PREFIX)  # nor the first stream's
        self._deadline = deadline
        self._insert_deadline = deadline if insert_deadline is None else insert_deadline
        #: a flush's bound at the database: the rest of ``deadline`` is the spool's, so a
        #: record whose database does not answer is still durable within ``deadline``
        self._write_deadline = deadline - min(_SPOOL_RESERVE, deadline / 4)
        self._migrate = migrate
        #: paces the background probes of a database that failed
        self._backoff = Backoff(maximum=2.0)
        #: whether flushes go to the database; once one fails they go straight to the spool
        #: until a background probe (the replayer's) finds the database answering again, so
        #: no response waits on a database that just failed
        self.database_up = True
        self._announced_down = False
        self._tasks: list[asyncio.Task[None]] = []
        self._replay_lock = asyncio.Lock()
        #: more retention sweeps of the same database (stored responses), run after ``expire``
        self.sweeps: list[Callable[[], Awaitable[object]]] = []

    def __repr__(self) -> str:
        st = self.stats
        return (
            f"<{type(self).__name__} [{self._backoff!r} | pending: {self.pending} | "
            f"stored: {st.stored} | duplicates: {st.duplicates} | spooled: {st.spooled} | "
            f"replayed: {st.replayed}]>"
        )

    # -- what a dialect provides -----------------------------------------------------------

    @abc.abstractmethod
    async def _connect(self) -> None:
        """Open the connection(s); raise ``LedgerUnavailable`` when the database is away."""

    @abc.abstractmethod
    async def _disconnect(self) -> None:
        """Close the connection(s)."""

    @abc.abstractmethod
    async def applied_version(self) -> int:
        """The highest migration applied (0 for an empty database)."""

    @abc.abstractmethod
    async def migrate(self) -> list[int]:
        """Apply the missing migrations in order; returns the versions applied."""

    @abc.abstractmethod
    async def _insert(self, batch: Sequence[UsageRecord]) -> int:
        """Insert ``batch`` and add the new records to the rollups in one transaction;
        returns how many were new. Raises ``LedgerUnavailable`` for an outage, anything
        else for a refusal."""

    async def _prepare(self, batch: Sequence[UsageRecord]) -> None:
        """What must exist before ``batch`` can be inserted (PostgreSQL: its days'
        partitions), bounded by the store itself (``deadline`` per thing made), so a batch
        that opens many days (a replay) does not spend the insert's deadline on DDL.
        Raises like ``_insert`` (a ``TimeoutError`` for a database that does not answer)."""

    @abc.abstractmethod
    async def _probe(self) -> None:
        """A cheap round trip; raises ``LedgerUnavailable`` when the database is away."""

    @abc.abstractmethod
    async def _expire(self, before_day: date) -> int:
        """Delete the records of days before ``before_day`` (rollups are kept); returns how
        many days (or partitions) went."""

    @abc.abstractmethod
    async def _fetch_all(self, statements: Sequence[Statement]) -> list[list[tuple[Any, ...]]]:
        """Run read statements in one snapshot (one read-only transaction); the rows of
        each. Raises ``LedgerUnavailable`` when the database is away."""

    # -- start and stop --------------------------------------------------------------------

    async def _start_store(self) -> None:
        """Connect, check (or apply) the schema, start replay and retention. A database that
        is down here only means the first batches are spooled; a wrong schema is an error."""
        try:
            await self._connect()
            await self._check_schema()
        except LedgerUnavailable as exc:  # the replayer's probe finds it when it answers
            self._database_down(exc)
        self._tasks = [
            asyncio.create_task(self._run_replayer(), name="ledger-replayer"),
            asyncio.create_task(self._run_maintenance(), name="ledger-retention"),
        ]

    async def _check_schema(self) -> None:
        if self._migrate:
            applied = await self.migrate()
            if applied:
                log.info("ledger: applied schema migrations %s", applied)
        problem = verdict(await self.applied_version())
        if problem is not None:
            raise SchemaMismatch(problem)

    async def _close_store(self) -> None:
        async with self._replay_lock:  # never stop a replay half-way through a segment
            for task in self._tasks:
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.spool.close()
        await self._disconnect()

    # -- writing ---------------------------------------------------------------------------

    async def _store(self, batch: list[UsageRecord]) -> None:
        if self.database_up:
            sending = asyncio.ensure_future(self._send(batch))
            done, _ = await asyncio.wait((sending,), timeout=self._write_deadline)
            if done:
                try:
                    sending.result()
                    return
                except LedgerUnavailable:
                    pass  # marked down (and logged) by ``_send``: to the spool at once
            else:
                # slower than its bound (a frozen server): the batch goes to the spool now,
                # so its writers are answered within ``deadline``; the insert goes on, and a
                # commit it still makes is a duplicate that the replay drops
                self._database_down(TimeoutError(
                    f"no commit within {self._write_deadline:g} s"), count=False)
                sending.add_done_callback(_retrieve)
        await self.spool.append(batch)
        self.stats.spooled += len(batch)

    def _database_down(self, exc: BaseException, *, count: bool = True) -> None:
        """The database failed (or is slow to answer) a write or a probe: later flushes
        spool without trying it, and the replayer probes it in the background. Logged once
        per outage: a probe that answers while writes still fail (SQLite on a full disk
        reads fine) adds no line. ``count``: a failure that lengthens the probes' pause."""
        if count:
            self._backoff.failure()
        self.database_up = False
        if not self._announced_down:
            self._announced_down = True
            log.warning("ledger: database unavailable (%s); records go to the spool until a "
                        "background probe finds it answering", exc)

    def _database_written(self) -> None:
        """A write reached the database: flushes go to it, and an outage logged ends."""
        self.database_up = True
        if self._announced_down:
            self._announced_down = False
            log.warning("ledger: database answering again; flushes go to it")

    async def _spill(self, batch: list[UsageRecord]) -> None:
        await self.spool.append(batch)
        self.stats.spooled += len(batch)

    def _write_late(self, batch: list[UsageRecord]) -> None:
        self.spool.append_sync(batch)
        self.stats.spooled += len(batch)

    async def _send(self, batch: list[UsageRecord]) -> int:
        """Store ``batch`` (in transactions of ``batch_size``); returns how many were new.
        Each insert is bounded by ``deadline`` plus 1 ms a record, without waiting on the
        driver's cancellation (``_abandon_after``). Raises ``LedgerUnavailable`` (marking the
        database down) when it is away or does not commit in time; chunks stored before that
        are deduplicated when the rest is resent."""
        size = self.settings.batch_size
        new = 0
        for i in range(0, len(batch), size):
            chunk = batch[i : i + size]
            try:
                await self._prepare(chunk)
                new += await _abandon_after(self._insert(chunk),
                                            self._insert_deadline + 0.001 * len(chunk))
            except (LedgerUnavailable, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    exc = LedgerUnavailable("the database did not commit in time")
                self._database_down(exc)
                raise exc from None
            except Exception:
                new += await self._one_by_one(chunk)
        self._database_written()
        return new

    async def _one_by_one(self, chunk: list[UsageRecord]) -> int:
        """A chunk the database refused: store what it takes, quarantine what it does not."""
        new = 0
        refused: list[UsageRecord] = []
        for record in chunk:
            try:
                new += await self._insert([record])
            except LedgerUnavailable:
                raise
            except Exception:
                log.exception("ledger: the database refused record %s", record.request_id)
                refused.append(record)
        if refused:
            path = self.spool.quarantine(refused)
            log.error("ledger: %d records refused by the database; kept in %s",
                      len(refused), path)
        return new

    def _counted(self, batch_size: int, new: int) -> int:
        """Account a stored chunk in the stats; returns ``new``."""
        self.stats.stored += new
        self.stats.duplicates += batch_size - new
        return new

    # -- the spool ---------------------------------------------------------------------------

    async def replay(self) -> int:
        """Replay spooled records into the database; returns how many were new.

        Stops at the first outage, keeping the rest for next time. Safe to run from several
        processes and to repeat: segments are locked while replayed, records deduplicated.
        """
        async with self._replay_lock:
            adopt_orphans(self.spool)  # a dead process's journal: its records are replayed
            waiting = bool(self.spool.segment_paths())
            if (self.database_up and not waiting) or not self._backoff.allow():
                return 0
            try:  # the only place a database marked down is tried again
                await _abandon_after(self._probe(), self._deadline)
            except (LedgerUnavailable, TimeoutError) as exc:
                self._database_down(exc)
                return 0
            self._backoff.success()
            self.database_up = True  # flushes try it again; the first write confirms it
            if not waiting:
                return 0
            self.spool.rotate()
            new = replayed = skipped = segments = 0
            for claim in self.spool.claims():
                try:
                    new += await self._send(claim.records)
                except LedgerUnavailable as exc:
                    claim.release()
                    log.warning("ledger: spool replay paused: %s", exc)
                    break
                except BaseException:
                    claim.release()
                    raise
                replayed += len(claim.records)
                skipped += claim.bad_lines
                segments += 1
                claim.done()
            if segments:
                self._report_replay(segments, replayed, new, skipped)
            return new

    def _report_replay(self, segments: int, replayed: int, new: int, skipped: int) -> None:
        """One log line per replay: what it stored, what were duplicates, what it could not
        parse (a torn line is a record that was never acknowledged; any other is a bug)."""
        self.stats.replayed += replayed
        self.stats.spool_bad_lines += skipped
        level = logging.WARNING if skipped else logging.INFO
        log.log(level, "ledger: spool replayed: %d segments, %d records (%d new, %d duplicates), "
                "%d lines skipped (unparseable)", segments, replayed, new, replayed - new,
                skipped)

    async def _run_replayer(self) -> None:
        while True:
            try:
                await self.replay()
            except Exception:
                log.exception("ledger: spool replay failed")
            await asyncio.sleep(self.settings.replay_interval)

    # -- retention -----------------------------------------------------------------------------

    async def expire(self, today: date | None = None) -> int:
        """Drop the records of days past ``retention_days`` (the rollups stay)."""
        today = today or datetime.now(UTC).date()  # records are partitioned by UTC day
        cutoff = date.fromordinal(today.toordinal() - self.settings.retention_days)
        return await self._expire(cutoff)

    async def compact(self, now_ms: int) -> int:
        """Make the daily rollups of the days closed by ``now_ms`` (``compact.py``); the days
        made. Nothing to do where a trigger keeps them (SQLite)."""
        return 0

    async def _run_maintenance(self) -> None:
        """Retention and the sweeps every ``_MAINTAIN_EVERY``; the rollups' compaction every
        ``_COMPACT_EVERY`` (the tenant hours close hourly: a read across tenants sums the
        hourly rollups only of the hours not compacted yet)."""
        last_retention = -_MAINTAIN_EVERY
        while True:
            if time.monotonic() - last_retention >= _MAINTAIN_EVERY:
                last_retention = time.monotonic()
                try:
                    if self.database_up:
                        await self.expire()
                except Exception:
                    log.exception("ledger: retention failed")
                for sweep in self.sweeps:
                    try:
                        if self.database_up:
                            await sweep()
                    except Exception:
                        log.exception("ledger: retention sweep %r failed", sweep)
            try:
                if self.database_up:
                    await self.compact(int(time.time() * 1000))
            except Exception:
                log.exception("ledger: rollup compaction failed")
            await asyncio.sleep(_COMPACT_EVERY)

    # -- reading ------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        (rows,) = await self._fetch_all([(sql, params)])
        return rows

    async def usage_rows(
        self,
        tenant: str | None,
        lo_ms: int,
        hi_ms: int,
        group_by: Sequence[str],
        *,
        limit: int = DEFAULT_LIMIT,
        after: str | None = None,
    ) -> UsagePage:
        """One statement over ``usage_hourly`` (``usage_query.UsageQuery``): an index range
        of the rollups' primary key, summed per group, the page's keyset after ``after``."""
        query = UsageQuery.build(self.dialect, tenant, lo_ms, hi_ms, group_by, limit=limit,
                                 after=after)
        if query.exhausted:
            return query.page([])
        return query.page(await self._fetch(query.sql, query.params))

    async def export(
        self, from_ts: int, to_ts: int, tenant: str | None = None, *, chunk: int = 1000
    ) -> AsyncIterator[UsageRecord]:
        """Each chunk starts after the last record of the one before (an index range on
        ``(tenant, ts_ms)``), so memory stays at one chunk whatever the range, and no
        transaction is held between chunks."""
        # code-point order, like the rows (the database's own may follow a locale)
        tenants = [tenant] if tenant is not None else sorted(await self.tenants())
        for name in tenants:
            last: tuple[int, str] | None = None
            while True:
                sql, params = self._export_chunk(name, from_ts, to_ts, last, chunk)
                rows = await self._fetch(sql, params)
                for row in rows:
                    yield _record_of(row)
                if len(rows) < chunk:
                    break
                end = rows[-1]
                last = (int(end[_TS]), str(end[_REQUEST_ID]))

    def _export_chunk(self, tenant: str, lo: int, hi: int, last: tuple[int, str] | None,
                      chunk: int) -> Statement:
        p = Params(self.dialect)
        request_id = ordered("request_id", self.dialect)
        start = lo if last is None else max(lo, last[0])
        where = [f"tenant = {p.add(tenant, 'text')}", f"ts_ms >= {p.add(start, 'bigint')}",
                 f"ts_ms < {p.add(hi, 'bigint')}"]
        if self.dialect == "postgresql":  # the day partitions that can hold the range
            where.append(f"day >= {p.add(_date_of(start), 'date')}")
            where.append(f"day <= {p.add(_date_of(max(start, hi - 1)), 'date')}")
        if last is not None:
            where.append(f"(ts_ms > {p.add(last[0], 'bigint')} OR {request_id} > "
                         f"{p.add(last[1], 'text')})")
        sql = (f"SELECT {quoted(RECORD_COLUMNS)} FROM usage_records "
               f"WHERE {' AND '.join(where)} ORDER BY ts_ms, {request_id} "
               f"LIMIT {p.add(chunk, 'bigint')}")
        return sql, p.values

    async def drift(self, tenant: str, day: date) -> list[Drift]:
        """The day's hourly and daily rollup rows and its records summed the same way
        (``drift.py``), read in one snapshot, so records landing meanwhile are on every side
        or none."""
        rollups, records = day_statements(self.dialect, tenant, day)
        daily = daily_statement(self.dialect, tenant, day)
        rollup_rows, record_rows, daily_rows, state = await self._fetch_all(
            [rollups, records, daily, (f"SELECT {THROUGH}", [])])
        # a day not compacted yet (PostgreSQL, ``compact.py``) must have no daily rows: its
        # reads come from the hourly ones
        compacted = _day_start_ms(day) < int(state[0][0])
        return (compare(tenant, rollup_rows, record_rows)
                + compare(tenant, daily_rows, record_rows if compacted else [], grain="day"))


_TS = RECORD_COLUMNS.index("ts_ms")
_REQUEST_ID = RECORD_COLUMNS.index("request_id")
_ESTIMATED = RECORD_COLUMNS.index("estimated")
_DELIVERED = RECORD_COLUMNS.index("delivered")
_CONTINUED = RECORD_COLUMNS.index("continued")


def _record_of(row: Sequence[Any]) -> UsageRecord:
    """A ``RECORD_COLUMNS`` row as a record (SQLite keeps ``estimated`` as 0/1)."""
    values = dict(zip(RECORD_COLUMNS, row, strict=True))
    values["estimated"] = bool(row[_ESTIMATED])
    values["continued"] = bool(row[_CONTINUED])
    if row[_DELIVERED] is not None:
        values["delivered"] = bool(row[_DELIVERED])
    return UsageRecord(**values)


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _day_start_ms(day: date) -> int:
    return (day.toordinal() - _EPOCH_ORDINAL) * _DAY_MS


def _date_of(ts_ms: int) -> date:
    """The UTC day of ``ts_ms``, clamped to the days a ``date`` can hold (a range given as
    "everything" reaches far past year 9999)."""
    days = min(max(ts_ms // _DAY_MS, 1 - _EPOCH_ORDINAL), date.max.toordinal() - _EPOCH_ORDINAL)
    return date.fromordinal(_EPOCH_ORDINAL + days)


async def _abandon_after(work: Coroutine[Any, Any, _T], limit: float) -> _T:
    """``work``'s result, or ``TimeoutError`` after ``limit`` seconds without waiting for it
    to stop: a driver's cancellation may itself wait on the network (asyncpg sends a cancel
    request to a server that may be frozen), and the bound is the caller's promise. The task
    is cancelled and left to finish in the background; a write it still commits is a
    duplicate the spool's replay drops."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task,), timeout=limit)
    except BaseException:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume an abandoned task's outcome (no "exception was never retrieved" warning)."""
    if not task.cancelled():
        task.exception()
