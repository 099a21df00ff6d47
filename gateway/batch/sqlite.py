"""Batch state without Redis: one SQLite database (stdlib ``sqlite3``) in ``batch.files_dir``.

WAL mode with ``synchronous=NORMAL``: a committed transaction survives the process being
killed (SIGKILL, OOM); every atomic step of :class:`BatchState` is one ``BEGIN IMMEDIATE``
transaction, so several processes on one host may share the database too. All calls run on
one worker thread: the event loop never blocks on the disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from gateway.batch.objects import BatchRecord, FileRecord, LineResult
from gateway.batch.state import BatchState

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

__all__ = ["SqliteBatchState"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, doc BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL,
    status TEXT NOT NULL, doc BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, seq);
CREATE TABLE IF NOT EXISTS chunks (
    batch_id TEXT NOT NULL, chunk INTEGER NOT NULL, owner TEXT, expires REAL NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, chunk));
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, ok INTEGER NOT NULL, line BLOB NOT NULL,
    PRIMARY KEY (batch_id, idx));
"""
_FINAL = ("completed", "failed", "expired", "cancelled")


class SqliteBatchState(BatchState):
    """Batch state in ``<directory>/batches.sqlite3``."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "batches.sqlite3"
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="batch-sqlite")
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=10.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        self._db = db

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            if self._db is None:
                self._connect()
            assert self._db is not None
            return fn(self._db)

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def _read(self, fn: Callable[[sqlite3.Connection], T], empty: T) -> T:
        """A read; ``empty`` while no database exists (a gateway that never saw a batch
        creates nothing on disk)."""
        if self._db is None and not self.path.exists():
            return empty
        return await self._run(fn)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` inside one ``BEGIN IMMEDIATE`` transaction."""

        def tx(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out

        return await self._run(tx)

    async def close(self) -> None:
        def shut(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        if self._db is not None:
            await self._run(shut)
        self._thread.shutdown(wait=True)

    # -- files
    async def put_file(self, record: FileRecord) -> None:
        doc = msgspec.json.encode(record)
        await self._run(lambda db: db.execute(
            "INSERT OR REPLACE INTO files (id, doc) VALUES (?, ?)", (record.id, doc)))

    async def get_file(self, file_id: str) -> FileRecord | None:
        row = await self._read(lambda db: db.execute(
            "SELECT doc FROM files WHERE id = ?", (file_id,)).fetchone(), None)
        return None if row is None else msgspec.json.decode(row[0], type=FileRecord)

    async def delete_file(self, file_id: str) -> None:
        await self._run(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)))

    # -- batches
    async def create_batch(self, record: BatchRecord) -> None:
        doc = msgspec.json.encode(record)
        await self._run(lambda db: db.execute(
            "INSERT INTO batches (id, tenant, status, doc) VALUES (?, ?, ?, ?)",
            (record.id, record.tenant, record.status, doc)))

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        row = await self._read(lambda db: db.execute(
            "SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone(), None)
        return None if row is None else msgspec.json.decode(row[0], type=BatchRecord)

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        def read(db: sqlite3.Connection) -> list[Any]:
            bound = 2**62
            if after is not None:
                row = db.execute("SELECT seq FROM batches WHERE id = ? AND tenant = ?",
                                 (after, tenant)).fetchone()
                bound = row[0] if row is not None else bound
            return db.execute(
                "SELECT doc FROM batches WHERE tenant = ? AND seq < ? ORDER BY seq DESC"
                " LIMIT ?", (tenant, bound, limit + 1)).fetchall()

        rows: list[Any] = await self._read(read, [])
        records = [msgspec.json.decode(r[0], type=BatchRecord) for r in rows[:limit]]
        return records, len(rows) > limit

    async def active_batches(self) -> list[str]:
        rows: list[Any] = await self._read(lambda db: db.execute(
            f"SELECT id FROM batches WHERE status NOT IN ({','.join('?' * len(_FINAL))})",
            _FINAL).fetchall(), [])
        return [r[0] for r in rows]

    async def transition(
        self,
        batch_id: str,
        from_status: Collection[str],
        changes: dict[str, Any],
        *,
        retake_final: bool = False,
        now: float = 0.0,
    ) -> bool:
        def change(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return False
            doc = msgspec.json.decode(row[0])
            status = doc["status"]
            stale = retake_final and status == "finalizing" and doc["final_lease"] < now
            if status not in from_status and not stale:
                return False
            doc.update(changes)
            db.execute("UPDATE batches SET status = ?, doc = ? WHERE id = ?",
                       (doc["status"], msgspec.json.encode(doc), batch_id))
            return True

        return await self._tx(change)

    # -- lines
    async def claim_chunk(
        self, batch: BatchRecord, owner: str, lease_s: float, now: float
    ) -> int | None:
        def claim(db: sqlite3.Connection) -> int | None:
            row = db.execute(
                "SELECT chunk FROM chunks WHERE batch_id = ? AND done = 0 AND expires < ?"
                " ORDER BY chunk LIMIT 1", (batch.id, now)).fetchone()
            if row is not None:
                db.execute("UPDATE chunks SET owner = ?, expires = ? WHERE batch_id = ?"
                           " AND chunk = ?", (owner, now + lease_s, batch.id, row[0]))
                return int(row[0])
            (count,) = db.execute("SELECT COUNT(*) FROM chunks WHERE batch_id = ?",
                                  (batch.id,)).fetchone()
            if count >= batch.chunks:
                return None
            db.execute("INSERT INTO chunks (batch_id, chunk, owner, expires) VALUES (?,?,?,?)",
                       (batch.id, count, owner, now + lease_s))
            return int(count)

        return await self._tx(claim)

    async def renew_chunk(
        self, batch_id: str, chunk: int, owner: str, lease_s: float, now: float
    ) -> bool:
        def renew(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE chunks SET expires = ? WHERE batch_id = ? AND chunk = ?"
                             " AND owner = ? AND done = 0", (now + lease_s, batch_id, chunk, owner))
            return cur.rowcount == 1

        return await self._run(renew)

    async def release_chunk(self, batch_id: str, chunk: int, owner: str, done: bool) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE chunks SET expires = 0, done = ? WHERE batch_id = ? AND chunk = ?"
            " AND owner = ?", (int(done), batch_id, chunk, owner)))

    async def leases_held(self, batch_id: str, now: float) -> int:
        row = await self._run(lambda db: db.execute(
            "SELECT COUNT(*) FROM chunks WHERE batch_id = ? AND done = 0 AND expires >= ?",
            (batch_id, now)).fetchone())
        return int(row[0])

    async def done_lines(self, batch_id: str, lines: range) -> set[int]:
        rows = await self._run(lambda db: db.execute(
            "SELECT idx FROM results WHERE batch_id = ? AND idx >= ? AND idx < ?",
            (batch_id, lines.start, lines.stop)).fetchall())
        return {int(r[0]) for r in rows}

    async def record_results(self, batch_id: str, results: list[LineResult]) -> int:
        def record(db: sqlite3.Connection) -> int:
            completed = failed = 0
            for r in results:
                cur = db.execute("INSERT OR IGNORE INTO results (batch_id, idx, ok, line)"
                                 " VALUES (?, ?, ?, ?)", (batch_id, r.index, int(r.ok), r.line))
                if cur.rowcount == 1:
                    if r.ok:
                        completed += 1
                    else:
                        failed += 1
            if completed or failed:
                row = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
                doc = msgspec.json.decode(row[0])
                doc["completed"] += completed
                doc["failed"] += failed
                db.execute("UPDATE batches SET doc = ? WHERE id = ?",
                           (msgspec.json.encode(doc), batch_id))
            return completed + failed

        return await self._tx(record)

    async def results(self, batch_id: str) -> list[LineResult]:
        rows = await self._run(lambda db: db.execute(
            "SELECT idx, ok, line FROM results WHERE batch_id = ? ORDER BY idx",
            (batch_id,)).fetchall())
        return [LineResult(int(i), bool(ok), bytes(line)) for i, ok, line in rows]

    def __repr__(self) -> str:
        return f"<SqliteBatchState {self.path}>"
