"""Reading the ledger of record (SQLite file and real PostgreSQL): the rollup query grouped by
every dimension equals a Python sum of the written records, pages walk every row once in
order, bad parameters are refused by name, export streams every record exactly (and
round-trips through CSV and JSON Lines), reconciliation finds a drift made by hand and none
otherwise, and a tenant's month is an index range of the rollups' primary key."""

from __future__ import annotations

import io
import sqlite3
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from gateway.ledger import LedgerSettings, UsageRecord, decode_record
from gateway.ledger.export import parse_csv, stream_csv, stream_jsonl
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.usage_query import (
    DIMENSIONS,
    UsageQuery,
    UsageQueryError,
    encode_cursor,
)
from tests.ledger.postgres import SQL_DIALECTS
from tests.ledger.usage_data import DAY, HOUR, JAN_15, expected_rows, row_dict, sample_records

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from gateway.ledger.sql.store import SqlLedger
    from tests.ledger.postgres import PostgresServer

TENANTS = ("acme", "globex", "Initech")
LO, HI = JAN_15, JAN_15 + 60 * DAY


class Db:
    """A started SQL ledger and a direct connection to its database (for hand edits)."""

    def __init__(self, ledger: SqlLedger, url: str) -> None:
        self.ledger = ledger
        self.url = url

    async def execute(self, sql: str) -> None:
        if isinstance(self.ledger, SqliteLedger):
            with sqlite3.connect(self.ledger.path) as conn:
                conn.execute(sql)
            return
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        if isinstance(self.ledger, SqliteLedger):
            with sqlite3.connect(self.ledger.path) as conn:
                return [tuple(r) for r in conn.execute(sql).fetchall()]
        conn = await asyncpg.connect(self.url)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()


@pytest.fixture(params=SQL_DIALECTS)
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    # records dated 2024: retention must not expire them under the test
    settings = LedgerSettings(retention_days=20_000)
    ledger: SqlLedger
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        # a generous write bound: these tests read what they wrote, and a batch slower than
        # the bound (its days' partitions made on a loaded box) would go to the spool
        ledger = PostgresLedger(url, spool_dir=tmp_path / "spool", settings=settings,
                                migrate=True, deadline=30.0)
    else:
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        ledger = SqliteLedger(tmp_path / "ledger.db", spool_dir=tmp_path / "spool",
                              settings=settings, deadline=30.0)
    await ledger.start()
    yield Db(ledger, url)
    await ledger.close()


async def _write(ledger: SqlLedger, records: Sequence[UsageRecord]) -> None:
    for r in records:
        ledger.write_nowait(r)
    await ledger.flush()
    assert ledger.stats.stored == len(records) and ledger.stats.spooled == 0


async def _walk(ledger: SqlLedger, tenant: str | None, lo: int, hi: int,
                group_by: Sequence[str], limit: int) -> list[dict[str, Any]]:
    """Every row, page by page, checking each page's has_more/next."""
    rows: list[dict[str, Any]] = []
    after = None
    for _ in range(10_000):
        page = await ledger.usage_rows(tenant, lo, hi, group_by, limit=limit, after=after)
        assert len(page.rows) <= limit
        rows += [row_dict(r, group_by) for r in page.rows]
        assert page.has_more == (page.next is not None)
        if not page.has_more:
            return rows
        assert len(page.rows) == limit
        after = page.next
    raise AssertionError("pagination did not end")


GROUPINGS: list[tuple[str, ...]] = [
    *((d,) for d in DIMENSIONS), (), ("month", "model"), ("day", "class", "key"),
    ("model", "hour"), ("key", "version", "batch", "team", "organization"),
    ("tenant", "month", "class"), ("organization", "team", "day", "model", "version"),
]


async def test_every_grouping_equals_the_sum_of_the_records(db: Db) -> None:
    """For one tenant and for all, in every grouping, page by page: the rows (values, order
    and every counter) are what summing the records in Python gives."""
    records = sample_records(900, TENANTS)
    await _write(db.ledger, records)
    for group_by in GROUPINGS:
        for tenant in ("acme", None):
            want = expected_rows(records, group_by, LO, HI, tenant)
            got = await _walk(db.ledger, tenant, LO, HI, group_by, limit=7)
            assert got == want, (group_by, tenant)
    assert sum(r["requests"] for r in expected_rows(records, (), LO, HI, "acme")) == \
        sum(1 for r in records if r.tenant == "acme") > 100


