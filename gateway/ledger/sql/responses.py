"""Stored responses (the Responses API's ``store: true``) in the ledger's own database.

One row of ``stored_responses`` (migration 3) per response id: the tenant it belongs to, when
it was made and when it expires, the client's request, the chat messages the request was
translated to (earlier turns included, so a ``previous_response_id`` chain is rebuilt from one
row, never by walking back through the chain) and the response object, each as JSON text.

Every read and delete is scoped by tenant: another tenant's id is "not found", exactly like
an id that never existed, so an id reveals nothing across tenants. An expired row is not found
either, whether or not the retention sweep (``expire``, run by the ledger's maintenance task)
has deleted it yet.

The statements run on the ledger's own connections (SQLite: its writer and reader threads;
PostgreSQL: its pool), so the store adds no connection of its own; a database that is away
raises ``LedgerUnavailable``, as the ledger's reads do. A ``put`` is durable when the call
returns (SQLite ``synchronous=FULL``, PostgreSQL's commit), and puts group-commit: the puts
that arrive while one transaction runs share the next one (one fsync, one thread hop for
many responses under load; a put alone on an idle store is committed at once, it never waits
for a timer). A batch that fails is retried one put per transaction, so one bad row fails
only its own put. Deletes and the sweep are one autocommitted statement each.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import msgspec

from gateway.ledger.sql.params import Params

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.ledger.sql.migrations import Dialect
    from gateway.ledger.sql.postgres import PostgresLedger
    from gateway.ledger.sql.sqlite import SqliteLedger
    from gateway.ledger.sql.store import SqlLedger

__all__ = ["EXPIRE_BATCH", "ResponseStore", "StoredResponse"]

#: rows one statement of the retention sweep deletes at most (a sweep repeats until done), so
#: a long-idle store never holds one huge transaction
EXPIRE_BATCH = 5000
_encode = msgspec.json.encode
_decode = msgspec.json.decode


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response, decoded."""

    id: str
    tenant: str
    created_ms: int
    expires_ms: int
    #: the client's Responses request, as sent
    request: dict[str, Any]
    #: the chat messages the request was translated to (earlier turns included)
    messages: list[dict[str, Any]]
    #: the response object the client received
    answer: dict[str, Any]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ResponseStore:
    """``put`` / ``get`` / ``delete`` per tenant, and ``expire`` for the retention sweep."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger
        self.dialect = ledger.dialect
        ledger.sweeps.append(self.expire)  # the ledger's maintenance task sweeps the expired
        #: puts waiting for the next transaction: (statement, values, the caller's future)
        self._pending: list[tuple[str, tuple[Any, ...], asyncio.Future[int]]] = []
        self._committing = False
        self._commit_task: asyncio.Task[None] | None = None
        #: transactions that committed puts (fewer than the puts under load: group commit)
        self.put_transactions = 0
        self._put_sql = _put_statement(self.dialect)

    def __repr__(self) -> str:
        return f"<ResponseStore [{self.dialect}]>"

    async def put(
        self,
        tenant: str,
        response_id: str,
        *,
        request: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        answer: Mapping[str, Any],
        ttl_ms: int,
        now_ms: int | None = None,
        answer_json: bytes | None = None,
    ) -> bool:
        """Store (or replace) a response of ``tenant``, kept for ``ttl_ms``. An id another
        tenant holds is left alone (False): ids are the gateway's own, so only a backend's
        pass-through id could ever collide. ``answer_json``: ``answer`` as JSON already (the
        body the client got), saved as it is rather than encoded again."""
        return await self.put_soon(tenant, response_id, request=request, messages=messages,
                                   answer=answer, ttl_ms=ttl_ms, now_ms=now_ms,
                                   answer_json=answer_json) == 1

    def put_soon(
        self,
        tenant: str,
        response_id: str,
        *,
        request: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        answer: Mapping[str, Any],
        ttl_ms: int,
        now_ms: int | None = None,
        answer_json: bytes | None = None,
    ) -> asyncio.Future[int]:
        """``put``'s row queued for the next commit now, without waiting for it: the future
        is the rows it changed (1, or 0 for another tenant's id) once committed, or the
        commit's error. For a caller that waits for something else meanwhile (the pipeline,
        the usage record) without a task of its own for the wait."""
        now = _now_ms() if now_ms is None else now_ms
        values = (response_id, tenant, now, now + ttl_ms, _encode(request).decode(),
                  _encode(messages).decode(),
                  (_encode(answer) if answer_json is None else answer_json).decode())
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((self._put_sql, values, future))
        if not self._committing:
            self._committing = True
            # held here: the loop keeps only a weak reference to a task
            self._commit_task = loop.create_task(self._commit_pending())
        return future

    async def get(self, tenant: str, response_id: str, *, now_ms: int | None = None
                  ) -> StoredResponse | None:
        """``tenant``'s response ``response_id``; None when missing, expired or another's."""
        p = Params(self.dialect)
        sql = ("SELECT created_ms, expires_ms, request, messages, answer FROM stored_responses "
               f"WHERE id = {p.add(response_id, 'text')} AND tenant = {p.add(tenant, 'text')} "
               f"AND expires_ms > {p.add(_now_ms() if now_ms is None else now_ms, 'bigint')}")
        row = await self._read_one(sql, p.values)
        if row is None:
            return None
        created, expires, request, messages, answer = row
        return StoredResponse(response_id, tenant, int(created), int(expires), _decode(request),
                              _decode(messages), _decode(answer))

    async def delete(self, tenant: str, response_id: str, *, now_ms: int | None = None
                     ) -> bool:
        """Delete ``tenant``'s response; False when there was none to delete (missing,
        expired or another tenant's)."""
        p = Params(self.dialect)
        sql = (f"DELETE FROM stored_responses WHERE id = {p.add(response_id, 'text')} "
               f"AND tenant = {p.add(tenant, 'text')} "
               f"AND expires_ms > {p.add(_now_ms() if now_ms is None else now_ms, 'bigint')}")
        return await self._write(sql, p.values) == 1

    async def expire(self, *, now_ms: int | None = None) -> int:
        """Delete every expired response (an index range on ``expires_ms``, ``EXPIRE_BATCH``
        rows a statement); returns how many went."""
        now = _now_ms() if now_ms is None else now_ms
        total = 0
        while True:
            p = Params(self.dialect)
            sql = ("DELETE FROM stored_responses WHERE id IN (SELECT id FROM stored_responses "
                   f"WHERE expires_ms <= {p.add(now, 'bigint')} "
                   f"LIMIT {p.add(EXPIRE_BATCH, 'bigint')})")
            gone = await self._write(sql, p.values)
            total += gone
            if gone < EXPIRE_BATCH:
                return total

    # -- the ledger's connections ------------------------------------------------------------

    async def _commit_pending(self) -> None:
        """Commit what waits, batch after batch, until nothing does."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                statements = [(sql, values) for sql, values, _ in batch]
                try:
                    counts = await self._write_many(statements)
                except Exception:  # one bad row must not fail the others: one at a time
                    for sql, values, future in batch:
                        try:
                            count = (await self._write_many([(sql, values)]))[0]
                        except Exception as exc:
                            if not future.done():
                                future.set_exception(exc)
                        else:
                            if not future.done():
                                future.set_result(count)
                    continue
                for (_, _, future), count in zip(batch, counts, strict=True):
                    if not future.done():
                        future.set_result(count)
        finally:
            self._committing = False

    async def _write_many(self, statements: Sequence[tuple[str, tuple[Any, ...]]]
                          ) -> list[int]:
        """Statements in one transaction; the rows each changed."""
        self.put_transactions += 1
        if self.dialect == "sqlite":
            ledger = cast("SqliteLedger", self.ledger)
            return await ledger._on(ledger._writer,
                                    lambda: _in_transaction(ledger._w(), statements))
        pg = cast("PostgresLedger", self.ledger)
        return await pg._transaction(statements)

    async def _write(self, sql: str, values: Sequence[Any]) -> int:
        """One autocommitted statement; the rows it changed."""
        if self.dialect == "sqlite":
            ledger = cast("SqliteLedger", self.ledger)
            args = tuple(values)
            return await ledger._on(ledger._writer,
                                    lambda: _rowcount(ledger._w().execute(sql, args)))
        pg = cast("PostgresLedger", self.ledger)
        status: str = await pg._run("execute", sql, *values)
        return int(status.rsplit(" ", 1)[-1])  # "INSERT 0 1", "DELETE 3"

    async def _read_one(self, sql: str, values: Sequence[Any]) -> tuple[Any, ...] | None:
        if self.dialect == "sqlite":
            ledger = cast("SqliteLedger", self.ledger)
            args = tuple(values)
            row = await ledger._on(ledger._reader,
                                   lambda: ledger._r().execute(sql, args).fetchone())
            return tuple(row) if row is not None else None
        pg = cast("PostgresLedger", self.ledger)
        record = await pg._run("fetchrow", sql, *values)
        return tuple(record) if record is not None else None


def _put_statement(dialect: Dialect) -> str:
    """``put``'s statement (its text depends on the dialect alone: written once)."""
    p = Params(dialect)
    values = ", ".join(p.add(None, kind) for kind in (
        "text", "text", "bigint", "bigint", "text", "text", "text"))
    return ("INSERT INTO stored_responses (id, tenant, created_ms, expires_ms, request, "
            f"messages, answer) VALUES ({values}) ON CONFLICT (id) DO UPDATE SET "
            "created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, "
            "request = excluded.request, messages = excluded.messages, "
            "answer = excluded.answer WHERE stored_responses.tenant = excluded.tenant")


def _rowcount(cursor: sqlite3.Cursor) -> int:
    return cursor.rowcount


def _in_transaction(conn: sqlite3.Connection,
                    statements: Sequence[tuple[str, tuple[Any, ...]]]) -> list[int]:
    """Run ``statements`` in one SQLite transaction (one commit, one fsync)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        counts = [conn.execute(sql, values).rowcount for sql, values in statements]
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return counts
