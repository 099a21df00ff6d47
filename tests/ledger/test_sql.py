"""The SQL ledgers (SQLite and PostgreSQL): schema, migrations, the start-up check, group
commit, rollups against records, retention, and outages of a real PostgreSQL."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
import uuid
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec
import pytest

from gateway.ledger import UsageRecord, day_of
from gateway.ledger.sql import MIGRATIONS, SCHEMA_VERSION, SchemaMismatch
from gateway.ledger.sql.compact import GRACE_MS, HOUR_GRACE_MS, HOUR_MS, THROUGH
from gateway.ledger.sql.migrations import Migration
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.schema import RECORD_COLUMNS, ROLLUP_COUNTERS, ROLLUP_KEYS
from gateway.ledger.sql.sqlite import SqliteLedger, split_script
from gateway.ledger.sql.store import SqlLedger
from gateway.ledger.sql.url import describe, parse_ledger_url
from gateway.ledger.sql.usage_query import UsageQuery
from tests.ledger.postgres import SQL_DIALECTS
from tests.ledger.usage_data import (
    FINEST,
    all_rows,
    assert_reads_match,
    day_ms,
    day_span,
    expected_rows,
    row_dict,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

DAY_MS = 86_400_000


def record(tenant: str, **fields: Any) -> UsageRecord:
    base: dict[str, Any] = {
        "request_id": uuid.uuid4().hex, "ts_ms": time.time_ns() // 1_000_000,
        "tenant": tenant, "model": "m", "request_class": "interactive",
        "system": 3, "history": 5, "new": 7, "tools": 1, "prompt_total": 16, "cached": 4,
        "cache_write": 2, "output": 9, "reasoning": 3, "cost_micros": 120,
        "cost_system": 10, "cost_history": 20, "cost_new": 30, "cost_tools": 5,
        "cost_output": 40, "cost_reasoning": 15, "ttft_ms": 12.345, "duration_ms": 99.5,
    }
    base.update(fields)
    return UsageRecord(**base)


@pytest.fixture(params=SQL_DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
async def make_sql(dialect: str, request: pytest.FixtureRequest, tmp_path: Path
                   ) -> AsyncIterator[Callable[..., Any]]:
    """``await make_sql(migrate=True, start=True)``: a SQL ledger of the dialect on one
    database (every ledger the test makes shares it, like replicas)."""
    url = (request.getfixturevalue("postgres_url") if dialect == "postgresql"
           else f"sqlite:///{tmp_path / 'ledger.db'}")
    made: list[SqlLedger] = []

    async def make(*, migrate: bool = True, start: bool = True, **kw: Any) -> SqlLedger:
        spool = tmp_path / f"spool-{len(made)}"
        ledger: SqlLedger
        if dialect == "postgresql":
            ledger = PostgresLedger(url, spool_dir=spool, migrate=migrate, **kw)
        else:
            ledger = SqliteLedger(parse_ledger_url(url).target, spool_dir=spool,
                                  migrate=migrate, **kw)
        made.append(ledger)
        if start:
            await ledger.start()
        return ledger

    make.url = url  # type: ignore[attr-defined]
    yield make
    for ledger in made:
        await ledger.close()


# -- schema ------------------------------------------------------------------------------------

def test_record_columns_are_the_record_fields() -> None:
    """A field added to the record without a column (and a migration) fails here."""
    assert list(RECORD_COLUMNS) == list(UsageRecord.__struct_fields__)


async def test_migrated_tables_have_the_columns(make_sql: Callable[..., Any], dialect: str
                                                ) -> None:
    ledger = await make_sql()
    assert await ledger.applied_version() == SCHEMA_VERSION
    if dialect == "postgresql":
        conn = await asyncpg.connect(make_sql.url)  # type: ignore[attr-defined]
        try:
            def cols(table: str) -> Any:
                return conn.fetch("SELECT column_name FROM information_schema.columns "
                                  "WHERE table_name = $1 ORDER BY ordinal_position", table)
            records = [r[0] for r in await cols("usage_records")]
            rollups = [r[0] for r in await cols("usage_hourly")]
            daily = [r[0] for r in await cols("usage_daily")]
        finally:
            await conn.close()
    else:
        conn = sqlite3.connect(parse_ledger_url(make_sql.url).target)  # type: ignore[attr-defined]
        records = [r[1] for r in conn.execute("PRAGMA table_info(usage_records)")]
        rollups = [r[1] for r in conn.execute("PRAGMA table_info(usage_hourly)")]
        daily = [r[1] for r in conn.execute("PRAGMA table_info(usage_daily)")]
        conn.close()
    assert records == ["day", *RECORD_COLUMNS]
    assert rollups == ["hour_ms", *ROLLUP_KEYS, *ROLLUP_COUNTERS]
    assert daily == ["day_ms", *ROLLUP_KEYS, *ROLLUP_COUNTERS]


def test_sqlite_scripts_split_into_whole_statements() -> None:
    for migration in MIGRATIONS:
        statements = split_script(migration.sqlite)
        assert statements and all(sqlite3.complete_statement(s) for s in statements)
    (trigger,) = [s for s in split_script(MIGRATIONS[1].sqlite) if "TRIGGER" in s]
    assert trigger.endswith("END;")


def test_url_parsing_and_masking() -> None:
    assert parse_ledger_url("postgresql://u:pw@h:5432/db").dialect == "postgresql"
    assert parse_ledger_url("postgres://h/db").dialect == "postgresql"
    assert parse_ledger_url("sqlite:///var/lib/gw/ledger.db").target == "/var/lib/gw/ledger.db"
    assert parse_ledger_url("sqlite:data/ledger.db").target == "data/ledger.db"
    with pytest.raises(ValueError, match=r"\*\*\*") as info:
        parse_ledger_url("mysql://u:secretpw@h/db")
    assert "secretpw" not in str(info.value)
    assert describe("postgresql://u:secretpw@h:1/db") == "postgresql://u:***@h:1/db"


# -- the start-up check and migrations ------------------------------------------------------------

async def test_empty_postgres_is_refused_until_migrated(postgres_url: str, tmp_path: Path
                                                        ) -> None:
    ledger = PostgresLedger(postgres_url, spool_dir=tmp_path / "s")
    with pytest.raises(SchemaMismatch, match="gateway db migrate"):
        await ledger.start()
    await ledger.close()
    migrating = PostgresLedger(postgres_url, spool_dir=tmp_path / "s2", migrate=True)
    await migrating.start()
    await migrating.close()
    again = PostgresLedger(postgres_url, spool_dir=tmp_path / "s3")
    await again.start()  # migrated: accepted
    await again.close()


async def test_newer_schema_is_refused(make_sql: Callable[..., Any]) -> None:
    first = await make_sql()
    await first.close()
    url = make_sql.url  # type: ignore[attr-defined]
    future = SCHEMA_VERSION + 1
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(url)
        await conn.execute("INSERT INTO gateway_schema (version, name) VALUES ($1, 'x')", future)
        await conn.close()
    else:
        with sqlite3.connect(parse_ledger_url(url).target) as conn:
            conn.execute("INSERT INTO gateway_schema (version, name) VALUES (?, 'x')", (future,))
    later = await make_sql(start=False)
    with pytest.raises(SchemaMismatch, match="newer than this gateway knows"):
        await later.start()


async def test_migration_from_the_previous_version_backfills_rollups(
    make_sql: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at version 1 (records, no rollups) with records in it: migrating to 2
    builds the rollups from those records, and they equal the records' sums."""
    import gateway.ledger.sql.postgres as pg_module
    import gateway.ledger.sql.sqlite as sqlite_module

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old = await make_sql(start=False)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:1])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:1])
    assert await old.migrate() == [1]
    assert await old.applied_version() == 1
    records = [record(tenant, model=random.choice("ab"), estimated=i % 3 == 0,
                      outcome="failed" if i % 5 == 0 else "completed") for i in range(50)]
    await _insert_raw(old, records)
    await old.close()
    monkeypatch.undo()
    ledger = await make_sql()  # migrates 2 at start
    assert await ledger.applied_version() == SCHEMA_VERSION
    await assert_reads_match(ledger, tenant, records)  # rows, export, and no drift
    (row,) = await all_rows(ledger, tenant, *day_span(records), ())
    assert row.requests == 50
    assert row.reasoning == sum(r.reasoning for r in records)


