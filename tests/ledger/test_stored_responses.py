"""The stored responses of the Responses API in the ledger's database (SQLite and PostgreSQL):
tenant-scoped put / get / delete, expiry by time and by the retention sweep, migration 3
on a database at version 2 that already holds records; chains (each turn stored once, read
back in one walk that never leaves the tenant, earlier turns kept while a later one needs
them), each tenant's storage kept exact, and migration 7 on rows that hold whole
conversations."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from gateway.dialects.responses.stored import conversation, earlier_messages, turn_messages
from gateway.ledger.sql import MIGRATIONS, SCHEMA_VERSION
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.store import SqlLedger
from gateway.ledger.sql.stored_responses import (
    EXPIRE_BATCH,
    BrokenChain,
    ChainTooLong,
    ResponseStore,
    StorageUsage,
)
from tests.ledger.postgres import SQL_DIALECTS
from tests.ledger.test_sql import _insert_raw, record
from tests.ledger.usage_data import all_rows, assert_reads_match, day_span

HOUR_MS = 3_600_000
#: the tests' clock: a day from now, so the ledger's own maintenance sweep (run at start, on the
#: real clock) never finds the tests' rows expired
T0 = time.time_ns() // 1_000_000 + 24 * HOUR_MS
REQUEST = {"model": "m", "input": "Hello, é ✓", "store": True}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, é ✓"}]
ANSWER = {"id": "resp_1", "object": "response", "output": [], "usage": None}


@pytest.fixture(params=SQL_DIALECTS)
async def make_sql(request: pytest.FixtureRequest, tmp_path: Path
                   ) -> AsyncIterator[Callable[..., Any]]:
    """``await make_sql(migrate=True)``: a started SQL ledger, every one on the same database."""
    dialect = str(request.param)
    url = request.getfixturevalue("postgres_url") if dialect == "postgresql" else ""
    made: list[SqlLedger] = []

    async def make(*, migrate: bool = True, start: bool = True) -> SqlLedger:
        spool = tmp_path / f"spool-{len(made)}"
        ledger: SqlLedger = (PostgresLedger(url, spool_dir=spool, migrate=migrate)
                             if dialect == "postgresql"
                             else SqliteLedger(tmp_path / "ledger.db", spool_dir=spool,
                                               migrate=migrate))
        made.append(ledger)
        if start:
            await ledger.start()
        return ledger

    yield make
    for ledger in made:
        await ledger.close()


def rid() -> str:
    return f"resp_{uuid.uuid4().hex}"


async def test_put_get_round_trip(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    key = rid()
    assert await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                           ttl_ms=HOUR_MS, now_ms=T0 + 1_000)
    got = await store.get("acme", key, now_ms=T0 + 2_000)
    assert got is not None
    assert (got.id, got.tenant, got.created_ms, got.expires_ms) == (key, "acme", T0 + 1_000,
                                                                     T0 + 1_000 + HOUR_MS)
    assert (got.request, got.messages, got.answer) == (REQUEST, MESSAGES, ANSWER)
    assert await store.get("acme", rid(), now_ms=T0 + 2_000) is None  # never stored


async def test_put_saves_the_answer_json_as_given(make_sql: Callable[..., Any]) -> None:
    """``answer_json`` (the body the client got) is the row's answer as it is, not encoded
    again from ``answer``; and it replaces an earlier row like any put."""
    store = ResponseStore(await make_sql())
    key = rid()
    body = b'{"id":"resp_1","object":"response","output_text":"\xc3\xa9 \xe2\x9c\x93"}'
    assert await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                           ttl_ms=HOUR_MS, now_ms=T0, answer_json=body)
    got = await store.get("acme", key, now_ms=T0 + 1)
    assert got is not None and got.answer == {"id": "resp_1", "object": "response",
                                              "output_text": "é ✓"}
    assert await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                           ttl_ms=HOUR_MS, now_ms=T0 + 2)
    got = await store.get("acme", key, now_ms=T0 + 3)
    assert got is not None and got.answer == ANSWER


async def test_another_tenant_sees_nothing_and_cannot_overwrite(make_sql: Callable[..., Any]
                                                                ) -> None:
    store = ResponseStore(await make_sql())
    key = rid()
    await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=HOUR_MS)
    assert await store.get("other", key) is None
    assert not await store.delete("other", key)
    # the same id put by another tenant leaves the owner's row as it was
    assert not await store.put("other", key, request={}, messages=[], answer={"x": 1},
                               ttl_ms=HOUR_MS)
    got = await store.get("acme", key)
    assert got is not None and got.answer == ANSWER
    assert await store.get("other", key) is None


async def test_concurrent_puts_share_transactions(make_sql: Callable[..., Any]) -> None:
    """Puts that arrive together group-commit: every one is stored (and durable when its call
    returns), in fewer transactions than puts; an id another tenant holds fails only that put."""
    store = ResponseStore(await make_sql())
    taken = rid()
    assert await store.put("other", taken, request={}, messages=[], answer={"o": 1},
                           ttl_ms=HOUR_MS)
    before = store.put_transactions
    keys = [rid() for _ in range(40)]
    results = await asyncio.gather(
        *(store.put("acme", k, request=REQUEST, messages=MESSAGES, answer={"n": i},
                    ttl_ms=HOUR_MS) for i, k in enumerate(keys)),
        store.put("acme", taken, request={}, messages=[], answer={"x": 1}, ttl_ms=HOUR_MS))
    assert results == [True] * 40 + [False]
    assert store.put_transactions - before < 41 // 2  # the first alone, then the rest together
    for i, k in enumerate(keys):
        got = await store.get("acme", k)
        assert got is not None and got.answer == {"n": i}
    still = await store.get("other", taken)
    assert still is not None and still.answer == {"o": 1}


async def test_put_again_replaces(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    key = rid()
    await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=HOUR_MS, now_ms=T0 + 1_000)
    assert await store.put("acme", key, request=REQUEST, messages=[], answer={"v": 2},
                           ttl_ms=HOUR_MS, now_ms=T0 + 5_000)
    got = await store.get("acme", key, now_ms=T0 + 6_000)
    assert got is not None and got.answer == {"v": 2} and got.created_ms == T0 + 5_000


async def test_delete_is_once(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    key = rid()
    await store.put("acme", key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=HOUR_MS)
    assert await store.delete("acme", key)
    assert await store.get("acme", key) is None
    assert not await store.delete("acme", key)


async def test_expired_is_not_found_and_swept(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    old, fresh = rid(), rid()
    await store.put("acme", old, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=1_000, now_ms=T0 + 10_000)
    await store.put("acme", fresh, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=HOUR_MS, now_ms=T0 + 10_000)
    assert await store.get("acme", old, now_ms=T0 + 10_999) is not None
    # past its expiry: not found (and not deletable) before any sweep ran
    assert await store.get("acme", old, now_ms=T0 + 11_000) is None
    assert not await store.delete("acme", old, now_ms=T0 + 11_000)
    assert await store.expire(now_ms=T0 + 11_000) == 1
    assert await store.get("acme", old, now_ms=T0 + 10_500) is None  # the sweep deleted the row
    assert await store.get("acme", fresh, now_ms=T0 + 11_000) is not None
    assert await store.expire(now_ms=T0 + 11_000) == 0


async def test_sweep_deletes_in_batches(make_sql: Callable[..., Any]) -> None:
    ledger = await make_sql()
    store = ResponseStore(ledger)
    n = EXPIRE_BATCH + 7
    for i in range(n):
        await store.put("acme", f"resp_{i}", request={}, messages=[], answer={}, ttl_ms=1,
                        now_ms=T0 + 1_000)
    assert await store.expire(now_ms=T0 + 2_000) == n


async def test_the_ledger_maintenance_runs_the_sweep(make_sql: Callable[..., Any]) -> None:
    """A row already expired when the ledger starts is swept by its maintenance task (whose
    first pass runs at start), not only by a direct call."""
    ledger = await make_sql(start=False)
    await ledger.migrate()
    store = ResponseStore(ledger)  # registered before start: the first maintenance run sweeps
    assert store.expire in ledger.sweeps
    key = rid()
    past = time.time_ns() // 1_000_000 - 60_000  # expired a minute ago, on the real clock
    await store.put("acme", key, request={}, messages=[], answer={}, ttl_ms=1, now_ms=past)
    assert await store.get("acme", key, now_ms=past) is not None
    await ledger.start()
    deadline = time.monotonic() + 30
    while await store.get("acme", key, now_ms=past) is not None:
        assert time.monotonic() < deadline, "the maintenance task never swept the row"
        await asyncio.sleep(0.05)


async def test_migration_3_on_a_version_2_database_with_records(
    make_sql: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at version 2 with records and rollups: migration 3 adds the table and keeps
    every record and rollup as it was."""
    import gateway.ledger.sql.postgres as pg_module
    import gateway.ledger.sql.sqlite as sqlite_module

    assert SCHEMA_VERSION >= 3
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old = await make_sql(start=False)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:1])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:1])
    assert await old.migrate() == [1]
    records = [record(tenant, model="a") for _ in range(20)]
    await _insert_raw(old, records)  # records as version 1 wrote them
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:2])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:2])
    assert await old.migrate() == [2]  # version 2: the rollups back-filled from them
    await old.close()
    monkeypatch.undo()
    ledger = await make_sql()  # migrates 3 (and what follows) at start
    assert await ledger.applied_version() == SCHEMA_VERSION
    await assert_reads_match(ledger, tenant, records)  # rows, export, and no drift
    (row,) = await all_rows(ledger, tenant, *day_span(records), ())
    assert row.requests == 20 and row.output == sum(r.output for r in records)
    store = ResponseStore(ledger)
    key = rid()
    await store.put(tenant, key, request=REQUEST, messages=MESSAGES, answer=ANSWER,
                    ttl_ms=HOUR_MS)
    got = await store.get(tenant, key)
    assert got is not None and got.messages == MESSAGES


