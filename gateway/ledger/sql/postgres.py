"""The ledger of record in PostgreSQL (asyncpg).

A flush is one statement in one transaction: the batch travels as one array of the table's
rows (``unnest($1::usage_records[])``: asyncpg's binary encoding, one round trip for hundreds
of records), the records are inserted with ``ON CONFLICT (day, request_id) DO NOTHING``, and
the ones that were new are summed into ``usage_hourly`` and ``usage_daily`` with ``ON CONFLICT
... DO UPDATE`` in the same statement, groups in key order so replicas flushing at once lock
rollup rows in one order and cannot deadlock.
A commit is PostgreSQL's acknowledgement: durable under its own ``synchronous_commit``.

``usage_records`` is partitioned by day. A day's partition is created the first time a batch
holds a record of that day (under an advisory lock, so replicas create it once) and dropped
whole once the day is past retention: expiry never deletes row by row.

Why asyncpg and not psycopg 3: ``loadtest/bench/ledger_drivers.py`` measures both on this
write path (see its docstring for the figures).
"""

from __future__ import annotations

import asyncio
import functools
import os
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.record import UsageRecord
from gateway.ledger.sql.compact import (
    COMPACT_DAY,
    COMPACT_TENANT_HOURS,
    DAY_MS,
    DROP_TENANT_HOURS,
    GRACE_MS,
    HOUR_GRACE_MS,
    HOUR_MS,
    LOCK_STATE,
    LOCK_TENANT_STATE,
    MOVE_BOUNDARY,
    MOVE_TENANT_BOUNDARY,
    TENANTS_THROUGH_SHARED,
    THROUGH_SHARED,
)
from gateway.ledger.sql.migrations import MIGRATIONS
from gateway.ledger.sql.schema import (
    RECORD_COLUMNS,
    ROLLUP_COUNTERS,
    ROLLUP_KEYS,
    TENANT_ROLLUP_KEYS,
    quoted,
    record_row,
)
from gateway.ledger.sql.store import SqlLedger

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.base import LedgerSettings
    from gateway.ledger.sql.store import Statement

__all__ = ["PostgresLedger", "is_outage"]

_EPOCH = date(1970, 1, 1)
#: advisory lock keys (any two fixed 64-bit numbers of this gateway's own)
_MIGRATE_LOCK = 0x6761_7465_7761_7901
_PARTITION_LOCK = 0x6761_7465_7761_7902

_COUNTERS = ROLLUP_COUNTERS
_SUMMED = ROLLUP_COUNTERS[3:]  # requests, failed and estimated are counts, the rest sums


_GROUP_KEY = ("tenant, {time}, key_id, model, request_class, version, batch_id, team, "
              "organization")
_TENANT_KEY = "{time}, " + ", ".join(TENANT_ROLLUP_KEYS)


def _rollup_upsert(table: str, grain_ms: int, time_column: str, where: str = "", *,
                   keys: tuple[str, ...] = ROLLUP_KEYS, conflict: str = _GROUP_KEY) -> str:
    """The CTE body adding the batch's new records (those ``where`` keeps) to one rollup
    table: summed per group (once per group per batch), groups in key order so replicas
    flushing at once lock rollup rows in one order. ``keys`` are the table's group columns,
    ``conflict`` its primary key (``{time}`` for its time column)."""
    group = ", ".join(f"coalesce({k}, '')" for k in keys)
    sums = ", ".join(f'sum("{c}")' for c in _SUMMED)
    updates = ", ".join(f'"{c}" = {table}."{c}" + excluded."{c}"' for c in _COUNTERS)
    positions = ", ".join(str(i + 1) for i in range(len(keys) + 1))
    return f"""
    INSERT INTO {table} ({time_column}, {", ".join(keys)}, {quoted(_COUNTERS)})
    SELECT ts_ms - ts_ms % {grain_ms}, {group}, count(*),
           sum(CASE WHEN outcome <> 'completed' THEN 1 ELSE 0 END),
           sum(CASE WHEN estimated THEN 1 ELSE 0 END), {sums}
    FROM new {where} GROUP BY {positions} ORDER BY {positions}
    ON CONFLICT ({conflict.format(time=time_column)}) DO UPDATE SET {updates}"""