async def test_migration_from_version_4_backfills_the_daily_rollups(
    make_sql: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at version 4 (records and hourly rollups, no daily ones) over several
    days: migrating to 5 builds ``usage_daily`` from the hourly rollups; whole-day reads
    (which read it) equal the records' sums, drift (which checks it) is empty, and records
    written after the migration land in both rollups."""
    import gateway.ledger.sql.postgres as pg_module
    import gateway.ledger.sql.sqlite as sqlite_module

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old = await make_sql(start=False)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:1])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:1])
    assert await old.migrate() == [1]
    start = (int(time.time() * 1000) // DAY_MS - 3) * DAY_MS
    records = [record(tenant, ts_ms=start + i * 997_001, model=random.choice("ab"),
                      estimated=i % 3 == 0, outcome="failed" if i % 5 == 0 else "completed")
               for i in range(300)]  # about three and a half days
    await _insert_raw(old, records)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:4])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:4])
    assert await old.migrate() == [2, 3, 4]
    assert await old._fetch("SELECT count(*) FROM usage_hourly", []) != [(0,)]
    await old.close()
    monkeypatch.undo()
    ledger = await make_sql()  # migrates 5 at start
    assert await ledger.applied_version() == SCHEMA_VERSION >= 5
    (n,) = await ledger._fetch("SELECT count(*) FROM usage_daily", [])
    assert n[0] > 0
    later = [record(tenant, ts_ms=start + DAY_MS + i) for i in range(20)]
    for r in later:
        ledger.write_nowait(r)
    await ledger.flush()
    everything = records + later
    await assert_reads_match(ledger, tenant, everything)  # rows, export, and no drift
    lo, hi = day_span(everything)
    assert lo % DAY_MS == 0 and hi % DAY_MS == 0  # whole days: answered from usage_daily
    (row,) = await all_rows(ledger, tenant, lo, hi, ())
    assert row.requests == 320 and row.failed == sum(r.outcome != "completed"
                                                     for r in everything)
    assert row.output == sum(r.output for r in everything)


async def test_drift_checks_the_daily_rollups_too(make_sql: Callable[..., Any]) -> None:
    """A daily rollup row edited by hand is a drift of grain "day" (the hourly ones agree).
    The records are two days old: a closed day, in ``usage_daily`` in both dialects."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ledger = await make_sql()
    two_days_ago = time.time_ns() // 1_000_000 - 2 * DAY_MS
    records = [record(tenant, output=5, ts_ms=two_days_ago + i) for i in range(10)]
    for r in records:
        ledger.write_nowait(r)
    await ledger.flush()
    day = date.fromisoformat(records[0].day)
    assert await ledger.drift(tenant, day) == []
    url = make_sql.url  # type: ignore[attr-defined]
    edit = "UPDATE usage_daily SET output = output + 3 WHERE tenant = "
    if url.startswith("postgresql"):
        conn = await asyncpg.connect(url)
        await conn.execute(edit + "$1", tenant)
        await conn.close()
    else:
        with sqlite3.connect(parse_ledger_url(url).target) as conn:
            conn.execute(edit + "?", (tenant,))
    (drift,) = await ledger.drift(tenant, day)
    assert (drift.grain, drift.counter, drift.rollup, drift.records) == ("day", "output",
                                                                        53, 50)
    assert f"{day} (daily)" in drift.describe()


async def _daily_rows(ledger: SqlLedger, tenant: str) -> int:
    p = "$1" if ledger.dialect == "postgresql" else "?"
    ((n,),) = await ledger._fetch(f"SELECT count(*) FROM usage_daily WHERE tenant = {p}",
                                  [tenant])
    return int(n)


async def test_closed_days_are_compacted_into_the_daily_rollups(
        make_sql: Callable[..., Any]) -> None:
    """PostgreSQL's write path keeps the hourly rollups only: today's records are in no
    daily row, whole-day reads answer them from the hourly ones; once the day has closed
    (and its grace passed) one compaction sums it into ``usage_daily``, the reads give the
    same sums from there, a second compaction does nothing, and a record landing later for
    the compacted day (a replayed spool) is added to the daily rollups by the write path.
    SQLite's trigger keeps the daily rollups current: nothing to compact."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ledger = await make_sql()
    postgres = ledger.dialect == "postgresql"
    today = time.time_ns() // 1_000_000 // DAY_MS * DAY_MS
    records = [record(tenant, ts_ms=today + i * 1_000, model=random.choice("ab"), output=i,
                      outcome="failed" if i % 7 == 0 else "completed") for i in range(40)]
    for r in records:
        ledger.write_nowait(r)
    await ledger.flush()
    assert (await _daily_rows(ledger, tenant) == 0) is postgres
    await assert_reads_match(ledger, tenant, records, ((), ("day", "model"), FINEST))
    closes = today + DAY_MS + GRACE_MS
    assert await ledger.compact(closes - 1) == 0  # not closed yet: in its grace
    assert await ledger.compact(closes) == (1 if postgres else 0)
    assert await _daily_rows(ledger, tenant) == len({r.model for r in records})
    assert await ledger.drift(tenant, date.fromisoformat(records[0].day)) == []
    await assert_reads_match(ledger, tenant, records, ((), ("day", "model"), FINEST))
    assert await ledger.compact(closes) == 0
    late = [record(tenant, ts_ms=today + 5_000 + i, model="a", output=7) for i in range(3)]
    for r in late:
        ledger.write_nowait(r)
    await ledger.flush()
    await assert_reads_match(ledger, tenant, records + late, ((), ("day", "model"), FINEST))


async def _tenant_rows(ledger: SqlLedger, table: str, tenant: str) -> int:
    p = "$1" if ledger.dialect == "postgresql" else "?"
    ((n,),) = await ledger._fetch(f"SELECT count(*) FROM {table} WHERE tenant = {p}", [tenant])
    return int(n)


def test_reads_by_tenant_alone_take_the_tenant_rollups() -> None:
    """A read of whole days grouped by tenant, team, organization, day or month only takes
    the tenant rollups (days, then hours); any other dimension, or hours, does not."""
    day = 20_000 * DAY_MS
    for group_by in ((), ("tenant",), ("day", "organization"), ("month", "team", "tenant")):
        sql = UsageQuery.build("postgresql", None, day, day + DAY_MS, group_by).sql
        assert "usage_daily_tenants" in sql and "usage_hourly_tenants" in sql, group_by
    for group_by in (("model",), ("tenant", "key"), ("day", "class")):
        sql = UsageQuery.build("postgresql", None, day, day + DAY_MS, group_by).sql
        assert "_tenants" not in sql and "usage_daily" in sql, group_by
    assert "usage_daily" not in UsageQuery.build("postgresql", None, day, day + DAY_MS - 1,
                                                 ("tenant",)).sql


async def test_reads_across_tenants_equal_the_records_through_every_compaction(
        make_sql: Callable[..., Any]) -> None:
    """The operator's read (every tenant, grouped by tenant, team or organization) equals the
    records' sums while the day is open (hourly rollups), once its first hour's tenant rollups
    are made (``usage_hourly_tenants``), after a late record for that hour (added there by the
    write path), once the day is compacted (``usage_daily_tenants``; its tenant hours
    dropped), and after a late record for the compacted day; SQLite's trigger keeps its
    tenant rollups current throughout."""
    run = uuid.uuid4().hex[:8]
    tenants = [f"t-{run}-{i}" for i in range(3)]
    orgs = {t: f"o-{run}-{i % 2}" for i, t in enumerate(tenants)}
    teams = {t: f"team-{run}-{i}" for i, t in enumerate(tenants)}
    ledger = await make_sql()
    postgres = ledger.dialect == "postgresql"
    # tomorrow: hours no maintenance run has closed (the ledger's own runs at its start)
    day = time.time_ns() // 1_000_000 // DAY_MS * DAY_MS + DAY_MS
    rng = random.Random(12)

    def make(i: int, ts: int) -> UsageRecord:
        tenant = rng.choice(tenants)
        return record(tenant, ts_ms=ts, team=teams[tenant], organization=orgs[tenant],
                      model=rng.choice("abc"), key_id=rng.choice(["k1", "k2", None]),
                      output=rng.randint(0, 90), cost_micros=rng.randint(0, 10_000),
                      outcome="failed" if i % 5 == 0 else "completed")

    # the day's first hour (closed below, so its tenant rollups are made) and its second
    records = [make(i, day + i * 997) for i in range(40)]
    records += [make(i, day + HOUR_MS + i * 991) for i in range(20)]

    async def check(written: list[UsageRecord]) -> None:
        for group_by in (("tenant",), ("day", "organization"), ("team",), ()):
            got = [row_dict(r, group_by)
                   for r in await all_rows(ledger, None, day, day + DAY_MS, group_by)]
            assert got == expected_rows(written, group_by, day, day + DAY_MS, None), group_by

    async def write(batch: list[UsageRecord]) -> None:
        for r in batch:
            ledger.write_nowait(r)
        await ledger.flush()

    await write(records)
    assert (await _tenant_rows(ledger, "usage_daily_tenants", tenants[0]) == 0) is postgres
    await check(records)
    if postgres:  # up to the first hour's end: its tenant rollups, not the second hour's
        assert await ledger.compact_tenant_hours(day + HOUR_MS + HOUR_GRACE_MS) >= 1
        assert await ledger.compact_tenant_hours(day + HOUR_MS + HOUR_GRACE_MS) == 0
        hours = await ledger._fetch("SELECT DISTINCT hour_ms FROM usage_hourly_tenants "
                                    "WHERE hour_ms >= $1", [day])
        assert hours == [(day,)]
    await check(records)
    late = [make(i, day + 5_000 + i) for i in range(4)]  # into the compacted hour
    await write(late)
    records += late
    await check(records)
    assert await ledger.compact(day + DAY_MS + GRACE_MS) == (2 if postgres else 0)
    assert await _tenant_rows(ledger, "usage_daily_tenants", tenants[0]) == 1
    for tenant in tenants:  # the compacted day's tenant hours are read no more: dropped
        assert await _tenant_rows(ledger, "usage_hourly_tenants", tenant) == 0
    await check(records)
    late = [make(i, day + 7_000 + i) for i in range(4)]  # into the compacted day
    await write(late)
    await check(records + late)


async def _insert_raw(ledger: SqlLedger, records: list[UsageRecord], until: str = "api"
                      ) -> None:
    """Records as a version-1 gateway wrote them (no rollups then, and only the columns of
    version 1: ``api`` came with migration 4); with ``until``, the columns before that one
    (those of the version before the migration that added it)."""
    from gateway.ledger.sql.schema import quoted, record_row

    v1 = RECORD_COLUMNS[:RECORD_COLUMNS.index(until)]
    cols = quoted(v1)
    rows = [record_row(r)[:len(v1)] for r in records]
    if isinstance(ledger, PostgresLedger):
        days = {r.ts_ms // DAY_MS for r in records}
        await ledger._make_partitions(days)
        conn = await asyncpg.connect(ledger._dsn)
        marks = ", ".join(f"${i + 2}" for i in range(len(v1)))
        await conn.executemany(
            f"INSERT INTO usage_records (day, {cols}) VALUES ($1, {marks})",
            [(date.fromisoformat(r.day), *row) for r, row in zip(records, rows, strict=True)])
        await conn.close()
    else:
        assert isinstance(ledger, SqliteLedger)
        with sqlite3.connect(ledger.path) as conn:
            marks = ", ".join("?" * (len(v1) + 1))
            conn.executemany(f"INSERT INTO usage_records (day, {cols}) VALUES ({marks})",
                             [(r.day, *row) for r, row in zip(records, rows, strict=True)])


async def test_migration_11_adds_the_continuation_cost(
    make_sql: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database at version 10 holding a continued stream's record: migrating to 11 adds
    ``usage_records.continuation_cost``, 0 on that record, and a record written after it
    keeps its own continuation cost through the database."""
    import gateway.ledger.sql.postgres as pg_module
    import gateway.ledger.sql.sqlite as sqlite_module

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old = await make_sql(start=False)
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:10])
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:10])
    assert await old.migrate() == list(range(1, 11))
    before = record(tenant, continued=True, continuation_prompt=40)
    await _insert_raw(old, [before], until="continuation_cost")
    await old.close()
    monkeypatch.undo()
    ledger = await make_sql()  # migrates 11 at start
    assert await ledger.applied_version() == SCHEMA_VERSION >= 11
    after = record(tenant, continued=True, continuation_prompt=40, continuation_cost=120,
                   cost_micros=240)
    await ledger.write_durable(after)
    back = {r.request_id: r async for r in ledger.export(0, 2**62, tenant)}
    assert back[before.request_id].continuation_cost == 0
    assert back[before.request_id].continuation_prompt == 40
    assert msgspec.structs.asdict(back[after.request_id]) == msgspec.structs.asdict(after)