# -- chains and storage (issue 34, point 5) ------------------------------------------------------
def _answer(n: int, text: str, instructions: str | None = None) -> dict[str, Any]:
    return {"id": f"resp_{n}", "object": "response", "instructions": instructions,
            "output": [{"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": text}]}]}


def _size(*values: Any) -> int:
    return sum(len(msgspec.json.encode(v)) for v in values)


async def test_a_chain_stores_each_turn_once_and_reads_the_conversation_back(
        make_sql: Callable[..., Any]) -> None:
    """30 turns: each row holds its own turn, so the chain's bytes are linear in its turns
    (whole conversations, as stored before, are quadratic), and the conversation read back at
    each turn is the one whole-conversation rows gave."""
    store = ResponseStore(await make_sql())
    chain_tenant, full_tenant = f"c-{uuid.uuid4().hex[:8]}", f"f-{uuid.uuid4().hex[:8]}"
    previous: str | None = None
    earlier: list[dict[str, Any]] = []  # what a whole-conversation row gave back
    turn_sizes = []
    for t in range(30):
        instructions = f"Rule {t}." if t % 4 == 0 else None
        own = [{"role": "user", "content": f"turn {t} " + "x" * 600}]
        if t % 3 == 0:
            own.insert(0, {"role": "system", "content": f"Rule {t}."})  # the client's own
        answer = _answer(t, f"reply {t} " + "y" * 300, instructions)
        request = {"model": "m", "input": own[-1]["content"], "instructions": instructions}
        head = [{"role": "system", "content": instructions}] if instructions else []
        full = [*head, *earlier, *own]  # the request's chat messages, as stored before
        key = rid()
        assert await store.put(chain_tenant, key, request=request,
                               messages=turn_messages(own, answer), answer=answer,
                               ttl_ms=HOUR_MS, previous_id=previous, delta=True)
        await store.put(full_tenant, rid(), request=request, messages=full, answer=answer,
                        ttl_ms=HOUR_MS)
        earlier = earlier_messages(full, answer)
        rows = await store.chain(chain_tenant, key)
        assert rows is not None and len(rows) == t + 1
        assert [r.previous_id for r in rows] == [None, *(r.id for r in rows[:-1])]
        assert rows[-1].request == request and rows[-1].answer == answer
        assert conversation(rows) == earlier, f"turn {t}"
        turn_sizes.append(_size(request, own, answer))
        previous = key
    usage = await store.usage(chain_tenant)
    assert usage.responses == 30
    assert usage.bytes < 2 * sum(turn_sizes)  # linear
    whole = await store.usage(full_tenant)
    assert whole.bytes > 5 * usage.bytes  # quadratic, as before