async def test_the_range_is_half_open_by_hour(db: Db) -> None:
    """Hours whose start is in [lo, hi) count: a record in the hour before lo or at hi does
    not, one in the last millisecond of the last hour does."""
    lo = JAN_15 + 10 * HOUR
    hi = lo + 5 * HOUR
    stamps = [lo - 1, lo, lo + 1, hi - 1, hi, hi + HOUR]
    records = [UsageRecord(request_id=f"r{i}", ts_ms=t, tenant="acme", model="m",
                           request_class="interactive", output=1 + i)
               for i, t in enumerate(stamps)]
    await _write(db.ledger, records)
    page = await db.ledger.usage_rows("acme", lo, hi, ("hour",))
    assert [(r.hour, r.requests, r.output) for r in page.rows] == [
        ("2024-01-15T10:00:00Z", 2, 2 + 3), ("2024-01-15T14:00:00Z", 1, 4)]
    assert [row_dict(r, ("hour",)) for r in page.rows] == expected_rows(
        records, ("hour",), lo, hi, "acme")


async def test_months_split_at_utc_month_starts(db: Db) -> None:
    feb = JAN_15 + 17 * DAY  # 2024-02-01T00:00Z
    records = [UsageRecord(request_id=f"r{i}", ts_ms=t, tenant="acme", model="m",
                           request_class="interactive")
               for i, t in enumerate([feb - 1, feb, feb + 29 * DAY - 1, feb + 29 * DAY])]
    await _write(db.ledger, records)
    page = await db.ledger.usage_rows("acme", LO, HI, ("month",))
    assert [(r.month, r.requests) for r in page.rows] == [
        ("2024-01", 1), ("2024-02", 2), ("2024-03", 1)]


@pytest.mark.parametrize("limit", [1, 2, 5, 10_000])
async def test_pages_walk_every_row_once_in_order(db: Db, limit: int) -> None:
    records = sample_records(400, TENANTS, seed=11)
    await _write(db.ledger, records)
    for group_by in (("day", "model"), ("model", "day"), ("tenant", "key")):
        want = expected_rows(records, group_by, LO, HI, None)
        got = await _walk(db.ledger, None, LO, HI, group_by, limit)
        assert got == want
        assert len({tuple(r[f] for f in list(r)[: len(group_by)]) for r in got}) == len(got)


async def test_a_tenant_sees_only_its_own_rows(db: Db) -> None:
    """The tenant condition is the caller's: grouping by tenant, or a cursor made from
    another tenant's rows, never reaches another tenant."""
    records = sample_records(300, TENANTS, seed=3)
    await _write(db.ledger, records)
    page = await db.ledger.usage_rows("acme", LO, HI, ("tenant",))
    assert [r.tenant for r in page.rows] == ["acme"]
    assert page.rows[0].requests == sum(1 for r in records if r.tenant == "acme")
    for other in ("Initech", "globex", "", "zzz"):
        forged = encode_cursor(("tenant",), [other])
        rest = await db.ledger.usage_rows("acme", LO, HI, ("tenant",), after=forged)
        assert {r.tenant for r in rest.rows} <= {"acme"}
    everyone = await db.ledger.usage_rows(None, LO, HI, ("tenant",))
    assert [r.tenant for r in everyone.rows] == sorted(TENANTS)  # "Initech" < "acme"