async def test_migrate_is_idempotent_and_concurrent(make_sql: Callable[..., Any]) -> None:
    """Replicas migrating at once apply each migration once."""
    ledgers = [await make_sql(start=False) for _ in range(3)]
    results = await asyncio.gather(*(lg.migrate() for lg in ledgers))
    assert sorted(v for done in results for v in done) == [m.version for m in MIGRATIONS]
    assert await ledgers[0].migrate() == []


async def test_sqlite_opens_beside_another_writer(tmp_path: Path) -> None:
    """A new file held by another connection's write transaction (a second worker migrating
    it) is opened once that commits: SQLite refuses the switch to WAL at once then, without
    its busy handler, so the ledger waits for it itself."""
    path = tmp_path / "ledger.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE held (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO held VALUES (1)")
    ledger = SqliteLedger(path, spool_dir=tmp_path / "spool", busy_timeout=30.0)
    try:
        opening = asyncio.ensure_future(ledger.migrate())
        await asyncio.sleep(0.2)
        assert not opening.done()  # still waiting for the other writer, not failed
        other.execute("COMMIT")
        async with asyncio.timeout(30):
            assert await opening == [m.version for m in MIGRATIONS]
    finally:
        other.close()
        await ledger.close()


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert all(isinstance(m, Migration) and m.postgresql and m.sqlite for m in MIGRATIONS)


