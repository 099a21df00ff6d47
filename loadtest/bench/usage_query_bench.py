"""A tenant-month usage query at 10 million records, through the gateway's read path.

``python -m loadtest.bench.usage_query_bench`` starts its own PostgreSQL (``pgserver``), applies
the gateway's migrations (``PostgresLedger.migrate``, what ``gateway db migrate`` runs), and
loads a month (November 2026) of ``--records`` records (10,000,000) spread evenly in time over
``--tenants`` x ``--keys`` x ``--models`` x 2 classes x ``--versions`` groups (200 x 20 x 5 x
2 x 3 = 120,000), the groups in a scrambled order (a multiplicative stride), token counts
varied per record.

**How the data is made (not through the write path, which ``ledger_bench`` measures):** the
records by ``INSERT ... SELECT ... FROM generate_series`` straight into each day's partition;
then ``usage_hourly`` from those records with migration 2's back-fill (one ``GROUP BY``
over the records: what the write path would have left), and ``usage_daily`` the way a
gateway makes it: the boundary set to the month's first day, then ``PostgresLedger.compact``
sums each closed day's hourly rows (``gateway/ledger/sql/compact.py``; its time a day is
reported). ``--check`` runs ``drift`` on a few tenant-days to show the rollups agree with the
records; then ``VACUUM ANALYZE``.

**The query** is the gateway's own: ``PostgresLedger.usage_rows(tenant, Nov 1, Dec 1,
group_by=("day", "model"))`` (what ``/v1/usage?from=2026-11-01&to=2026-12-01&group_by=day,
model`` asks), which reads ``usage_daily`` (whole days, no hour dimension). Beside it, in the
same run and alternating query by query, the same answer from ``usage_hourly``: the same call
with ``to`` one millisecond before midnight (the hours starting in the range are the same, but
the range is no longer whole days, so the hourly rollups answer); each pair's rows are checked
equal. Every tenant once (a random order), then ``--random`` tenants drawn at random; p50, p95,
p99 of each. ``--raw N``: the same sums from the raw records for N tenants (what a ledger
without rollups would do). Bytes on disk per record (heap, TOAST and indexes of the partitions,
of each rollup table) after ``VACUUM ANALYZE``. Prints a markdown table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from gateway.ledger.sql.compact import GRACE_MS
from gateway.ledger.sql.migrations import MIGRATIONS
from gateway.ledger.sql.postgres import PostgresLedger, partition_name
from gateway.ledger.sql.schema import RECORD_COLUMNS, quoted
from loadtest.bench.pgserver import PostgresServer

__all__ = ["load", "main", "measure"]

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "usage-query-bench.json"
MONTH = date(2026, 11, 1)
_DAY_MS = 86_400_000
_GROUP_BY = ("day", "model")


def _ms(day: date) -> int:
    return int(datetime.combine(day, datetime.min.time(), UTC).timestamp() * 1000)


def _backfill(version: int) -> str:
    """Migration ``version``'s back-fill statement (the ``INSERT ... SELECT`` after its
    ``CREATE TABLE``): the bench fills the rollups the way a migration would."""
    script = next(m for m in MIGRATIONS if m.version == version).postgresql
    return script[script.index("INSERT INTO"):]


def _records_sql(*, tenants: int, keys: int, models: int, versions: int) -> str:
    """One day partition's records: ``$1`` the first record number, ``$2`` how many, ``$3``
    the month's first ms, ``$4`` ms between records, ``$5`` the day, ``$6`` the stride."""
    groups = tenants * keys * models * 2 * versions
    return f"""
SELECT $5::date, 'r' || n, $3::bigint + n * $4::bigint,
       't' || lpad((g % {tenants})::text, 3, '0'), 'team' || (g % {tenants} % 10),
       'org' || (g % {tenants} % 3), 'k' || (g / {tenants} % {keys}),
       'model-' || (g / {tenants * keys} % {models}), 'llama-3-8b',
       CASE WHEN g / {tenants * keys * models} % 2 = 0 THEN 'interactive' ELSE 'batch' END,
       'chat', 'b' || (n % 4), 'v' || (g / {tenants * keys * models * 2} % {versions}),
       NULL, 1, 200, CASE WHEN n % 50 = 0 THEN 'failed' ELSE 'completed' END,
       (n % 40)::int, (n % 300)::int, 1 + (n % 120)::int, (n % 3)::int, (n % 64)::int,
       (n % 7)::int, 1 + (n % 400)::int, (n % 30)::int,
       ((n % 40) + (n % 300) + 1 + (n % 120) + (n % 3))::int, n % 10 = 0,
       40.0 + n % 100, 9.5, 250.0 + n % 1000,
       (n % 5000)::bigint, 0, 0, 0, 0, 0, 0, 0, 0, 'USD', 'chat'
FROM (SELECT n, (n * $6::bigint) % {groups} AS g
      FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS n) AS s
"""