async def test_bad_parameters_are_refused_by_name(db: Db) -> None:
    await _write(db.ledger, sample_records(20, TENANTS))
    ok = await db.ledger.usage_rows("acme", LO, HI, ("day", "model"), limit=1)
    assert ok.next is not None
    bad: list[tuple[dict[str, Any], str]] = [
        ({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"),
        ({"after": "!!not base64!!"}, "after"), ({"after": "e30"}, "after"),  # "{}"
        ({"after": ok.next, "group_by": ("model", "day")}, "after"),
        ({"after": encode_cursor(("day", "model"), ["x", "y"])}, "after"),
        ({"after": encode_cursor(("day", "model"), [1, "a\x00b"])}, "after"),
        ({"after": encode_cursor(("day", "model"), [1])}, "after"),
        ({"after": "x" * 20_000}, "after"),
        ({"group_by": ("day", "weekday")}, "group_by"),
        ({"group_by": ("day", "day")}, "group_by"),
        ({"hi": LO}, "to"), ({"hi": LO + 401 * DAY}, "to"),
        ({"tenant": "ac\x00me"}, "tenant"), ({"tenant": "\udc80"}, "tenant"),
    ]
    for change, param in bad:
        args: dict[str, Any] = {"tenant": "acme", "lo": LO, "hi": HI,
                                "group_by": ("day", "model"), **change}
        with pytest.raises(UsageQueryError) as caught:
            await db.ledger.usage_rows(args.pop("tenant"), args.pop("lo"), args.pop("hi"),
                                       args.pop("group_by"), **args)
        assert caught.value.param == param, change
    # text of any script is a valid cursor value: the database compares it, never fails
    odd = encode_cursor(("day", "model"), [LO, "ü\U0001f600'\"; DROP TABLE x"])
    await db.ledger.usage_rows("acme", LO, HI, ("day", "model"), after=odd)


async def test_export_streams_every_record_in_chunks(db: Db) -> None:
    """Chunks of 3 (ending inside runs of equal timestamps): every record in the range once,
    exactly as written, ordered by tenant, time and request id."""
    records = sample_records(500, TENANTS, seed=5)
    await _write(db.ledger, records)
    want = sorted(records, key=lambda r: (r.tenant, r.ts_ms, r.request_id))
    got = [r async for r in db.ledger.export(0, 2**62, chunk=3)]
    assert got == want
    lo, hi = JAN_15 + 7 * DAY, JAN_15 + 20 * DAY + 5
    got = [r async for r in db.ledger.export(lo, hi, "globex", chunk=4)]
    assert got == [r for r in want if r.tenant == "globex" and lo <= r.ts_ms < hi]


async def test_csv_and_jsonl_round_trip_records_exactly(db: Db) -> None:
    records = sample_records(300, TENANTS, seed=9)
    await _write(db.ledger, records)
    want = sorted(records, key=lambda r: (r.tenant, r.ts_ms, r.request_id))
    text = "".join([c async for c in stream_csv(db.ledger.export(0, 2**62, chunk=50),
                                                chunk=40)])
    assert list(parse_csv(io.StringIO(text))) == want
    lines = "".join([c async for c in stream_jsonl(db.ledger.export(0, 2**62, chunk=50))])
    assert [decode_record(line) for line in lines.splitlines()] == want


async def test_reconcile_finds_a_hand_made_drift_and_nothing_else(db: Db) -> None:
    records = sample_records(400, ("acme", "globex"), seed=13)
    await _write(db.ledger, records)
    days = sorted({date.fromisoformat(r.day) for r in records})
    for tenant in ("acme", "globex"):
        for day in days:
            assert await db.ledger.drift(tenant, day) == [], (tenant, day)
    victim = next(r for r in records if r.tenant == "acme" and r.output > 0)
    hour = victim.ts_ms - victim.ts_ms % HOUR
    where = (f"tenant = 'acme' AND hour_ms = {hour} AND model = '{victim.model}' "
             f"AND request_class = '{victim.request_class}' AND key_id = "
             f"'{victim.key_id or ''}' AND version = '{victim.version or ''}' AND batch_id = "
             f"'{victim.batch_id or ''}' AND team = '{victim.team or ''}' AND organization = "
             f"'{victim.organization or ''}'")
    (before,) = await db.fetch(f"SELECT output FROM usage_hourly WHERE {where}")
    await db.execute(f"UPDATE usage_hourly SET output = output + 7 WHERE {where}")
    day = date.fromisoformat(victim.day)
    (drift,) = await db.ledger.drift("acme", day)
    assert (drift.tenant, drift.counter, drift.rollup, drift.records) == (
        "acme", "output", before[0] + 7, before[0])
    assert (drift.model, drift.key_id, drift.version) == (
        victim.model, victim.key_id or "", victim.version or "")
    assert drift.hour == time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(hour / 1000))
    assert "output rollup=" in drift.describe()
    assert await db.ledger.drift("globex", day) == []
    # a rollup row gone: each of its non-zero counters drifts to 0
    await db.execute(f"DELETE FROM usage_hourly WHERE {where}")
    gone = await db.ledger.drift("acme", day)
    assert {d.counter for d in gone} >= {"requests", "output"}
    assert all(d.rollup == 0 and d.records > 0 for d in gone)
    # a rollup row with no records behind it
    other = day + timedelta(days=1)
    other_ms = int(datetime.combine(other, datetime.min.time(), UTC).timestamp() * 1000)
    await db.execute("INSERT INTO usage_hourly (hour_ms, tenant, model, request_class, "
                     f"requests) VALUES ({other_ms + 3 * HOUR}, 'acme', 'ghost', 'x', 2)")
    (ghost,) = [d for d in await db.ledger.drift("acme", other) if d.model == "ghost"]
    assert (ghost.counter, ghost.rollup, ghost.records) == ("requests", 2, 0)


@pytest.mark.parametrize(("table", "time_column", "end"), [
    ("usage_daily", "day_ms", 0),  # whole days: the daily rollups
    ("usage_hourly", "hour_ms", -1),  # one ms short of midnight: the hourly ones
])
async def test_a_tenant_month_is_an_index_range_of_the_rollups(
        db: Db, table: str, time_column: str, end: int) -> None:
    """The statement of a tenant's month reads one rollup table through its primary key with
    the tenant and the time range as the index condition, among 200 tenants' rollups: whole
    UTC days grouped by day read ``usage_daily``, any other range ``usage_hourly``; both
    give the same rows."""
    month_lo = JAN_15 + 17 * DAY
    month_hi = month_lo + 29 * DAY + end
    hourly = ("INSERT INTO usage_hourly (hour_ms, tenant, model, request_class, requests) "
              f"SELECT {JAN_15} + (i % 1500) * {HOUR}, 't' || (i / 1500), 'm', 'c', 1 FROM ")
    daily = ("INSERT INTO usage_daily (day_ms, tenant, model, request_class, requests) "
             f"SELECT {JAN_15} + (i % 62) * {DAY}, 't' || (i / 62), 'm', 'c', 24 FROM ")
    if isinstance(db.ledger, SqliteLedger):
        numbers = ("(WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
                   "WHERE i < {}) SELECT i FROM n)")
        await db.execute(hourly + numbers.format(59999))
        await db.execute(daily + numbers.format(62 * 200 - 1))
        await db.execute("ANALYZE")
    else:
        await db.execute(hourly + "generate_series(0::bigint, 59999) AS i")
        await db.execute(daily + f"generate_series(0::bigint, {62 * 200 - 1}) AS i")
        await db.execute("ANALYZE usage_hourly")
        await db.execute("ANALYZE usage_daily")
    query = UsageQuery.build(db.ledger.dialect, "t7", month_lo, month_hi, ("day", "model"))
    sql = query.sql
    if isinstance(db.ledger, SqliteLedger):
        with sqlite3.connect(db.ledger.path) as conn:
            plan = " ".join(str(r) for r in conn.execute("EXPLAIN QUERY PLAN " + sql,
                                                         query.params))
        assert f"SEARCH {table} USING INDEX sqlite_autoindex_{table}_1 " \
               f"(tenant=? AND {time_column}>? AND {time_column}<?)" in plan, plan
    else:
        conn = await asyncpg.connect(db.url)
        try:
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *query.params))
        finally:
            await conn.close()
        assert f"{table}_pkey" in plan and "Seq Scan" not in plan, plan
        assert "tenant = " in plan and f"{time_column} >= " in plan, plan
    page = await db.ledger.usage_rows("t7", month_lo, month_hi, ("day", "model"))
    assert [r.requests for r in page.rows] == [24] * 29