async def test_a_chain_walk_never_leaves_its_tenant(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    one, two, forged = rid(), rid(), rid()
    msgs = [{"role": "user", "content": "secret"}]
    await store.put("acme", one, request={}, messages=msgs, answer={}, ttl_ms=HOUR_MS,
                    delta=True)
    await store.put("acme", two, request={}, messages=msgs, answer={}, ttl_ms=HOUR_MS,
                    previous_id=one, delta=True)
    # a row of another tenant pointing at acme's (the gateway never writes one)
    await store.put("globex", forged, request={}, messages=[], answer={}, ttl_ms=HOUR_MS,
                    previous_id=one, delta=True)
    with pytest.raises(BrokenChain):
        await store.chain("globex", forged)
    assert await store.chain("globex", two) is None
    assert await store.chain("acme", forged) is None
    rows = await store.chain("acme", two)
    assert rows is not None and [r.id for r in rows] == [one, two]


async def test_a_walk_is_bounded(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    previous = None
    for _ in range(6):
        key = rid()
        await store.put("acme", key, request={}, messages=[], answer={}, ttl_ms=HOUR_MS,
                        previous_id=previous, delta=True)
        previous = key
    assert previous is not None
    rows = await store.chain("acme", previous, limit=6)
    assert rows is not None and len(rows) == 6
    with pytest.raises(ChainTooLong):
        await store.chain("acme", previous, limit=5)


async def test_deleted_and_expired_turns_stay_while_a_later_one_needs_them(
        make_sql: Callable[..., Any]) -> None:
    """A deleted or expired response a live one continues is not found, but its row stays
    (and counts) until nothing needs it; then it goes with the last one that did."""
    store = ResponseStore(await make_sql())
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    r1, r2, r3 = rid(), rid(), rid()
    for key, previous in ((r1, None), (r2, r1), (r3, r2)):
        await store.put(tenant, key, request={}, messages=[{"content": key}], answer={},
                        ttl_ms=HOUR_MS, now_ms=T0, previous_id=previous, delta=True)
    assert (await store.usage(tenant)).responses == 3
    assert await store.delete(tenant, r2, now_ms=T0 + 1)
    assert await store.get(tenant, r2, now_ms=T0 + 1) is None
    assert not await store.delete(tenant, r2, now_ms=T0 + 1)  # once
    rows = await store.chain(tenant, r3, now_ms=T0 + 1)
    assert rows is not None and [r.messages for r in rows] == [[{"content": k}]
                                                             for k in (r1, r2, r3)]
    assert (await store.usage(tenant)).responses == 3  # r2 still kept, for r3
    assert await store.delete(tenant, r3, now_ms=T0 + 2)  # r3 goes, and r2 with it
    assert (await store.usage(tenant)).responses == 1
    assert await store.chain(tenant, r1, now_ms=T0 + 2) is not None
    assert await store.delete(tenant, r1, now_ms=T0 + 3)
    assert await store.usage(tenant) == StorageUsage(0, 0)
    # expiry: the first turn expires before the second, which still needs it
    s1, s2 = rid(), rid()
    await store.put(tenant, s1, request={}, messages=[{"n": 1}], answer={}, ttl_ms=1_000,
                    now_ms=T0, delta=True)
    await store.put(tenant, s2, request={}, messages=[{"n": 2}], answer={}, ttl_ms=5_000,
                    now_ms=T0, previous_id=s1, delta=True)
    assert await store.get(tenant, s1, now_ms=T0 + 2_000) is None
    assert await store.expire(now_ms=T0 + 2_000) == 0  # kept for s2
    rows = await store.chain(tenant, s2, now_ms=T0 + 2_000)
    assert rows is not None and [r.messages for r in rows] == [[{"n": 1}], [{"n": 2}]]
    assert await store.chain(tenant, s1, now_ms=T0 + 2_000) is None  # not continued itself
    assert await store.expire(now_ms=T0 + 6_000) == 2  # both, in one sweep
    assert await store.usage(tenant) == StorageUsage(0, 0)


async def test_usage_is_exact_and_free_sweeps_one_tenant(make_sql: Callable[..., Any]) -> None:
    store = ResponseStore(await make_sql())
    tenant, other = f"t-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    key = rid()
    await store.put(tenant, key, request={"a": 1}, messages=[], answer={}, ttl_ms=HOUR_MS,
                    now_ms=T0)
    one = _size({"a": 1}, [], {})
    assert await store.usage(tenant) == StorageUsage(1, one)
    await store.put(tenant, key, request={"a": "x" * 100}, messages=[], answer={},
                    ttl_ms=1_000, now_ms=T0)  # replaced: one row, its new size
    bigger = _size({"a": "x" * 100}, [], {})
    assert await store.usage(tenant) == StorageUsage(1, bigger)
    assert not await store.put(other, key, request={}, messages=[], answer={},
                               ttl_ms=HOUR_MS)  # another's id: nothing stored, nothing counted
    assert await store.usage(other) == StorageUsage(0, 0)
    await store.put(other, rid(), request={}, messages=[], answer={}, ttl_ms=1_000, now_ms=T0)
    # past the expiry, before any sweep: still counted; ``free`` frees one tenant's at once
    assert (await store.usage(tenant)).responses == 1
    assert await store.free(tenant, now_ms=T0 + 2_000) == 1
    assert await store.usage(tenant) == StorageUsage(0, 0)
    assert (await store.usage(other)).responses == 1
    assert store.may_free(tenant) and not store.may_free(tenant)  # paced per tenant
    assert store.may_free(other)


async def test_migration_7_keeps_whole_conversation_rows_readable(
    make_sql: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written at version 6 hold whole conversations: after migration 7 they read and
    continue as before, a new turn continuing one stores only itself, and their sizes are in
    the tenant's usage."""
    import gateway.ledger.sql.postgres as pg_module
    import gateway.ledger.sql.sqlite as sqlite_module

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old = await make_sql(start=False)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:6])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:6])
    assert await old.migrate() == [1, 2, 3, 4, 5, 6]
    legacy = rid()
    answer = _answer(1, "Hi Ada.", "Be brief.")
    texts = (msgspec.json.encode(REQUEST).decode(), msgspec.json.encode(MESSAGES).decode(),
             msgspec.json.encode(answer).decode())
    row = (legacy, tenant, T0, T0 + HOUR_MS, *texts)
    insert = ("INSERT INTO stored_responses (id, tenant, created_ms, expires_ms, request, "
              "messages, answer) VALUES ({})")
    if isinstance(old, PostgresLedger):
        conn = await asyncpg.connect(old._dsn)
        await conn.execute(insert.format("$1, $2, $3, $4, $5, $6, $7"), *row)
        await conn.close()
    else:
        assert isinstance(old, SqliteLedger)
        with sqlite3.connect(old.path) as db:
            db.execute(insert.format("?, ?, ?, ?, ?, ?, ?"), row)
    await old.close()
    monkeypatch.undo()
    store = ResponseStore(await make_sql())  # migrates 7 (and what follows) at start
    got = await store.get(tenant, legacy, now_ms=T0 + 1)
    assert got is not None and got.messages == MESSAGES and not got.delta
    assert await store.usage(tenant) == StorageUsage(1, sum(len(t.encode()) for t in texts))
    rows = await store.chain(tenant, legacy, now_ms=T0 + 1)
    assert rows is not None and len(rows) == 1
    before = earlier_messages(MESSAGES, answer)  # what the row gave back at version 6
    assert conversation(rows) == before
    assert before == [MESSAGES[1], {"role": "assistant", "content": "Hi Ada."}]
    follow = rid()
    own = [{"role": "user", "content": "What is my name?"}]
    await store.put(tenant, follow, request={}, messages=turn_messages(own, _answer(2, "Ada.")),
                    answer=_answer(2, "Ada."), ttl_ms=HOUR_MS, now_ms=T0 + 2,
                    previous_id=legacy, delta=True)
    rows = await store.chain(tenant, follow, now_ms=T0 + 3)
    assert rows is not None
    assert conversation(rows) == [*before, *own, {"role": "assistant", "content": "Ada."}]
    # the whole-conversation row is kept while the new turn needs it, like any other
    assert await store.delete(tenant, legacy, now_ms=T0 + 4)
    rows = await store.chain(tenant, follow, now_ms=T0 + 5)
    assert rows is not None and len(rows) == 2