def _insert_statement() -> str:
    """The flush: ``$1`` is one array of ``usage_records`` rows (the table's own row type: day,
    then ``RECORD_COLUMNS``, the order ``tests/ledger/test_sql.py`` checks). One array of
    composites, not one array per column: asyncpg checks every element of an array parameter
    for a nested array through ``isinstance`` against ``collections.abc`` classes, about 40
    such checks a record with one array per column, a few with the composite. Measured on
    batches of 256 (``loadtest/bench/LEDGER.md``): 11-12 us of loop CPU a record with 40
    arrays, 6.5-7 with one, the same PostgreSQL CPU. The new records go into the hourly
    rollups; the daily ones are made from those once a day closes (``compact.py``), so only
    new records of a day already compacted are added to ``usage_daily`` (and
    ``usage_daily_tenants``) here, and those of an hour whose tenant rollups are made to
    ``usage_hourly_tenants`` (a replayed
    spool, a late batch: the boundary share-locked, which orders this flush against a
    compaction). Records are inserted in key
    order and rollup groups updated in key order, so concurrent flushes (two in flight per
    gateway, several gateways, a replayed spool holding records another flush also holds)
    take their row locks in one order: they wait for each other, never deadlock."""
    return f"""
WITH new AS (
    INSERT INTO usage_records (day, {quoted(RECORD_COLUMNS)})
    SELECT (r).* FROM unnest($1::usage_records[]) AS r ORDER BY (r).day, (r).request_id
    ON CONFLICT (day, request_id) DO NOTHING
    RETURNING *
), hourly AS ({_rollup_upsert("usage_hourly", 3_600_000, "hour_ms")}
), daily AS ({_rollup_upsert("usage_daily", 86_400_000, "day_ms",
                             f"WHERE ts_ms < {THROUGH_SHARED}")}
), daily_tenants AS ({_rollup_upsert("usage_daily_tenants", 86_400_000, "day_ms",
                                     f"WHERE ts_ms < {THROUGH_SHARED}",
                                     keys=TENANT_ROLLUP_KEYS, conflict=_TENANT_KEY)}
), hourly_tenants AS ({_rollup_upsert("usage_hourly_tenants", 3_600_000, "hour_ms",
                                      f"WHERE ts_ms < {TENANTS_THROUGH_SHARED} "
                                      f"AND ts_ms >= {THROUGH_SHARED}",
                                      keys=TENANT_ROLLUP_KEYS, conflict=_TENANT_KEY)}
)
SELECT count(*) FROM new
"""


_INSERT = _insert_statement()
#: for the reads' transaction: plan each read with its values. asyncpg prepares statements and
#: PostgreSQL would switch to a generic plan after five runs; for the usage query that plan
#: cannot see the hour range, guesses a few hundred rollup rows, and sorts the tens of
#: thousands of a busy tenant's month on disk (measured: 1.5x slower than the custom plan).
#: No sequential scans: every read is an index range (the rollups' primary keys, the hours'
#: BRIN, the records' (tenant, ts_ms)), but a bound read from the state row in the same
#: statement is a value the planner cannot see, and for a read across every tenant it
#: guessed tens of thousands of hourly rows and scanned all of them (10 million records: 1.4
#: s, against 15 ms through the BRIN index for the hour the bound leaves). No JIT: such a read
#: estimated costly spent 150 ms compiling expressions to answer in a few ms.
_READ_SETTINGS = ("SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL jit = off; "
                  "SET LOCAL enable_seqscan = off")
_PARTITIONS = """
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'usage_records'
"""


def is_outage(exc: BaseException) -> bool:
    """True for a database that is away (refused, reset, shutting down, out of resources),
    as opposed to one that refused the statement."""
    return isinstance(exc, (
        OSError,
        TimeoutError,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.OperatorInterventionError,  # 57: admin shutdown, cannot connect now
        asyncpg.exceptions.InsufficientResourcesError,  # 53: disk full, too many connections
    ))


