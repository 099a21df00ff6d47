"""The stored responses of the Responses API in the ledger's database (SQLite and PostgreSQL):
tenant-scoped put / get / delete, expiry by time and by the retention sweep, and migration 3
on a database at version 2 that already holds records."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger.sql import MIGRATIONS, SCHEMA_VERSION
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.responses import EXPIRE_BATCH, ResponseStore
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.store import SqlLedger
from tests.ledger.test_sql import _insert_raw, record
from tests.ledger.usage_data import all_rows, assert_reads_match, day_span

HOUR_MS = 3_600_000
#: the tests' clock: a day from now, so the ledger's own maintenance sweep (run at start, on the
#: real clock) never finds the tests' rows expired
T0 = time.time_ns() // 1_000_000 + 24 * HOUR_MS
REQUEST = {"model": "m", "input": "Hello, é ✓", "store": True}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, é ✓"}]
ANSWER = {"id": "resp_1", "object": "response", "output": [], "usage": None}


@pytest.fixture(params=["sqlite", "postgresql"])
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
