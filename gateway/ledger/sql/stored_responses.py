"""Stored responses (the Responses API's ``store: true``) in the ledger's own database.

One row of ``stored_responses`` (migrations 3 and 7) per response id: the tenant it belongs to,
when it was made and when it expires, the client's request, the chat messages of its turn and
the response object, each as JSON text, and its size in bytes. A conversation is a chain: a row
continuing another (``previous_response_id``) points at it (``previous_id``) and holds only
the messages its own turn added (``delta``: its input, not the instructions, and its answer's
assistant turn), so n turns store O(n) bytes, not the whole conversation again each turn
(O(n^2)). ``chain`` reads a conversation back by walking the pointers, newest to oldest, in
one recursive query (bounded by ``MAX_CHAIN``), every step within the tenant; a row written
before migration 7 holds its whole conversation (``delta`` = 0) and ends a walk.

A response that a later one continues outlives its own expiry or deletion: it is no longer
found (``get``, ``delete``, a ``previous_response_id`` naming it), but its row stays, still
counted in its tenant's storage, as long as a live response of the conversation needs it
(``deleted`` marks one deleted by its tenant). ``delete`` and the retention sweep (``expire``,
run by the ledger's maintenance task; ``free`` for one tenant) remove dead rows nothing needs,
each removal climbing up the chain in the same statement.

``usage`` is a tenant's stored responses and bytes, one row of ``stored_response_usage`` that
triggers keep exact on every insert, replacement and delete (the ``stored_responses`` bound
of the tenant's plan reads it before a request runs).

Every read and delete is scoped by tenant: another tenant's id is "not found", exactly like
an id that never existed, so an id reveals nothing across tenants. An expired row is not found
either, whether or not the retention sweep has deleted it yet.

The statements run on the ledger's own connections (SQLite: its writer and reader threads;
PostgreSQL: its pool), so the store adds no connection of its own; a database that is away
raises ``LedgerUnavailable``, as the ledger's reads do. A ``put`` is durable when the call
returns (SQLite ``synchronous=FULL``, PostgreSQL's commit), and puts group-commit: the puts
that arrive while one transaction runs share the next one (one fsync, one thread hop for
many responses under load; a put alone on an idle store is committed at once, it never waits
for a timer), in tenant order (PostgreSQL locks each tenant's usage row in the same order in
every transaction). A batch that fails is retried one put per transaction, so one bad row
fails only its own put. Deletes and the sweep are one transaction each.
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

__all__ = ["EXPIRE_BATCH", "MAX_CHAIN", "BrokenChain", "ChainTooLong", "ResponseStore",
           "StorageUsage", "StoredResponse"]

#: dead rows one statement of the retention sweep starts from at most (a sweep repeats until
#: done; each also removes the dead rows above them that nothing else needs), so a long-idle
#: store never holds one huge transaction
EXPIRE_BATCH = 5000
#: the most responses one conversation reads back (a walk deeper than this is refused, and
#: bounds every walk whatever the rows say)
MAX_CHAIN = 4096
#: seconds between two ``free`` calls for one tenant by ``may_free``
FREE_EVERY = 5.0
_encode = msgspec.json.encode
_decode = msgspec.json.decode


class BrokenChain(Exception):
    """A conversation's walk back found a response missing (never the case for rows this
    store wrote: it keeps every row a live one needs)."""


class ChainTooLong(Exception):
    """A conversation is more than ``MAX_CHAIN`` responses long."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response, decoded."""

    id: str
    tenant: str
    created_ms: int
    expires_ms: int
    #: the client's Responses request, as sent (``{}`` for the earlier rows of a ``chain``)
    request: dict[str, Any]
    #: ``delta``: the chat messages this turn added (its input, then its answer's assistant
    #: turn); else the chat messages the request was translated to, earlier turns included
    messages: list[dict[str, Any]]
    #: the response object the client received (``{}`` for the earlier rows of a ``chain``
    #: that hold their turn's messages)
    answer: dict[str, Any]
    #: the response this one continues (``previous_response_id``), if any
    previous_id: str | None = None
    #: ``messages`` holds this turn's messages only (rows written since migration 7)
    delta: bool = False