async def load(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Migrate, then make the month's records and rollups; seconds per step."""
    spool = Path(tempfile.mkdtemp(prefix="uq-spool-"))
    ledger = PostgresLedger(url, spool_dir=spool, migrate=True)
    await ledger.migrate()
    days = [MONTH + timedelta(days=i) for i in range(30)]
    await ledger._make_partitions({(d - date(1970, 1, 1)).days for d in days})
    await ledger.close()
    groups = args.tenants * args.keys * args.models * 2 * args.versions
    stride = _stride(groups)
    spacing = 30 * _DAY_MS // args.records
    select = _records_sql(tenants=args.tenants, keys=args.keys, models=args.models,
                          versions=args.versions)
    # the columns the SELECT makes, up to ``api``; those added since take their defaults
    columns = quoted(RECORD_COLUMNS[:RECORD_COLUMNS.index("api") + 1])
    times: dict[str, float] = {}
    conn = await asyncpg.connect(url)
    try:
        t0 = time.perf_counter()
        start = _ms(MONTH)
        for i, day in enumerate(days):
            first = -(-(i * _DAY_MS) // spacing)  # the first record number of the day
            last = -(-((i + 1) * _DAY_MS) // spacing)
            last = min(last, args.records)
            if last > first:
                into = f"INSERT INTO {partition_name(day)} (day, {columns}) "
                await conn.execute(into + select, first, last - first, start, spacing, day,
                                   stride)
            print(f"[usage-query] {day}: {last:,} records", file=sys.stderr, flush=True)
        times["records_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await conn.execute(_backfill(2))
        times["hourly_s"] = time.perf_counter() - t0
        # the daily rollups as a gateway makes them: each closed day's hourly rows compacted
        # (``compact.py``), the boundary from the month's first day
        await conn.execute("VACUUM ANALYZE usage_hourly")
        await conn.execute("UPDATE usage_rollup_state SET daily_through_ms = $1, "
                           "tenants_through_ms = $1", start)
        t0 = time.perf_counter()
        ledger = PostgresLedger(url, spool_dir=spool)
        # ``open_last_day``: the month's last day is not compacted, as today is not in a
        # month still running; the maintenance ran at 23:59:59 of it, so its hours' tenant
        # rollups are made up to 23:00 (a compaction every minute, an hour closed a minute
        # after its end): a read across tenants sums a whole hour from the hourly rollups,
        # the most it ever does but for the minute or two after an hour ends
        open_last = bool(getattr(args, "open_last_day", False))
        now = _ms(days[-1]) + (_DAY_MS - 1 if open_last else _DAY_MS + GRACE_MS)
        try:
            compacted = await ledger.compact(now)
        finally:
            await ledger.close()
        assert compacted == len(days) - open_last, compacted
        times["daily_s"] = time.perf_counter() - t0
        times["daily_per_day_s"] = times["daily_s"] / len(days)
        t0 = time.perf_counter()
        await conn.execute("VACUUM ANALYZE")
        times["vacuum_s"] = time.perf_counter() - t0
    finally:
        await conn.close()
        shutil.rmtree(spool, ignore_errors=True)
    return times


def _stride(n: int) -> int:
    """A multiplier coprime with ``n`` near ``0.618 n``: consecutive records fall in groups
    far apart, and each group comes up once per ``n`` records."""
    import math

    stride = int(n * 0.6180339887) | 1
    while math.gcd(stride, n) != 1:
        stride += 2
    return stride


async def _bytes(conn: asyncpg.Connection) -> dict[str, Any]:
    parts = await conn.fetchrow("""
        SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0),
               coalesce(sum(pg_relation_size(c.oid)), 0)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'usage_records'""")
    records = int(await conn.fetchval("SELECT count(*) FROM usage_records"))
    out: dict[str, Any] = {"records": records, "records_bytes": int(parts[0]),
                           "records_heap_bytes": int(parts[1])}
    for table in ("usage_hourly", "usage_daily"):
        out[f"{table}_rows"] = int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
        out[f"{table}_bytes"] = int(await conn.fetchval(
            f"SELECT pg_total_relation_size('{table}')"))
    total = out["records_bytes"] + out["usage_hourly_bytes"] + out["usage_daily_bytes"]
    out["bytes_per_record"] = {
        "records_and_indexes": out["records_bytes"] / records,
        "of_which_heap": out["records_heap_bytes"] / records,
        "hourly": out["usage_hourly_bytes"] / records,
        "daily": out["usage_daily_bytes"] / records,
        "all": total / records,
    }
    return out


async def _timed(ledger: PostgresLedger, tenant: str, hi: int) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    page = await ledger.usage_rows(tenant, _ms(MONTH), hi, _GROUP_BY, limit=10_000)
    return (time.perf_counter() - t0) * 1000, page.rows


def _stats(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, round(p * (len(ms) - 1)))]

    return {"n": len(ms), "p50": statistics.median(ms), "p95": pct(0.95), "p99": pct(0.99),
            "mean": statistics.fmean(ms)}


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The queries: daily (the gateway's choice) and hourly, alternating, answers compared."""
    spool = Path(tempfile.mkdtemp(prefix="uq-spool-"))
    ledger = PostgresLedger(url, spool_dir=spool)
    await ledger.start()
    rng = random.Random(args.seed)
    month_end = _ms(date(2026, 12, 1))
    out: dict[str, Any] = {}
    try:
        tenants = await ledger.tenants()
        rows_per_tenant = len((await ledger.usage_rows(tenants[0], _ms(MONTH), month_end,
                                                       _GROUP_BY)).rows)
        for name, order in (("every tenant once", rng.sample(tenants, len(tenants))),
                            (f"{args.random} random", rng.choices(tenants, k=args.random))):
            times: dict[str, list[float]] = {"daily": [], "hourly": []}
            for i, tenant in enumerate(order):
                sides = [("daily", month_end), ("hourly", month_end - 1)]
                if i % 2:
                    sides.reverse()
                answers = {}
                for side, hi in sides:
                    ms, answers[side] = await _timed(ledger, tenant, hi)
                    times[side].append(ms)
                if answers["daily"] != answers["hourly"]:
                    raise AssertionError(f"daily and hourly rollups disagree for {tenant}")
            out[name] = {side: _stats(v) for side, v in times.items()}
            print(f"[usage-query] {name}: " + "  ".join(
                f"{side} p50 {s['p50']:.1f} p95 {s['p95']:.1f} ms"
                for side, s in out[name].items()), file=sys.stderr, flush=True)
        if args.raw:
            out[f"raw records, {args.raw} tenants"] = {"raw": _stats(
                [await _raw(url, t) for t in rng.sample(tenants, args.raw)])}
        if args.check:
            for tenant in rng.sample(tenants, 3):
                day = MONTH + timedelta(days=rng.randrange(30))
                if await ledger.drift(tenant, day):
                    raise AssertionError(f"drift in {tenant} {day}")
        conn = await asyncpg.connect(url)
        try:
            out["bytes"] = await _bytes(conn)
            out["explain_daily"] = [r[0] for r in await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) SELECT day_ms, model, sum(output) FROM usage_daily "
                "WHERE tenant = $1 AND day_ms >= $2 AND day_ms < $3 GROUP BY 1, 2",
                tenants[0], _ms(MONTH), month_end)]
        finally:
            await conn.close()
        out["rows_per_answer"] = rows_per_tenant
        out["rollup_rows_per_tenant_month"] = {
            "hourly": out["bytes"]["usage_hourly_rows"] / len(tenants),
            "daily": out["bytes"]["usage_daily_rows"] / len(tenants)}
    finally:
        await ledger.close()
        shutil.rmtree(spool, ignore_errors=True)
    return out


async def _raw(url: str, tenant: str) -> float:
    """The tenant-month's (day, model) sums from the raw records, ms."""
    conn = await asyncpg.connect(url)
    try:
        t0 = time.perf_counter()
        await conn.fetch(
            "SELECT day, model, count(*), sum(output), sum(cost_micros) FROM usage_records "
            "WHERE tenant = $1 AND day >= $2 AND day < $3 GROUP BY 1, 2",
            tenant, MONTH, date(2026, 12, 1))
        return (time.perf_counter() - t0) * 1000
    finally:
        await conn.close()


def report(out: dict[str, Any]) -> str:
    lines = ["| query | rollups | n | p50 ms | p95 ms | p99 ms |", "|---|---|---:|---:|---:|---:|"]
    for name, sides in out["queries"].items():
        for side, s in sides.items():
            lines.append(f"| {name} | {side} | {s['n']} | {s['p50']:.1f} | {s['p95']:.1f} "
                         f"| {s['p99']:.1f} |")
    b = out["bytes"]
    per = b["bytes_per_record"]
    lines += ["", f"records {b['records']:,}; usage_hourly {b['usage_hourly_rows']:,} rows, "
              f"usage_daily {b['usage_daily_rows']:,} rows; bytes per record: records+indexes "
              f"{per['records_and_indexes']:.0f} (heap {per['of_which_heap']:.0f}), hourly "
              f"{per['hourly']:.0f}, daily {per['daily']:.0f}, all {per['all']:.0f}",
              f"load: {json.dumps(out['load'])}; load average {out['loadavg']}"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.usage_query_bench",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--keys", type=int, default=20, help="keys per tenant (20)")
    p.add_argument("--models", type=int, default=5)
    p.add_argument("--versions", type=int, default=3)
    p.add_argument("--random", type=int, default=1000, help="random tenants queried (1000)")
    p.add_argument("--raw", type=int, default=0, help="tenants summed from the raw records")
    p.add_argument("--check", action="store_true", help="drift on 3 random tenant-days")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--shared-buffers", default="128MB")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvloop

    uvloop.install()
    server = PostgresServer(settings={"shared_buffers": args.shared_buffers}).start()
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        out["loadavg_start"] = os.getloadavg()
        out["load"] = asyncio.run(load(server.url, args))
        queries = asyncio.run(measure(server.url, args))
        out["bytes"] = queries.pop("bytes")
        out["explain_daily"] = queries.pop("explain_daily")
        out["rows_per_answer"] = queries.pop("rows_per_answer")
        out["rollup_rows_per_tenant_month"] = queries.pop("rollup_rows_per_tenant_month")
        out["queries"] = queries
        out["loadavg"] = os.getloadavg()
    finally:
        server.close()
    print(report(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