# -- writing: group commit, dedupe, rollups --------------------------------------------

async def test_group_commit_makes_each_record_durable_once(
    make_sql: Callable[..., Any],
) -> None:
    """Concurrent durable writes share commits, every future completes only once its record
    is in the database, and a record written twice is one row."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ledger = await make_sql()
    records = [record(tenant) for _ in range(500)]
    await asyncio.gather(*(ledger.write_durable(r) for r in records))
    assert ledger.stats.flushes < len(records)  # commits were shared
    assert ledger.stats.stored == 500 and ledger.pending == 0
    reader = await make_sql()  # another replica sees them all
    assert len([r async for r in reader.export(0, 2**62, tenant)]) == 500
    await asyncio.gather(*(ledger.write_durable(r) for r in records[:50]))
    assert ledger.stats.duplicates == 50
    (row,) = await all_rows(reader, tenant, *day_span(records), ())
    assert row.requests == 500
    assert row.cost_micros == 500 * 120
    await assert_reads_match(reader, tenant, records)


async def test_records_round_trip_exactly(make_sql: Callable[..., Any]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ledger = await make_sql()
    original = record(tenant, key_id="k1", team="tm", organization="org", version="v2",
                      batch_id="batch_1", pool="p", backend="b", upstream_model="u",
                      attempts=2, status=200, estimated=True, tpot_ms=None)
    await ledger.write_durable(original)
    (back,) = [r async for r in ledger.export(0, 2**62, tenant)]
    assert msgspec.structs.asdict(back) == msgspec.structs.asdict(original)


async def test_replicas_writing_the_same_records_leave_one_row_each(
    make_sql: Callable[..., Any]
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    replicas = [await make_sql() for _ in range(3)]
    records = [record(tenant, key_id=f"k{i % 4}") for i in range(400)]
    for ledger in replicas:
        shuffled = random.sample(records, len(records))
        for r in shuffled:
            ledger.write_nowait(r)
    await asyncio.gather(*(lg.flush() for lg in replicas))
    assert sum(lg.stats.stored for lg in replicas) == 400
    await assert_reads_match(replicas[0], tenant, records)  # rows, export, and no drift
    (row,) = await all_rows(replicas[1], tenant, *day_span(records), ())
    assert row.requests == 400 and row.prompt_total == 400 * 16


async def test_rollups_equal_the_records_for_random_batches(make_sql: Callable[..., Any]
                                                            ) -> None:
    """Property: whatever mix of tenants, days, models, classes, batches and duplicates is
    written, each day's rollup totals equal the sum of that day's records."""
    rng = random.Random(7)
    tenants = [f"t-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    now = time.time_ns() // 1_000_000
    ledger = await make_sql()
    written: dict[str, UsageRecord] = {}
    for _ in range(6):
        batch = []
        for _ in range(rng.randint(1, 120)):
            r = record(rng.choice(tenants), ts_ms=now - rng.randint(0, 3) * DAY_MS,
                       model=rng.choice(["a", "b|c"]), request_class=rng.choice(["i", "b"]),
                       batch_id=rng.choice([None, "batch_1"]), output=rng.randint(0, 50),
                       estimated=rng.random() < 0.3)
            batch.append(r)
            written[r.request_id] = r
        batch += rng.sample(list(written.values()), min(10, len(written)))
        for r in batch:
            ledger.write_nowait(r)
        await ledger.flush()
    for tenant in tenants:
        for back in range(4):
            day = date.fromisoformat(day_of(now - back * DAY_MS))
            assert await ledger.drift(tenant, day) == []
        mine = [r for r in written.values() if r.tenant == tenant]
        await assert_reads_match(ledger, tenant, mine, ((), ("day", "model", "class", "batch"),
                                                        FINEST))
    assert ledger.stats.stored == len(written)


# -- retention ------------------------------------------------------------------------------------

async def test_retention_drops_old_records_and_keeps_rollups(
    make_sql: Callable[..., Any],
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ledger = await make_sql()
    today = date.today()
    old_ms = (time.time_ns() // 1_000_000) - 10 * DAY_MS
    old = [record(tenant, ts_ms=old_ms) for _ in range(5)]
    new = [record(tenant) for _ in range(3)]
    for r in old + new:
        ledger.write_nowait(r)
    await ledger.flush()
    ledger.settings = replace(ledger.settings, retention_days=5)
    assert await ledger.expire(today) >= 1
    old_day = day_of(old_ms)
    old_lo = day_ms(old_day)
    assert [r async for r in ledger.export(old_lo, old_lo + DAY_MS, tenant)] == []
    kept = {r.request_id async for r in ledger.export(0, 2**62, tenant)}
    assert kept == {r.request_id for r in new}
    (row,) = await all_rows(ledger, tenant, old_lo, old_lo + DAY_MS, ())
    assert row.requests == 5  # the rollups outlive the raw records
    assert (today - timedelta(days=10)).isoformat() == old_day


async def test_a_compaction_beside_flushes_of_its_day_counts_each_record_once(
        postgres_url: str, tmp_path: Path) -> None:
    """Two replicas flush records of the day a third compacts, at the same moment, five
    times over: each flush is either in the hourly rows the compaction sums or adds its
    records to the daily rows itself (the boundary's lock orders them), never neither or
    both: the daily rollups equal the records after every round."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    writers = [PostgresLedger(postgres_url, spool_dir=tmp_path / f"w{i}", migrate=True)
               for i in range(2)]
    compactor = PostgresLedger(postgres_url, spool_dir=tmp_path / "c", migrate=True)
    for ledger in (*writers, compactor):
        await ledger.start()
    today = time.time_ns() // 1_000_000 // DAY_MS * DAY_MS
    yesterday = today - DAY_MS
    written: list[UsageRecord] = []

    async def write(ledger: PostgresLedger) -> None:
        for _ in range(30):
            batch = [record(tenant, ts_ms=yesterday + random.randrange(DAY_MS),
                            output=random.randrange(100)) for _ in range(5)]
            written.extend(batch)
            for r in batch:
                ledger.write_nowait(r)
            await ledger.flush()

    async def compact() -> None:  # (the replicas' own maintenance may compact it first)
        await asyncio.sleep(random.uniform(0.0, 0.05))
        await compactor.compact(today + GRACE_MS)

    try:
        for _ in range(5):
            await compactor._run("execute", "UPDATE usage_rollup_state "
                                 "SET daily_through_ms = $1", yesterday)
            await asyncio.gather(*(write(w) for w in writers), compact())
            assert await compactor._fetch(f"SELECT {THROUGH}", []) == [(today,)]
            day = date.fromisoformat(written[0].day)
            assert await compactor.drift(tenant, day) == []
            await assert_reads_match(compactor, tenant, written, ((), ("day", "model")))
    finally:
        for ledger in (*writers, compactor):
            await ledger.close()