@dataclass(frozen=True, slots=True)
class StorageUsage:
    """A tenant's stored responses: how many rows, how many bytes (JSON text)."""

    responses: int
    bytes: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ResponseStore:
    """``put`` / ``get`` / ``chain`` / ``delete`` per tenant, ``usage`` and ``free`` for the
    tenant's storage bound, and ``expire`` for the retention sweep."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger
        self.dialect = ledger.dialect
        ledger.sweeps.append(self.expire)  # the ledger's maintenance task sweeps the expired
        #: puts waiting for the next transaction: (tenant, statement, values, the future)
        self._pending: list[tuple[str, str, tuple[Any, ...], asyncio.Future[int]]] = []
        self._committing = False
        self._commit_task: asyncio.Task[None] | None = None
        #: transactions that committed puts (fewer than the puts under load: group commit)
        self.put_transactions = 0
        self._put_sql = _put_statement(self.dialect)
        #: when ``may_free`` last let a tenant's ``free`` run (monotonic seconds)
        self._freed: dict[str, float] = {}

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
        previous_id: str | None = None,
        delta: bool = False,
    ) -> bool:
        """Store (or replace) a response of ``tenant``, kept for ``ttl_ms``. An id another
        tenant holds is left alone (False): ids are the gateway's own, so only a backend's
        pass-through id could ever collide. ``answer_json``: ``answer`` as JSON already (the
        body the client got), saved as it is rather than encoded again. ``previous_id``: the
        response it continues; ``delta``: ``messages`` are this turn's only (its input and
        its answer's assistant turn), else the whole conversation."""
        return await self.put_soon(tenant, response_id, request=request, messages=messages,
                                   answer=answer, ttl_ms=ttl_ms, now_ms=now_ms,
                                   answer_json=answer_json, previous_id=previous_id,
                                   delta=delta) == 1

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
        previous_id: str | None = None,
        delta: bool = False,
    ) -> asyncio.Future[int]:
        """``put``'s row queued for the next commit now, without waiting for it: the future
        is the rows it changed (1, or 0 for another tenant's id) once committed, or the
        commit's error. For a caller that waits for something else meanwhile (the pipeline,
        the usage record) without a task of its own for the wait."""
        now = _now_ms() if now_ms is None else now_ms
        texts = (_encode(request), _encode(messages),
                 _encode(answer) if answer_json is None else answer_json)
        size = sum(len(t) for t in texts)
        values = (response_id, tenant, now, now + ttl_ms, *(t.decode() for t in texts),
                  previous_id, 1 if delta else 0, size)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((tenant, self._put_sql, values, future))
        if not self._committing:
            self._committing = True
            # held here: the loop keeps only a weak reference to a task
            self._commit_task = loop.create_task(self._commit_pending())
        return future

    async def get(self, tenant: str, response_id: str, *, now_ms: int | None = None
                  ) -> StoredResponse | None:
        """``tenant``'s response ``response_id``; None when missing, expired, deleted or
        another's."""
        p = Params(self.dialect)
        sql = ("SELECT created_ms, expires_ms, request, messages, answer, previous_id, delta "
               f"FROM stored_responses WHERE id = {p.add(response_id, 'text')} "
               f"AND tenant = {p.add(tenant, 'text')} "
               f"AND expires_ms > {p.add(_now_ms() if now_ms is None else now_ms, 'bigint')} "
               "AND deleted = 0")
        row = await self._read_one(sql, p.values)
        if row is None:
            return None
        created, expires, request, messages, answer, previous, delta = row
        return StoredResponse(response_id, tenant, int(created), int(expires), _decode(request),
                              _decode(messages), _decode(answer), previous, bool(delta))

    async def chain(self, tenant: str, response_id: str, *, now_ms: int | None = None,
                    limit: int = MAX_CHAIN) -> list[StoredResponse] | None:
        """The conversation ending at ``tenant``'s response ``response_id``, oldest first:
        its row and those it continues, back to the first (or to a row holding its whole
        conversation); one recursive query. None when ``response_id`` is missing, expired,
        deleted or another's (the earlier rows need not be live: they are kept for it).
        Raises ``ChainTooLong`` past ``limit`` rows, ``BrokenChain`` for a missing row. The
        earlier rows carry their messages (and, for a whole-conversation row, its answer);
        only the last carries its request and answer."""
        p = Params(self.dialect)  # (SQLite's placeholders are numbered in the text's order)
        sql = (
            "WITH RECURSIVE walk(id, previous_id, delta, depth) AS ("
            "SELECT id, previous_id, delta, 0 FROM stored_responses "
            f"WHERE id = {p.add(response_id, 'text')} AND tenant = {p.add(tenant, 'text')} "
            f"AND expires_ms > {p.add(_now_ms() if now_ms is None else now_ms, 'bigint')} "
            "AND deleted = 0 "
            "UNION ALL "
            "SELECT r.id, r.previous_id, r.delta, w.depth + 1 "
            "FROM walk w JOIN stored_responses r ON r.id = w.previous_id "
            f"WHERE w.delta = 1 AND r.tenant = {p.add(tenant, 'text')} "
            f"AND w.depth + 1 < {p.add(limit, 'bigint')}) "
            "SELECT w.depth, r.id, r.created_ms, r.expires_ms, "
            "CASE WHEN w.depth = 0 THEN r.request END, r.messages, "
            "CASE WHEN w.depth = 0 OR r.delta = 0 THEN r.answer END, r.previous_id, r.delta "
            "FROM walk w JOIN stored_responses r ON r.id = w.id ORDER BY w.depth DESC")
        rows = await self._read_all(sql, p.values)
        if not rows:
            return None
        oldest = rows[0]
        if oldest[8] and oldest[7] is not None:  # it continues a row the walk did not reach
            if len(rows) >= limit:
                raise ChainTooLong(f"the conversation is more than {limit} responses long")
            raise BrokenChain(f"response {oldest[7]!r} of the conversation is missing")
        return [StoredResponse(
            rid_, tenant, int(created), int(expires),
            _decode(request) if request is not None else {}, _decode(messages),
            _decode(answer) if answer is not None else {}, previous, bool(delta))
            for _, rid_, created, expires, request, messages, answer, previous, delta in rows]

    async def delete(self, tenant: str, response_id: str, *, now_ms: int | None = None
                     ) -> bool:
        """Delete ``tenant``'s response; False when there was none to delete (missing,
        expired, deleted or another tenant's). Its row goes at once unless a later response
        of the conversation still needs it (then it is kept, unreadable, until that one
        goes); so do the dead rows above it that only it needed."""
        now = _now_ms() if now_ms is None else now_ms
        p = Params(self.dialect)
        mark = (f"UPDATE stored_responses SET deleted = 1 WHERE id = {p.add(response_id, 'text')} "
                f"AND tenant = {p.add(tenant, 'text')} AND expires_ms > {p.add(now, 'bigint')} "
                "AND deleted = 0")
        prune = _prune(self.dialect, now, "s.id = {} AND s.tenant = {} AND s.deleted = 1",
                       (response_id, "text"), (tenant, "text"))
        marked, _ = await self._transact([(mark, tuple(p.values)), prune])
        return marked == 1

    async def usage(self, tenant: str) -> StorageUsage:
        """``tenant``'s stored responses and their bytes (dead rows still kept included)."""
        p = Params(self.dialect)
        row = await self._read_one("SELECT responses, bytes FROM stored_response_usage "
                                   f"WHERE tenant = {p.add(tenant, 'text')}", p.values)
        return StorageUsage(0, 0) if row is None else StorageUsage(int(row[0]), int(row[1]))

    def may_free(self, tenant: str) -> bool:
        """Whether ``free`` may run for ``tenant`` now: at most once per ``FREE_EVERY``
        seconds in this process (a tenant at its bound does not sweep on every request)."""
        now = time.monotonic()
        if now - self._freed.get(tenant, -FREE_EVERY) < FREE_EVERY:
            return False
        if len(self._freed) > 10_000:  # forget the tenants that last freed long ago
            self._freed = {t: at for t, at in self._freed.items() if now - at < FREE_EVERY}
        self._freed[tenant] = now
        return True

    async def free(self, tenant: str, *, now_ms: int | None = None) -> int:
        """Delete ``tenant``'s dead rows (expired or deleted) that nothing needs, without
        waiting for the retention sweep; how many went."""
        now = _now_ms() if now_ms is None else now_ms
        total = 0
        for _ in range(8):  # each pass also frees the rows whose children all went in one
            (gone,) = await self._transact([_prune(self.dialect, now, "s.tenant = {}",
                                                   (tenant, "text"))])
            total += gone
            if not gone:
                break
        return total

    async def expire(self, *, now_ms: int | None = None) -> int:
        """Delete every dead row (expired, or deleted while a later response needed it)
        that no live response needs (the dead rows nothing points at, ``EXPIRE_BATCH`` a
        statement, and the dead rows above them); returns how many went."""
        now = _now_ms() if now_ms is None else now_ms
        total = 0
        while True:
            (gone,) = await self._transact([_prune(self.dialect, now, "1 = 1",
                                                   limit=EXPIRE_BATCH)])
            total += gone
            if not gone:
                return total

    # -- the ledger's connections ------------------------------------------------------------

    async def _commit_pending(self) -> None:
        """Commit what waits, batch after batch, until nothing does."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                batch.sort(key=_tenant_of)  # one lock order on the tenants' usage rows
                statements = [(sql, values) for _, sql, values, _ in batch]
                try:
                    counts = await self._write_many(statements)
                except Exception:  # one bad row must not fail the others: one at a time
                    for _, sql, values, future in batch:
                        try:
                            count = (await self._write_many([(sql, values)]))[0]
                        except Exception as exc:
                            if not future.done():
                                future.set_exception(exc)
                        else:
                            if not future.done():
                                future.set_result(count)
                    continue
                for (_, _, _, future), count in zip(batch, counts, strict=True):
                    if not future.done():
                        future.set_result(count)
        finally:
            self._committing = False

    async def _write_many(self, statements: Sequence[tuple[str, tuple[Any, ...]]]
                          ) -> list[int]:
        """Puts in one transaction; the rows each changed."""
        self.put_transactions += 1
        return await self._transact(statements)

    async def _transact(self, statements: Sequence[tuple[str, tuple[Any, ...]]]
                        ) -> list[int]:
        """Statements in one transaction; the rows each changed."""
        if self.dialect == "sqlite":
            ledger = cast("SqliteLedger", self.ledger)
            return await ledger._on(ledger._writer,
                                    lambda: _in_transaction(ledger._w(), statements))
        pg = cast("PostgresLedger", self.ledger)
        return await pg._transaction(statements)

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

    async def _read_all(self, sql: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self.dialect == "sqlite":
            ledger = cast("SqliteLedger", self.ledger)
            args = tuple(values)
            rows = await ledger._on(ledger._reader,
                                    lambda: ledger._r().execute(sql, args).fetchall())
            return [tuple(r) for r in rows]
        pg = cast("PostgresLedger", self.ledger)
        return [tuple(r) for r in await pg._run("fetch", sql, *values)]


def _tenant_of(pending: tuple[str, str, tuple[Any, ...], asyncio.Future[int]]) -> str:
    return pending[0]


def _put_statement(dialect: Dialect) -> str:
    """``put``'s statement (its text depends on the dialect alone: written once)."""
    p = Params(dialect)
    values = ", ".join(p.add(None, kind) for kind in (
        "text", "text", "bigint", "bigint", "text", "text", "text", "text", "smallint",
        "bigint"))
    return ("INSERT INTO stored_responses (id, tenant, created_ms, expires_ms, request, "
            f"messages, answer, previous_id, delta, bytes) VALUES ({values}) "
            "ON CONFLICT (id) DO UPDATE SET "
            "created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, "
            "request = excluded.request, messages = excluded.messages, "
            "answer = excluded.answer, previous_id = excluded.previous_id, "
            "delta = excluded.delta, bytes = excluded.bytes, deleted = 0 "
            "WHERE stored_responses.tenant = excluded.tenant")