async def test_order_is_by_code_point_in_a_database_with_a_locale_collation(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    """A PostgreSQL database whose default collation follows a locale (ICU en-US: "alpha"
    before "Zeta") still answers rows, pages and exports in code-point order, the order
    SQLite and Python use, so a cursor means the same thing everywhere."""
    name = "usage_icu"
    postgres_server.psql(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu "
                         "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    try:
        url = postgres_server.url_for(name)
        conn = await asyncpg.connect(url)
        try:  # the database really does sort by locale
            assert await conn.fetchval("SELECT 'Zeta' < 'alpha'") is False
        finally:
            await conn.close()
        ledger = PostgresLedger(url, spool_dir=tmp_path / "spool", migrate=True,
                                settings=LedgerSettings(retention_days=20_000))
        await ledger.start()
        try:
            records = sample_records(300, TENANTS, seed=17)
            await _write(ledger, records)
            for group_by in (("model",), ("tenant", "key"), ("key", "day")):
                want = expected_rows(records, group_by, LO, HI, None)
                assert await _walk(ledger, None, LO, HI, group_by, limit=3) == want
            want_records = sorted(records, key=lambda r: (r.tenant, r.ts_ms, r.request_id))
            assert [r async for r in ledger.export(0, 2**62, chunk=5)] == want_records
        finally:
            await ledger.close()
    finally:
        postgres_server.drop_database(name)
