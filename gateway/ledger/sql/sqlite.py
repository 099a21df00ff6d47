"""The embedded ledger of record: one SQLite file in the data directory.

For a single host without a database server (``gateway demo``, ``gateway serve`` with no
ledger URL). The file survives restarts. WAL journal with ``synchronous=FULL``: a commit is
fsync'd, so a flush that returned is durable. SQLite's calls block, so they run in two threads
of their own, one writer (one connection, so flushes never contend with each other in this
process) and one reader; the event loop only hands batches over. Several processes on one host
may share the file (WAL allows it; a writer waits up to ``busy_timeout`` for another's
commit); replicas on several hosts need PostgreSQL.

The rollups are kept by a trigger on insert (migration 2), in the same transaction as the
records; ``INSERT OR IGNORE`` on ``(day, request_id)`` makes a replayed record a no-op that the
trigger never sees.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.record import UsageRecord
from gateway.ledger.sql.migrations import MIGRATIONS
from gateway.ledger.sql.schema import RECORD_COLUMNS, quoted, record_row
from gateway.ledger.sql.store import SqlLedger

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import date

    from gateway.ledger.base import LedgerSettings
    from gateway.ledger.sql.store import Statement

__all__ = ["SqliteLedger", "split_script"]

_T = TypeVar("_T")

_INSERT = (f"INSERT OR IGNORE INTO usage_records (day, {quoted(RECORD_COLUMNS)}) "
           f"VALUES ({', '.join('?' * (len(RECORD_COLUMNS) + 1))})")


def split_script(script: str) -> list[str]:
    """A migration script as single statements (a trigger's body stays whole), so they can
    run inside one explicit transaction (``executescript`` would commit it first)."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        raise ValueError(f"incomplete SQL statement: {current.strip()[:80]!r}")
    return statements


class SqliteLedger(SqlLedger):
    """Usage records in a SQLite file.

    Args:
        path: the database file (created, with its directory, when missing).
        spool_dir: where records wait if the file cannot be written (a full disk).
        settings: batching and retention.
        migrate: apply missing migrations at start (the embedded default does: its file is
            the gateway's own).
        busy_timeout: how long a write waits for another worker's lock, seconds.
        deadline: ``store.ledger_timeout`` (see :class:`SqlLedger`).
    """

    dialect = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        spool_dir: str | os.PathLike[str],
        settings: LedgerSettings | None = None,
        migrate: bool = True,
        busy_timeout: float = 5.0,
        deadline: float = 2.0,
    ) -> None:
        # an insert may wait ``busy_timeout`` for another worker's write lock before it is
        # abandoned; a flush goes to the spool after ``deadline`` all the same
        super().__init__(spool_dir=spool_dir, settings=settings, migrate=migrate,
                         deadline=deadline, insert_deadline=busy_timeout + 5.0)
        self.path = Path(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite-w")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite-r")
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None

    # -- connections (each used only on its own thread) ------------------------------------

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self._busy_ms / 1000)
        try:
            _set_wal(conn, self._busy_ms / 1000)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        except BaseException:
            conn.close()  # the next call opens afresh; none is left to the collector
            raise
        return conn

    def _w(self) -> sqlite3.Connection:
        if self._wconn is None:
            self._wconn = self._open()
        return self._wconn

    def _r(self) -> sqlite3.Connection:
        if self._rconn is None:
            self._rconn = self._open()
        return self._rconn

    async def _on(self, pool: ThreadPoolExecutor, fn: Callable[[], _T]) -> _T:
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn)
        except sqlite3.OperationalError as exc:  # locked past busy_timeout, I/O error, full
            raise LedgerUnavailable(f"sqlite: {exc}") from exc

    async def _connect(self) -> None:
        await self._on(self._writer, self._w)

    async def _disconnect(self) -> None:
        def close_w() -> None:
            if self._wconn is not None:
                self._wconn.close()
                self._wconn = None

        def close_r() -> None:
            if self._rconn is not None:
                self._rconn.close()
                self._rconn = None

        await asyncio.get_running_loop().run_in_executor(self._writer, close_w)
        await asyncio.get_running_loop().run_in_executor(self._reader, close_r)
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    # -- schema ----------------------------------------------------------------------------

    async def applied_version(self) -> int:
        return await self._on(self._writer, lambda: _applied(self._w()))

    async def migrate(self) -> list[int]:
        return await self._on(self._writer, lambda: _migrate(self._w()))

    # -- writing and reading ----------------------------------------------------------------

    async def _insert(self, batch: Sequence[UsageRecord]) -> int:
        rows = [(r.day, *record_row(r)) for r in batch]
        new = await self._on(self._writer, lambda: _insert_rows(self._w(), rows))
        return self._counted(len(rows), new)

    async def _probe(self) -> None:
        await self._on(self._writer, lambda: self._w().execute("SELECT 1").fetchone())

    async def _expire(self, before_day: date) -> int:
        def run() -> int:
            cur = self._w().execute("DELETE FROM usage_records WHERE day < ?",
                                    (before_day.isoformat(),))
            return cur.rowcount

        return await self._on(self._writer, run)

    async def tenants(self) -> list[str]:
        rows = await self._on(self._reader, lambda: self._r().execute(
            "SELECT DISTINCT tenant FROM usage_hourly ORDER BY tenant").fetchall())
        return [str(r[0]) for r in rows]

    async def _fetch_all(self, statements: Sequence[Statement]) -> list[list[tuple[Any, ...]]]:
        return await self._on(self._reader, lambda: _read_snapshot(self._r(), statements))


def _set_wal(conn: sqlite3.Connection, patience: float) -> None:
    """Switch the file to WAL, waiting up to ``patience`` seconds for another connection's
    write transaction. SQLite answers a journal-mode change met by another writer's lock with
    ``database is locked`` at once, without its busy handler, so processes starting together
    on a new file (``--workers N`` with the embedded ledger) would fail; retried here."""
    deadline = time.monotonic() + patience
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # on the ledger's own thread, never the event loop
        pause = min(pause * 2, 0.05)


def _read_snapshot(conn: sqlite3.Connection, statements: Sequence[Statement]
                   ) -> list[list[tuple[Any, ...]]]:
    """The statements' rows from one read transaction (one WAL snapshot)."""
    if len(statements) == 1:  # one statement is its own snapshot
        sql, params = statements[0]
        return [[tuple(r) for r in conn.execute(sql, tuple(params)).fetchall()]]
    conn.execute("BEGIN")
    try:
        return [[tuple(r) for r in conn.execute(sql, tuple(params)).fetchall()]
                for sql, params in statements]
    finally:
        conn.execute("COMMIT")


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        new = conn.executemany(_INSERT, rows).rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return new


def _applied(conn: sqlite3.Connection) -> int:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'gateway_schema'").fetchone()
    if exists is None:
        return 0
    row = conn.execute("SELECT max(version) FROM gateway_schema").fetchone()
    return int(row[0] or 0)


def _migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply each missing migration in its own write transaction (a second process waits for
    the first and then finds nothing left to do)."""
    done: list[int] = []
    for migration in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _applied(conn) >= migration.version:
                conn.execute("ROLLBACK")
                continue
            for statement in split_script(migration.sqlite):
                conn.execute(statement)
            conn.execute("INSERT INTO gateway_schema (version, name) VALUES (?, ?)",
                         (migration.version, migration.name))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        done.append(migration.version)
    return done