def _prune(dialect: Dialect, now_ms: int, start: str, *start_values: tuple[Any, str],
           limit: int | None = None) -> tuple[str, tuple[Any, ...]]:
    """The statement deleting dead rows (expired or deleted) that no row points at, among
    those ``start`` selects (a condition on ``s``, its placeholders ``{}`` for
    ``start_values``: (value, PostgreSQL type) pairs), and, climbing the chain from each,
    every dead row whose only child is the one below it. One statement: the dead rows of a
    conversation go together."""
    p = Params(dialect)
    where = start.format(*(p.add(value, kind) for value, kind in start_values))
    dead_s = f"(s.deleted = 1 OR s.expires_ms <= {p.add(now_ms, 'bigint')})"
    bound = f" LIMIT {p.add(limit, 'bigint')}" if limit is not None else ""
    dead_p = f"(up.deleted = 1 OR up.expires_ms <= {p.add(now_ms, 'bigint')})"
    deepest = p.add(MAX_CHAIN, "bigint")
    sql = (
        "WITH RECURSIVE doomed(id, tenant, previous_id, depth) AS ("
        "SELECT id, tenant, previous_id, 0 FROM ("
        "SELECT s.id, s.tenant, s.previous_id FROM stored_responses s "
        f"WHERE {where} AND {dead_s} AND NOT EXISTS (SELECT 1 FROM stored_responses c "
        f"WHERE c.previous_id = s.id AND c.tenant = s.tenant){bound}) AS leaves "
        "UNION ALL "
        "SELECT up.id, up.tenant, up.previous_id, d.depth + 1 "
        "FROM doomed d JOIN stored_responses up "
        "ON up.id = d.previous_id AND up.tenant = d.tenant "
        f"WHERE {dead_p} AND d.depth + 1 < {deepest} "
        "AND NOT EXISTS (SELECT 1 FROM stored_responses c "
        "WHERE c.previous_id = up.id AND c.tenant = up.tenant AND c.id <> d.id)) "
        "DELETE FROM stored_responses WHERE id IN (SELECT id FROM doomed)")
    return sql, tuple(p.values)


def _in_transaction(conn: sqlite3.Connection,
                    statements: Sequence[tuple[str, tuple[Any, ...]]]) -> list[int]:
    """Run ``statements`` in one SQLite transaction (one commit, one fsync)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        counts = [_changed(conn, conn.execute(sql, values)) for sql, values in statements]
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return counts


def _changed(conn: sqlite3.Connection, cursor: sqlite3.Cursor) -> int:
    """The rows a statement changed (not its triggers'): the cursor's count, or for a
    statement Python's sqlite3 does not count (one starting ``WITH``) SQLite's ``changes()``."""
    if cursor.rowcount >= 0:
        return cursor.rowcount
    return int(conn.execute("SELECT changes()").fetchone()[0])
