"""asyncpg or psycopg 3 for the ledger's write path: records/s and event-loop time per record.

``python -m loadtest.bench.ledger_drivers`` starts its own PostgreSQL (``pgserver``: a temporary
cluster on a free loopback port, ``fsync`` and ``synchronous_commit`` on, as the ledger runs it),
applies the gateway's migrations (``PostgresLedger.migrate``, what ``gateway db migrate`` does:
``usage_records`` partitioned by day, keyed ``(day, request_id)``, 40 columns; ``usage_hourly``),
and for each batch size writes batches of fresh records, one batch at a time on one connection
(as the ledger's flusher does), for ``--seconds`` of write time per case, with each method:

* ``executemany``: a one-row ``INSERT ... ON CONFLICT DO NOTHING`` for every record, pipelined
  (asyncpg: Bind/Execute per row, one Sync, atomic; psycopg: pipeline mode, in a transaction
  pipelined with it), binary parameters for both;
* asyncpg ``values``: one multi-row ``INSERT ... VALUES (...), (...) ON CONFLICT DO NOTHING``
  (PostgreSQL binds at most 32767 parameters: with 40 columns 819 rows, so 1024 is two
  statements in a transaction);
* ``unnest``: ``INSERT ... SELECT * FROM unnest($1::date[], $2::text[], ...) ON CONFLICT DO
  NOTHING``: one statement, one array a column (psycopg: binary parameters, which took about a
  third less loop CPU than text ones here);
* ``copy``: asyncpg ``copy_records_to_table`` / psycopg ``cursor.copy`` (``FORMAT BINARY``,
  ``write_row``) straight into the table. **COPY has no ON CONFLICT**: one record already there
  (a replayed spool, a retried flush) aborts the whole batch with a unique violation (the
  ``resend`` column), so the ledger cannot use it as is;
* ``copy+stage``: COPY into a temporary table (``ON COMMIT DELETE ROWS``), then ``INSERT INTO
  usage_records SELECT * FROM stage ON CONFLICT DO NOTHING``, in one transaction: COPY made
  idempotent;

and the ones that write the hourly rollups too, i.e. the whole flush:

* asyncpg ``store``: ``PostgresLedger._insert``, the ledger's own flush (one ``unnest``
  statement: the records with ``ON CONFLICT DO NOTHING``, and the new ones summed into
  ``usage_hourly`` in the same statement); psycopg ``store``: that same statement sent by psycopg
  (binary parameters);
* ``stage+rollup``: COPY into the temporary table, then the store's statement reading the stage
  instead of the arrays, in one transaction;
* ``json+rollup`` (and asyncpg ``json``, records only): the batch as one parameter, the records
  encoded by msgspec as the spool already encodes them, read by ``json_to_recordset`` on the
  server, then the store's statement unchanged from there: one statement, one round trip.

The plain methods write ``usage_records`` only (the driver's part); ``store``, ``stage+rollup``
and ``json+rollup`` are what a whole flush costs, rollups included.

Per case: **records/s** over the writes (building the rows from the records, the driver's call,
the commit; making the records is not timed); **loop us/rec**, the event-loop thread's CPU time
inside those writes per record (``time.thread_time``: what a flush takes from the loop that
serves requests); **pg us/rec**, the PostgreSQL backend's CPU per record (``/proc``); batch
latency p50/p99; **blocked max**, the longest stretch a write kept the loop from anything else
(the loop thread's CPU between two ticks of a 1 ms ``call_later`` probe); **late p99/max**, the
probe's lateness (wall clock, so it also shows the box's other load); and **resend**: a stored
batch sent again is a no-op, or the error it raised. The probe runs beside every other batch
only (a tick costs tens of us of CPU here, which would swamp the writes' CPU): rate, CPU and
latency come from the batches without it, blocked and late from the batches with it.

Results
-------
All runs 2026-12-01: PostgreSQL 15.20, asyncpg 0.32.0, psycopg 3.3.9 (binary, libpq 18),
uvloop, Python 3.11, 2 cores **shared with other sessions' test runs: load average 3-8 through
every run** (no quiet window came in 45 minutes of waiting). Wall-clock figures (rec/s,
latencies, lateness) are therefore low and noisy: one case's rec/s moved by up to 2.3x between
runs, with the load. The CPU figures hold better: the loop's within about 15-20% run to run,
the backend's within about 25% (it shares the cores with everything else). One full run, 10 s a
case (loop CPU and rec/s from the 5 s of batches without the probe), load 6.5 -> 4.8:

======================  ===============  ==========  ===========  =================  ======
method                  loop us/rec      pg us/rec   blocked ms   rec/s              resend
batch                   64 / 256 / 1024  256 / 1024  256 / 1024   64 / 256 / 1024
======================  ===============  ==========  ===========  =================  ======
asyncpg executemany      8.4   6.8  5.3  35.1  26.4   1.9   3.8    6.8k 13.0k 20.1k  no-op
asyncpg values          30.8  28.9 24.1  51.4  38.3   8.7  26.5    4.4k  6.3k 11.2k  no-op
asyncpg unnest          14.2  17.0 13.9  23.9  18.5   5.4  20.2    9.0k 14.3k 19.3k  no-op
asyncpg copy             5.5   4.2  3.9  14.7  12.3   2.0   5.4   13.3k 25.9k 41.6k  aborts
asyncpg copy+stage      10.4   5.9  3.9  22.8  15.6   1.8   6.4    6.0k 15.4k 32.9k  no-op
psycopg executemany     30.4  24.2 20.4  33.3  28.1   5.0   5.3    5.6k 10.3k 15.1k  no-op
psycopg unnest          20.9  14.1 11.2  21.0  16.3   5.1  17.1    6.1k 13.8k 21.0k  no-op
psycopg copy            14.2   5.2  3.5  11.9   9.6   1.5   2.2    6.2k 24.5k 40.3k  aborts
psycopg copy+stage      18.1   6.9  4.4  18.5  14.4   4.9   2.8    5.4k 16.1k 26.9k  no-op
asyncpg store           19.0  16.4 10.9  36.7  24.9   5.3  18.2    6.8k 10.5k 17.2k  no-op
psycopg store           25.4  15.5 11.8  36.1  26.3   5.0  49.5    5.4k 13.6k 14.5k  no-op
asyncpg stage+rollup    10.3   6.0  3.9  35.9  23.5   1.5   5.0    6.9k 14.4k 19.8k  no-op
psycopg stage+rollup    16.5   7.0  4.8  31.3  26.6   1.6   3.0    5.6k 16.8k 17.3k  no-op
asyncpg json             3.7   2.3  2.8  31.2  20.5   1.0   3.5   12.6k 18.3k 25.4k  no-op
asyncpg json+rollup      4.0   2.5  2.9  46.9  32.3   0.9   3.6   11.0k 12.8k 16.3k  no-op
psycopg json+rollup      9.5   3.1  1.7  37.3  29.9   1.0   2.3    8.1k 15.9k 17.2k  no-op
======================  ===============  ==========  ===========  =================  ======

The whole-flush methods, that run and two more of them alone (loop us/rec; blocked ms;
pg us/rec), at 256 | at 1024 records:

* asyncpg ``store``: 16.4 14.3 12.3; 5.3 4.8 4.8; 36.7 32.5 29.6 | 10.9 11.2 9.9;
  18.2 18.6 23.9; 24.9 26.6 23.3
* psycopg ``store``: 15.5 14.0 13.4; 5.0 5.9 4.7; 36.1 33.2 30.4 | 11.8 11.2 13.2;
  49.5 17.3 16.6; 26.3 25.4 26.4
* asyncpg ``json+rollup``: 2.5 2.3 1.9; 0.9 0.7 0.8; 46.9 49.3 38.5 | 2.9 2.6 2.4;
  3.6 4.1 3.4; 32.3 28.6 27.5
* psycopg ``json+rollup``: 3.1 3.0 2.7; 1.0 1.0 1.0; 37.3 35.5 30.7 | 1.7 1.6 1.7;
  2.3 2.1 2.3; 29.9 30.4 31.7
* asyncpg ``stage+rollup``: 6.0 5.4 4.3; 1.5 1.7 1.9; 35.9 30.6 27.3 | 3.9 4.1 3.4;
  5.0 5.5 4.4; 23.5 26.2 23.1

Their rec/s followed the box's load (9-26k at 256, 13-33k at 1024) more than the method: the
database (25-50 us of backend CPU a record with the rollups, on cores the other sessions also
used) bounds a flush here, not the driver. An earlier complete run (before the read-back check
and the non-ASCII team names) gave the same picture.

What it shows:

* **The driver is not what costs.** Sending the same statement, asyncpg and psycopg take the
  same loop CPU (the store's statement: 12-16 us a record at 256, 10-13 at 1024, both) and
  the same backend CPU. Where they differ, asyncpg is lighter: ``executemany`` 3.5-4x (6.8
  against 24.2 us/rec at 256), and at 64 records COPY 1.2x and 2.6x (the two full runs),
  COPY through a stage 1.3x and 1.7x, ``unnest`` 1.4-1.5x. At 1024 records they are close on
  everything but ``executemany``: psycopg's ``unnest`` was 20% lighter in one full run and
  equal in the other, its ``json+rollup`` 1 us/rec lighter in all three (1.7 against 2.6).
* **The statement's input is what costs.** 40 arrays (``unnest``: the store now) cost the loop
  10-17 us a record, and building and encoding them is one synchronous stretch: about 5 ms for
  256 records, 18-24 ms for 1024, during which the worker serves nothing. One JSON parameter
  (msgspec) costs 2-3 us a record and blocks about 1 ms (256) or 3.5 ms (1024); the backend
  spends about a quarter more CPU on it (8-52% across the six paired runs: it parses the
  JSON), at the same rec/s within the noise.
* **COPY is the cheapest way in and cannot be the ledger's as is:** no ``ON CONFLICT``, so one
  record already stored (a replayed spool, a retried flush) fails the whole COPY with a unique
  violation (``resend: aborts``). Through a temporary stage it is idempotent again, at 3.5-6
  us/rec with the rollups and the store's backend CPU, but it takes four round trips (BEGIN,
  COPY, the statement, COMMIT) where the others take one (invisible on loopback; with
  ``ledger_durability: commit`` a response's last bytes wait for that commit), and a temporary
  table on every connection (session state, which PgBouncer's transaction pooling drops).
* A multi-row ``VALUES`` is the worst on both sides (and at most 819 rows a statement).

**Recommendation: keep asyncpg** (as light as psycopg or lighter on every method here, within
the noise, but one large parameter; and already the dependency: psycopg is needed only by this
bench), **and have the flush send its records as one JSON parameter** (``json_to_recordset``)
instead of 40 arrays, keeping the rest of the store's statement (``ON CONFLICT DO NOTHING``, the
rollups from the new rows, one statement, one round trip): 4-7x less loop time per record and a
5-7x shorter loop stall per flush, for about a quarter more backend CPU. Every run here checks
that each method's records read back as sent, field for field (non-ASCII text, quotes,
backslashes and None included). If the database's CPU is the scarcer resource, COPY into a
per-connection stage (``stage+rollup``) keeps the backend's cost as now at 2-3x less loop time,
for three more round trips a flush and the temporary table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec
import psycopg

from gateway.ledger.record import UsageRecord
from gateway.ledger.sql import postgres as ledger_postgres
from gateway.ledger.sql.postgres import PostgresLedger, partition_name
from gateway.ledger.sql.schema import RECORD_COLUMNS, quoted, record_row
from loadtest.bench.pgserver import PostgresServer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

__all__ = ["METHODS", "CaseResult", "main", "run"]

TABLE = "usage_records"
#: PostgreSQL's limit on bind parameters in one statement
MAX_PARAMS = 32767
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_BATCHES = (64, 256, 1024)
_EPOCH = date(1970, 1, 1)
_DAY_MS = 86_400_000
#: the ledger's pool names its connections so
_LEDGER_APP = "llm-gateway-ledger"

# -- the records ---------------------------------------------------------------------------

_MODELS = ("chat-model", "code-model", "embed-model")
#: text that must arrive as sent whatever the encoding (JSON escapes, array quoting, COPY)
_TEAMS = ("team-a", None, 'équipe "b" \\ ☃, {c}')


def make_batch(n: int, seq: int) -> list[UsageRecord]:
    """``n`` fresh records (random 32-hex ids, as the gateway's), varied like real traffic:
    50 tenants, 200 keys, 3 models, 2 classes, so a batch touches many rollup rows."""
    now = time.time_ns() // 1_000_000
    return [
        UsageRecord(
            request_id=os.urandom(16).hex(), ts_ms=now, tenant=f"tenant-{(seq + i) % 50}",
            team=_TEAMS[i % 3], key_id=f"key-{(seq + i) % 200}",
            model=_MODELS[i % 3], upstream_model="llama-3-8b",
            request_class=("interactive", "batch")[i % 4 == 0], pool="chat", backend="b1",
            attempts=1, status=200, system=120, history=800 + i % 100, new=40 + i % 7,
            cached=512, output=200 + i % 50, reasoning=i % 30, prompt_total=960 + i % 107,
            estimated=i % 10 == 0, ttft_ms=120.5, tpot_ms=15.25, duration_ms=3100.0,
            cost_micros=1234 + i % 10, cost_history=800, cost_new=100, cost_output=334 + i % 10,
        )
        for i in range(n)
    ]


class Rows:
    """Records -> ``usage_records`` rows: ``day`` as a ``date``, then ``record_row`` (the
    store's own conversion). Every method does this (or the store's equivalent) in its timed
    write."""

    def __init__(self) -> None:
        self._days: dict[int, date] = {}

    def __call__(self, batch: Sequence[UsageRecord]) -> list[tuple[Any, ...]]:
        days = self._days
        out = []
        for r in batch:
            n = r.ts_ms // _DAY_MS
            d = days.get(n)
            if d is None:
                d = days.setdefault(n, _EPOCH + timedelta(days=n))
            out.append((d, *record_row(r)))
        return out


# -- the methods ---------------------------------------------------------------------------


@dataclass(slots=True)
class Writer:
    """One method, connected: ``write(batch)`` stores a batch (one transaction)."""

    write: Callable[[Sequence[UsageRecord]], Awaitable[Any]]
    #: the PostgreSQL backend serving it (its CPU is measured)
    backend_pid: int
    close: Callable[[], Awaitable[Any]]
    #: records written while connecting
    preloaded: int = 0


@dataclass(slots=True)
class Setup:
    url: str
    #: ``usage_records`` columns and their SQL types, table order (``day`` first)
    columns: list[tuple[str, str]]

    @property
    def names(self) -> list[str]:
        return [c for c, _ in self.columns]

    @property
    def quoted(self) -> str:
        return ", ".join(f'"{c}"' for c, _ in self.columns)


@dataclass(slots=True)
class Method:
    driver: str
    name: str
    make: Callable[[Setup], Awaitable[Writer]]
    #: writes the rollups too (the ledger's whole flush)
    rollups: bool = False


def _insert_one(setup: Setup, mark: Callable[[int], str]) -> str:
    marks = ", ".join(mark(i) for i in range(1, len(setup.columns) + 1))
    return f"INSERT INTO {TABLE} ({setup.quoted}) VALUES ({marks}) ON CONFLICT DO NOTHING"


def _unnest(setup: Setup, mark: Callable[[int], str]) -> str:
    arrays = ", ".join(f"{mark(i)}::{t}[]" for i, (_, t) in enumerate(setup.columns, 1))
    return (f"INSERT INTO {TABLE} ({setup.quoted}) SELECT * FROM unnest({arrays}) "
            "ON CONFLICT DO NOTHING")


_STAGE = f"CREATE TEMP TABLE stage (LIKE {TABLE} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
_FROM_STAGE = f"INSERT INTO {TABLE} SELECT * FROM stage ON CONFLICT DO NOTHING"


def _store_with_input(source: str) -> str:
    """The store's flush statement with another ``input`` (``day_n`` and the record columns)
    than its arrays: the rest (the insert, the rollups, the count) is the store's own."""
    sql = ledger_postgres._INSERT
    head, sep, rest = sql.partition("WITH input AS (")
    _, sep2, tail = rest.partition("), new AS (")
    if not (sep and sep2):
        raise RuntimeError("the store's insert statement changed shape; update this bench")
    return f"{head}WITH input AS ({source}), new AS ({tail}"


def _store_from_stage() -> str:
    return _store_with_input(
        f"SELECT day - DATE '1970-01-01' AS day_n, {quoted(RECORD_COLUMNS)} FROM stage")


def _to_psycopg(sql: str) -> str:
    """``$1, $2, ...`` (in order) -> psycopg's binary placeholders (a literal ``%``, as in
    ``ts_ms % 3600000``, doubled)."""
    numbers = [int(n) for n in re.findall(r"\$(\d+)", sql)]
    if numbers != list(range(1, len(numbers) + 1)):
        raise RuntimeError("parameters out of order; cannot convert to psycopg placeholders")
    return re.sub(r"\$\d+", "%b", sql.replace("%", "%%"))


def _store_arrays(batch: Sequence[UsageRecord]) -> list[Any]:
    """What ``PostgresLedger._insert`` sends: day numbers, then one array a column."""
    rows = [record_row(r) for r in batch]
    return [[r.ts_ms // _DAY_MS for r in batch], *zip(*rows, strict=True)]


async def _asyncpg(setup: Setup) -> asyncpg.Connection:
    return await asyncpg.connect(setup.url)


async def _psycopg(setup: Setup) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(setup.url, autocommit=True)


async def pg_executemany(setup: Setup) -> Writer:
    conn, rows = await _asyncpg(setup), Rows()
    sql = _insert_one(setup, lambda i: f"${i}")

    async def write(batch: Sequence[UsageRecord]) -> None:
        await conn.executemany(sql, rows(batch))  # atomic: one implicit transaction

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_values(setup: Setup) -> Writer:
    conn, rows = await _asyncpg(setup), Rows()
    width = len(setup.columns)
    per_statement = MAX_PARAMS // width
    head = f"INSERT INTO {TABLE} ({setup.quoted}) VALUES "
    statements: dict[int, str] = {}

    def sql(n: int) -> str:
        text = statements.get(n)
        if text is None:
            groups = (", ".join(f"${r * width + c + 1}" for c in range(width))
                      for r in range(n))
            text = head + ", ".join(f"({g})" for g in groups) + " ON CONFLICT DO NOTHING"
            statements[n] = text
        return text

    async def write(batch: Sequence[UsageRecord]) -> None:
        all_rows = rows(batch)
        async with conn.transaction():
            for i in range(0, len(all_rows), per_statement):
                chunk = all_rows[i : i + per_statement]
                await conn.execute(sql(len(chunk)), *[v for row in chunk for v in row])

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_unnest(setup: Setup) -> Writer:
    conn, rows = await _asyncpg(setup), Rows()
    sql = _unnest(setup, lambda i: f"${i}")

    async def write(batch: Sequence[UsageRecord]) -> None:
        await conn.execute(sql, *zip(*rows(batch), strict=True))

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_copy(setup: Setup) -> Writer:
    conn, rows, names = await _asyncpg(setup), Rows(), setup.names

    async def write(batch: Sequence[UsageRecord]) -> None:
        await conn.copy_records_to_table(TABLE, records=rows(batch), columns=names)

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_copy_stage(setup: Setup) -> Writer:
    conn, rows, names = await _asyncpg(setup), Rows(), setup.names
    await conn.execute(_STAGE)

    async def write(batch: Sequence[UsageRecord]) -> None:
        async with conn.transaction():
            await conn.copy_records_to_table("stage", records=rows(batch), columns=names)
            await conn.execute(_FROM_STAGE)

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_store(setup: Setup) -> Writer:
    """The ledger itself: its pool (one connection) and its flush statement."""
    spool = tempfile.mkdtemp(prefix="ledger-drivers-spool-")
    ledger = PostgresLedger(setup.url, spool_dir=spool, pool_size=1)
    await ledger.start()
    await ledger._insert(make_batch(1, 0))  # opens the pool's connection
    admin = await _asyncpg(setup)
    try:
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", _LEDGER_APP)
    finally:
        await admin.close()

    async def close() -> None:
        await ledger.close()
        shutil.rmtree(spool, ignore_errors=True)

    return Writer(ledger._insert, int(pid), close, preloaded=1)


async def pg_stage_rollup(setup: Setup) -> Writer:
    conn, rows, names = await _asyncpg(setup), Rows(), setup.names
    await conn.execute(_STAGE)
    sql = _store_from_stage()

    async def write(batch: Sequence[UsageRecord]) -> int:
        async with conn.transaction():
            await conn.copy_records_to_table("stage", records=rows(batch), columns=names)
            return int(await conn.fetchval(sql))

    return Writer(write, conn.get_server_pid(), conn.close)


async def ps_executemany(setup: Setup) -> Writer:
    conn, rows = await _psycopg(setup), Rows()
    sql = _insert_one(setup, lambda i: "%b")

    async def write(batch: Sequence[UsageRecord]) -> None:
        # BEGIN, the inserts and COMMIT in one pipeline: one round trip, one transaction
        async with conn.pipeline(), conn.transaction(), conn.cursor() as cur:
            await cur.executemany(sql, rows(batch))

    return Writer(write, conn.info.backend_pid, conn.close)


async def ps_unnest(setup: Setup) -> Writer:
    conn, rows = await _psycopg(setup), Rows()
    sql = _unnest(setup, lambda i: "%b")

    async def write(batch: Sequence[UsageRecord]) -> None:
        arrays = [list(a) for a in zip(*rows(batch), strict=True)]
        await conn.execute(sql, arrays, prepare=True)

    return Writer(write, conn.info.backend_pid, conn.close)


async def _ps_copy_rows(
    cur: psycopg.AsyncCursor[Any], table: str, setup: Setup, all_rows: list[tuple[Any, ...]]
) -> None:
    async with cur.copy(f"COPY {table} ({setup.quoted}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types([t for _, t in setup.columns])
        for row in all_rows:
            await copy.write_row(row)


async def ps_copy(setup: Setup) -> Writer:
    conn, rows = await _psycopg(setup), Rows()

    async def write(batch: Sequence[UsageRecord]) -> None:
        async with conn.cursor() as cur:
            await _ps_copy_rows(cur, TABLE, setup, rows(batch))

    return Writer(write, conn.info.backend_pid, conn.close)


async def ps_copy_stage(setup: Setup) -> Writer:
    conn, rows = await _psycopg(setup), Rows()
    await conn.execute(_STAGE)

    async def write(batch: Sequence[UsageRecord]) -> None:
        async with conn.transaction(), conn.cursor() as cur:
            await _ps_copy_rows(cur, "stage", setup, rows(batch))
            await cur.execute(_FROM_STAGE)

    return Writer(write, conn.info.backend_pid, conn.close)


async def ps_store(setup: Setup) -> Writer:
    """The ledger's flush statement, its arrays sent by psycopg."""
    conn = await _psycopg(setup)
    sql = _to_psycopg(ledger_postgres._INSERT)

    async def write(batch: Sequence[UsageRecord]) -> int:
        arrays = [list(a) for a in _store_arrays(batch)]
        cur = await conn.execute(sql, arrays, prepare=True)
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    return Writer(write, conn.info.backend_pid, conn.close)


async def ps_stage_rollup(setup: Setup) -> Writer:
    conn, rows = await _psycopg(setup), Rows()
    await conn.execute(_STAGE)
    sql = _store_from_stage()

    async def write(batch: Sequence[UsageRecord]) -> int:
        async with conn.transaction(), conn.cursor() as cur:
            await _ps_copy_rows(cur, "stage", setup, rows(batch))
            await cur.execute(sql, prepare=True)
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    return Writer(write, conn.info.backend_pid, conn.close)


_json = msgspec.json.Encoder()


def _json_input(setup: Setup, mark: str) -> str:
    """The batch as one JSON array of records (msgspec's encoding, the spool's format), read
    by ``json_to_recordset`` on the server: ``day_n`` and the record columns."""
    defs = ", ".join(f'"{c}" {t}' for c, t in setup.columns[1:])
    return (f"SELECT (ts_ms / {_DAY_MS})::integer AS day_n, {quoted(RECORD_COLUMNS)} "
            f"FROM json_to_recordset(convert_from({mark}::bytea, 'UTF8')::json) AS t({defs})")


def _json_insert(setup: Setup, mark: str) -> str:
    return (f"WITH input AS ({_json_input(setup, mark)}) INSERT INTO {TABLE} ({setup.quoted}) "
            f"SELECT DATE '1970-01-01' + day_n, {quoted(RECORD_COLUMNS)} FROM input "
            "ON CONFLICT DO NOTHING")


def _store_from_json(setup: Setup, mark: str) -> str:
    """The store's flush statement with its input read from one JSON parameter."""
    return _store_with_input(_json_input(setup, mark))


async def pg_json(setup: Setup) -> Writer:
    conn = await _asyncpg(setup)
    sql = _json_insert(setup, "$1")

    async def write(batch: Sequence[UsageRecord]) -> None:
        await conn.execute(sql, _json.encode(batch))

    return Writer(write, conn.get_server_pid(), conn.close)


async def pg_json_rollup(setup: Setup) -> Writer:
    conn = await _asyncpg(setup)
    sql = _store_from_json(setup, "$1")

    async def write(batch: Sequence[UsageRecord]) -> int:
        return int(await conn.fetchval(sql, _json.encode(batch)))

    return Writer(write, conn.get_server_pid(), conn.close)


async def ps_json_rollup(setup: Setup) -> Writer:
    conn = await _psycopg(setup)
    sql = _store_from_json(setup, "%b").replace("%", "%%").replace("%%b", "%b")

    async def write(batch: Sequence[UsageRecord]) -> int:
        cur = await conn.execute(sql, [_json.encode(batch)], prepare=True)
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    return Writer(write, conn.info.backend_pid, conn.close)


METHODS: dict[str, Method] = {
    f"{m.driver}:{m.name}": m
    for m in (
        Method("asyncpg", "executemany", pg_executemany),
        Method("asyncpg", "values", pg_values),
        Method("asyncpg", "unnest", pg_unnest),
        Method("asyncpg", "copy", pg_copy),
        Method("asyncpg", "copy+stage", pg_copy_stage),
        Method("psycopg", "executemany", ps_executemany),
        Method("psycopg", "unnest", ps_unnest),
        Method("psycopg", "copy", ps_copy),
        Method("psycopg", "copy+stage", ps_copy_stage),
        Method("asyncpg", "store", pg_store, rollups=True),
        Method("psycopg", "store", ps_store, rollups=True),
        Method("asyncpg", "stage+rollup", pg_stage_rollup, rollups=True),
        Method("psycopg", "stage+rollup", ps_stage_rollup, rollups=True),
        Method("asyncpg", "json", pg_json),
        Method("asyncpg", "json+rollup", pg_json_rollup, rollups=True),
        Method("psycopg", "json+rollup", ps_json_rollup, rollups=True),
    )
}


# -- the schema ----------------------------------------------------------------------------


async def create_schema(url: str, today: date) -> list[tuple[str, str]]:
    """Migrate an empty database the gateway's way and make today's and tomorrow's partitions
    (a run may cross midnight UTC); returns ``usage_records``'s columns and types."""
    spool = tempfile.mkdtemp(prefix="ledger-drivers-spool-")
    try:
        ledger = PostgresLedger(url, spool_dir=spool, migrate=True)
        await ledger.start()
        await ledger.close()
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    conn = await asyncpg.connect(url)
    try:
        for d in (today, today + timedelta(days=1)):
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {partition_name(d)} PARTITION OF {TABLE} "
                f"FOR VALUES FROM ('{d}') TO ('{d + timedelta(days=1)}')")
        rows = await conn.fetch(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", TABLE)
    finally:
        await conn.close()
    columns = [(str(r[0]), str(r[1])) for r in rows]
    if [c for c, _ in columns] != ["day", *RECORD_COLUMNS]:
        raise RuntimeError(f"{TABLE} columns are not day + RECORD_COLUMNS: {columns}")
    return columns


# -- measuring -----------------------------------------------------------------------------


@dataclass(slots=True)
class CaseResult:
    driver: str
    method: str
    batch: int
    #: records and summed wall time of the writes without the probe (half the batches)
    records: int
    seconds: float
    rate: float
    #: the event-loop thread's CPU inside those writes, per record
    loop_us_per_record: float
    #: the PostgreSQL backend's CPU, per record (all batches)
    server_us_per_record: float
    batch_ms_p50: float
    batch_ms_p99: float
    #: the longest a write kept the loop busy without a break (its CPU between two ticks;
    #: the loop's own floor is a few tenths of a ms here)
    blocked_ms_max: float
    #: the probe's lateness (wall clock: also the box's other load)
    late_ms_p99: float
    late_ms_max: float
    #: a stored batch sent again: "no-op", or the error it raised
    resend: str


class Ticker:
    """A callback every 1 ms (a ``call_later`` chain, no task). ``late``: how much later than
    due each tick ran (wall clock); ``busy``: the loop thread's CPU between two ticks, whose
    maximum is the longest stretch the loop ran something else without a break (the OS
    running other processes does not count there)."""

    INTERVAL = 0.001

    def __init__(self) -> None:
        self.late: list[float] = []
        self.busy: list[float] = []
        self._due = 0.0
        self._cpu = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.late.append(max(now - self._due, 0.0))
        self.busy.append(cpu - self._cpu)
        self._arm(now)

    def _arm(self, now: float) -> None:
        self._due = now + self.INTERVAL
        self._cpu = time.thread_time()
        self._handle = asyncio.get_running_loop().call_later(self.INTERVAL, self._tick)

    def resume(self) -> None:
        if self._handle is None:
            self._arm(time.perf_counter())

    def pause(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @staticmethod
    async def cpu_per_tick(seconds: float = 1.0) -> float:
        """The probe's own CPU per tick (thread seconds), with nothing else on the loop."""
        ticker = Ticker()
        c0 = time.thread_time()
        ticker.resume()
        await asyncio.sleep(seconds)
        ticker.pause()
        return (time.thread_time() - c0) / max(len(ticker.late), 1)


def backend_cpu(pid: int) -> float:
    """utime + stime of one process, seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


async def _stored(admin: asyncpg.Connection) -> tuple[int, int]:
    """(records in ``usage_records``, records the rollups count)."""
    records = await admin.fetchval(f"SELECT count(*) FROM {TABLE}")
    rolled = await admin.fetchval("SELECT coalesce(sum(requests), 0) FROM usage_hourly")
    return int(records), int(rolled)


async def _check_stored(
    setup: Setup, admin: asyncpg.Connection, batch: Sequence[UsageRecord]
) -> None:
    """The batch reads back as sent, every column of every record."""
    sent = {row[1]: row for row in Rows()(batch)}
    got = await admin.fetch(f"SELECT {setup.quoted} FROM {TABLE} "
                            "WHERE request_id = ANY($1::text[])", list(sent))
    if len(got) != len(sent):
        raise AssertionError(f"{len(got)} of {len(sent)} records read back")
    for row in got:
        if tuple(row) != sent[row["request_id"]]:
            raise AssertionError(f"stored {tuple(row)}, sent {sent[row['request_id']]}")


async def run_case(
    setup: Setup, admin: asyncpg.Connection, method: Method, batch: int, seconds: float
) -> CaseResult:
    """One method at one batch size, on emptied tables, for ``seconds`` of writes; checks
    that every record was stored once, counted once in the rollups (when the method writes
    them), reads back as sent, and what sending the last batch again does."""
    await admin.execute(f"TRUNCATE {TABLE}, usage_hourly")
    await admin.execute("CHECKPOINT")
    writer = await method.make(setup)
    warm = 3
    try:
        for seq in range(warm):  # statement preparation, type introspection
            await writer.write(make_batch(batch, seq))
        ticker = Ticker()
        records, spent, cpu, total = 0, 0.0, 0.0, 0.0
        batch_ms: list[float] = []
        server0 = backend_cpu(writer.backend_pid)
        seq = 0
        last: list[UsageRecord] = []
        while total < seconds:
            seq += 1
            probed = seq % 2 == 0
            last = make_batch(batch, seq * batch)  # not timed, and no ticks meanwhile
            if probed:
                ticker.resume()
            c0, t0 = time.thread_time(), time.perf_counter()
            await writer.write(last)
            t1, c1 = time.perf_counter(), time.thread_time()
            ticker.pause()
            total += t1 - t0
            if not probed:
                spent += t1 - t0
                cpu += c1 - c0
                batch_ms.append((t1 - t0) * 1000)
                records += batch
        server = backend_cpu(writer.backend_pid) - server0
        written = (seq + warm) * batch + writer.preloaded
        before = await _stored(admin)
        expected = (written, written if method.rollups else 0)
        if before != expected:
            raise AssertionError(f"{method.driver}:{method.name} stored (records, rolled up) "
                                 f"{before}, not {expected}")
        await _check_stored(setup, admin, last)
        resend = "no-op"
        try:
            await writer.write(last)
        except Exception as exc:  # COPY: the unique violation
            resend = type(exc).__name__
        after = await _stored(admin)
        if resend == "no-op" and after != before:
            resend = f"changed {before} -> {after}"
    finally:
        await writer.close()
    return CaseResult(
        driver=method.driver, method=method.name, batch=batch, records=records,
        seconds=round(spent, 3), rate=round(records / spent, 1),
        loop_us_per_record=round(cpu / records * 1e6, 2),
        server_us_per_record=round(server / (seq * batch) * 1e6, 2),
        batch_ms_p50=round(statistics.median(batch_ms), 3),
        batch_ms_p99=round(_pct(batch_ms, 0.99), 3),
        blocked_ms_max=round(max(ticker.busy, default=0.0) * 1000, 3),
        late_ms_p99=round(_pct(ticker.late, 0.99) * 1000, 3),
        late_ms_max=round(max(ticker.late, default=0.0) * 1000, 3),
        resend=resend,
    )


async def commit_floor(conn: asyncpg.Connection, n: int = 100) -> float:
    """Median ms of a one-row autocommit insert: the WAL fsync every batch pays once."""
    await conn.execute("CREATE TABLE floor_probe (x int)")
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await conn.execute("INSERT INTO floor_probe VALUES ($1)", i)
        times.append((time.perf_counter() - t0) * 1000)
    await conn.execute("DROP TABLE floor_probe")
    return round(statistics.median(times), 3)


async def run(
    url: str, methods: list[Method], batches: Sequence[int], seconds: float, *,
    quiet: bool = False,
) -> dict[str, Any]:
    """Every method at every batch size (batch size outer: the methods of one size run close
    together in time); returns the summary (the JSON line)."""
    setup = Setup(url, await create_schema(url, date.today()))
    admin = await asyncpg.connect(url)
    try:
        header: dict[str, Any] = {
            "bench": "ledger_drivers",
            "postgres": await admin.fetchval("SHOW server_version"),
            "asyncpg": asyncpg.__version__, "psycopg": psycopg.__version__,
            "libpq": psycopg.pq.version(), "columns": len(setup.columns),
            "fsync": await admin.fetchval("SHOW fsync"),
            "synchronous_commit": await admin.fetchval("SHOW synchronous_commit"),
            "commit_floor_ms": await commit_floor(admin),
            "tick_cpu_us": round(await Ticker.cpu_per_tick() * 1e6, 1),
            "seconds_per_case": seconds, "cpus": os.cpu_count(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        if not quiet:
            print(" ".join(f"{k}={v}" for k, v in header.items()), flush=True)
            print(_row_header(), flush=True)
        cases = []
        for batch in batches:
            for method in methods:
                result = await run_case(setup, admin, method, batch, seconds)
                cases.append(asdict(result))
                if not quiet:
                    print(_row(result), flush=True)
        header["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    finally:
        await admin.close()
    return {**header, "cases": cases}


_COLUMNS = (("driver", 8), ("method", 12), ("batch", 5), ("rec/s", 7), ("loop us/rec", 11),
            ("pg us/rec", 9), ("p50 ms", 7), ("p99 ms", 7), ("blocked max", 11),
            ("late p99", 8), ("max", 6), ("resend", 0))


def _line(values: Sequence[object]) -> str:
    return " ".join(f"{v!s:<{w}}" if i < 2 else f"{v!s:>{w}}"
                    for i, (v, (_, w)) in enumerate(zip(values, _COLUMNS, strict=True)))


def _row_header() -> str:
    return _line([name for name, _ in _COLUMNS]).rstrip()


def _row(r: CaseResult) -> str:
    return _line((r.driver, r.method, r.batch, f"{r.rate:,.0f}", f"{r.loop_us_per_record:.2f}",
                  f"{r.server_us_per_record:.2f}", f"{r.batch_ms_p50:.2f}",
                  f"{r.batch_ms_p99:.1f}", f"{r.blocked_ms_max:.2f}", f"{r.late_ms_p99:.2f}",
                  f"{r.late_ms_max:.1f}", r.resend))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.ledger_drivers",
        description=(__doc__ or "").splitlines()[0],
        epilog="Starts and removes its own PostgreSQL; never touches the machine's.",
    )
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)),
                        help="batch sizes, comma-separated (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="write seconds per case (default %(default)s)")
    parser.add_argument("--methods", default="all",
                        help=f"comma-separated, of: {', '.join(METHODS)} (default all)")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    names = list(METHODS) if args.methods == "all" else args.methods.split(",")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: not a list of integers: {args.batches!r}")
    if any(b < 1 for b in batches) or args.seconds <= 0:
        parser.error("batch sizes and --seconds must be positive")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    with PostgresServer(database="bench") as server:
        summary = asyncio.run(run(server.url, [METHODS[n] for n in names], batches,
                                  args.seconds, quiet=args.json_only))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