@functools.lru_cache(maxsize=64)
def _day(day_number: int) -> date:
    """The UTC date of a day number (days since 1970-01-01), cached: a batch has a day or two."""
    return _EPOCH + timedelta(days=day_number)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing to send. asyncpg's default sends ``SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` after every statement, a
    second round trip per flush; the ledger leaves no session state (its advisory locks are
    transaction-scoped, no LISTEN, no cursors, no SET), and asyncpg still rolls back a
    transaction left open before calling this."""


def partition_name(day: date) -> str:
    return f"usage_records_{day:%Y%m%d}"


class PostgresLedger(SqlLedger):
    """Usage records in PostgreSQL.

    Args:
        dsn: ``postgresql://...``.
        spool_dir: where records wait while the database is away (local disk).
        settings: batching and retention.
        migrate: apply missing migrations at start instead of refusing to start.
        pool_size: connections at most (``settings.in_flight`` flushes at once, opened at
            start; reads and replay share the rest).
        connect_timeout: bound of one connection attempt, seconds.
    """

    dialect = "postgresql"

    def __init__(
        self,
        dsn: str,
        *,
        spool_dir: str | os.PathLike[str],
        settings: LedgerSettings | None = None,
        migrate: bool = False,
        deadline: float = 2.0,
        pool_size: int = 4,
        connect_timeout: float = 2.0,
    ) -> None:
        super().__init__(spool_dir=spool_dir, settings=settings, deadline=deadline,
                         migrate=migrate)
        self._dsn = dsn
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._partitions: set[int] = set()

    # -- connections -----------------------------------------------------------------------

    async def _get_pool(self) -> asyncpg.Pool:
        pool = self._pool
        if pool is not None:
            return pool
        async with self._pool_lock:
            if self._pool is None:
                try:
                    # a connection per flush in flight from the start: opening one later
                    # (a fork on the server, asyncpg's type introspection) lands on a flush
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=min(self._pool_size, self.settings.in_flight),
                        max_size=self._pool_size,
                        timeout=self._connect_timeout, command_timeout=None,
                        reset=_keep_session,
                        server_settings={"application_name": "llm-gateway-ledger"})
                except Exception as exc:
                    if is_outage(exc):
                        raise LedgerUnavailable(f"postgresql: {exc}") from exc
                    raise
            return self._pool

    async def _run(self, method: str, query: str, *args: Any) -> Any:
        """One statement on a pooled connection; an outage becomes ``LedgerUnavailable``."""
        pool = await self._get_pool()
        try:
            async with pool.acquire(timeout=self._connect_timeout) as conn:
                return await getattr(conn, method)(query, *args)
        except Exception as exc:
            if is_outage(exc):
                raise LedgerUnavailable(f"postgresql: {type(exc).__name__}: {exc}") from exc
            raise

    async def _transaction(self, statements: Sequence[tuple[str, tuple[Any, ...]]]
                           ) -> list[int]:
        """Statements in one transaction on one pooled connection (one commit); the rows
        each changed. An outage becomes ``LedgerUnavailable``."""
        pool = await self._get_pool()
        try:
            async with pool.acquire(timeout=self._connect_timeout) as conn, \
                    conn.transaction():
                counts = []
                for sql, values in statements:
                    status: str = await conn.execute(sql, *values)
                    counts.append(int(status.rsplit(" ", 1)[-1]))  # "INSERT 0 1"
                return counts
        except Exception as exc:
            if is_outage(exc):
                raise LedgerUnavailable(f"postgresql: {type(exc).__name__}: {exc}") from exc
            raise

    async def _connect(self) -> None:
        await self._get_pool()

    async def _disconnect(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # -- schema ------------------------------------------------------------------------------

    async def applied_version(self) -> int:
        exists = await self._run("fetchval", "SELECT to_regclass('gateway_schema')")
        if exists is None:
            return 0
        return int(await self._run("fetchval", "SELECT coalesce(max(version), 0) "
                                               "FROM gateway_schema") or 0)

    async def migrate(self) -> list[int]:
        pool = await self._get_pool()
        done: list[int] = []
        async with pool.acquire() as conn:
            for migration in MIGRATIONS:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATE_LOCK)
                    table = await conn.fetchval("SELECT to_regclass('gateway_schema')")
                    applied = 0 if table is None else await conn.fetchval(
                        "SELECT coalesce(max(version), 0) FROM gateway_schema")
                    if applied >= migration.version:
                        continue
                    await conn.execute(migration.postgresql)
                    await conn.execute("INSERT INTO gateway_schema (version, name) "
                                       "VALUES ($1, $2)", migration.version, migration.name)
                    done.append(migration.version)
        return done

    # -- writing -----------------------------------------------------------------------------

    async def _prepare(self, batch: Sequence[UsageRecord]) -> None:
        """Create the days' partitions the batch needs: ``deadline`` for each (one a day in
        production; a replay of old records may need dozens, ~30 ms each on this box)."""
        missing = {r.ts_ms // 86_400_000 for r in batch} - self._partitions
        if missing:
            async with asyncio.timeout(self._deadline * len(missing)):
                await self._make_partitions(missing)

    async def _insert(self, batch: Sequence[UsageRecord]) -> int:
        days = [r.ts_ms // 86_400_000 for r in batch]
        if not self._partitions.issuperset(days):  # not prepared (a direct call)
            await self._prepare(batch)
        rows = [(_day(n), *record_row(r)) for n, r in zip(days, batch, strict=True)]
        new = await self._run("fetchval", _INSERT, rows)
        return self._counted(len(rows), int(new))

    async def _make_partitions(self, day_numbers: set[int]) -> None:
        pool = await self._get_pool()
        try:
            async with pool.acquire(timeout=self._connect_timeout) as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _PARTITION_LOCK)
                for n in sorted(day_numbers):
                    day = _EPOCH + timedelta(days=n)
                    await conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {partition_name(day)} PARTITION OF "
                        f"usage_records FOR VALUES FROM ('{day}') TO "
                        f"('{day + timedelta(days=1)}')")
        except Exception as exc:
            if is_outage(exc):
                raise LedgerUnavailable(f"postgresql: {exc}") from exc
            raise
        self._partitions |= day_numbers

    async def compact(self, now_ms: int) -> int:
        """Sum every closed day's hourly rollups into ``usage_daily`` (``compact.py``), one
        transaction a day, the state row locked; the days compacted. A day closes
        ``GRACE_MS`` after its midnight; replicas running this at once wait for each other
        and compact each day once. Then the closed hours' tenant rollups
        (:meth:`compact_tenant_hours`)."""
        pool = await self._get_pool()
        done = 0
        while True:
            try:
                async with pool.acquire(timeout=self._connect_timeout) as conn, \
                        conn.transaction():
                    through = int(await conn.fetchval(LOCK_STATE))
                    if through + DAY_MS + GRACE_MS > now_ms:
                        break
                    await conn.execute(COMPACT_DAY, through)
                    await conn.execute(DROP_TENANT_HOURS, through)
                    await conn.execute(MOVE_BOUNDARY, through + DAY_MS)
            except Exception as exc:
                if is_outage(exc):
                    raise LedgerUnavailable(f"postgresql: {exc}") from exc
                raise
            done += 1
        await self.compact_tenant_hours(now_ms)
        return done

    async def compact_tenant_hours(self, now_ms: int) -> int:
        """Sum the hours closed by ``now_ms`` (from the daily boundary on) per tenant into
        ``usage_hourly_tenants`` (``compact.py``), a day of hours a transaction at most, the
        state row locked; the hours made."""
        pool = await self._get_pool()
        upto = (now_ms - HOUR_GRACE_MS) // HOUR_MS * HOUR_MS
        done = 0
        while True:
            try:
                async with pool.acquire(timeout=self._connect_timeout) as conn, \
                        conn.transaction():
                    daily, tenants = await conn.fetchrow(LOCK_TENANT_STATE)
                    start = max(int(daily), int(tenants))
                    end = min(upto, start + DAY_MS)
                    if end <= start:
                        if start != tenants:  # the daily boundary went past it
                            await conn.execute(MOVE_TENANT_BOUNDARY, start)
                        return done
                    await conn.execute(COMPACT_TENANT_HOURS, start, end)
                    await conn.execute(MOVE_TENANT_BOUNDARY, end)
            except Exception as exc:
                if is_outage(exc):
                    raise LedgerUnavailable(f"postgresql: {exc}") from exc
                raise
            done += (end - start) // HOUR_MS

    async def _probe(self) -> None:
        await self._run("fetchval", "SELECT 1")

    async def _expire(self, before_day: date) -> int:
        names = [r[0] for r in await self._run("fetch", _PARTITIONS)]
        cut = partition_name(before_day)
        old = sorted(n for n in names if n.startswith("usage_records_") and n < cut)
        for name in old:
            await self._run("execute", f"DROP TABLE IF EXISTS {name}")
        cut_n = (before_day - _EPOCH).days
        self._partitions = {n for n in self._partitions if n >= cut_n}
        return len(old)

    # -- reading -----------------------------------------------------------------------------

    async def tenants(self) -> list[str]:
        rows = await self._run("fetch", "SELECT DISTINCT tenant FROM usage_hourly "
                                        "ORDER BY tenant")
        return [str(r[0]) for r in rows]

    async def _fetch_all(self, statements: Sequence[Statement]) -> list[list[tuple[Any, ...]]]:
        pool = await self._get_pool()
        try:
            async with pool.acquire(timeout=self._connect_timeout) as conn, \
                    conn.transaction(isolation="repeatable_read", readonly=True):
                await conn.execute(_READ_SETTINGS)
                return [[tuple(r) for r in await conn.fetch(sql, *params)]
                        for sql, params in statements]
        except Exception as exc:
            if is_outage(exc):
                raise LedgerUnavailable(f"postgresql: {type(exc).__name__}: {exc}") from exc
            raise
