"""The ledger of record under load: records/s stored, event-loop time per record, group commit.

``python -m loadtest.bench.ledger_bench`` starts its own PostgreSQL (``pgserver``: a temporary
cluster on a free loopback port, ``fsync`` and ``synchronous_commit`` on) and keeps a SQLite file
in a temporary directory, and drives the gateway's own ledgers (``PostgresLedger``,
``SqliteLedger``, default ``LedgerSettings``: batches of 256, 50 ms flush) from a producer on the
same event loop (uvloop), as the gateway's requests do. Each case runs ``--warmup`` seconds, then
is measured for ``--seconds``:

* ``buffered`` at each of ``--rates`` records/s: ``write_nowait`` per record (what
  ``store.ledger_durability: buffered`` does at a response's end), the flusher in the background.
  ``max``: the producer tops the buffer (records waiting, not those in flight) up to 4
  batches whenever it is below, so the store's own pace sets the rate (the records/s it sustains).
* ``durable`` at each rate: ``write_durable`` per record (``ledger_durability: commit``, the
  default: the response's last bytes wait for the future), and the time from the call to the
  future's completion (the group-commit wait a response pays): p50/p99. ``max``:
  ``--concurrency`` requests each waiting for its record before writing the next.
* ``null`` at each rate: the same producer writing to nothing: the harness's own loop time.

The producer wakes every millisecond and writes the records due by then (made beforehand, not
timed). Figures per case:

* **stored/s**: records committed in the window (the store's counter) / the window's seconds;
* **loop us/rec, ledger**: instrumented: the loop thread's CPU (``time.thread_time``) inside
  ``write_nowait`` / ``write_durable`` calls, plus inside every step of the flusher's ``flush``
  coroutine (building the rows and columns, asyncpg's encoding and sending, the commit's
  bookkeeping; the coroutine is driven by a wrapper that reads the clock around each resume),
  per record stored;
* **loop us/rec, total-null**: the loop thread's whole CPU in the window minus the ``null``
  case's at the same rate, per record: adds what the instrumented figure cannot see (asyncpg's
  reply parsing in the protocol's callbacks, the flusher's timer, the loop's extra wake-ups);
* **loop busy**: the loop thread's CPU / wall time;
* **off-loop us/rec**: the process's other threads (SQLite's writer thread; ~0 for asyncpg);
* **server us/rec**: PostgreSQL's CPU (the postmaster and every child: backends, WAL writer,
  checkpointer, autovacuum; from ``/proc``, per pid, so a process that exits in the window is
  missed) per record: the database's cost, on its own processes, not the gateway's loop;
* **lag max**: ``stats.max_lag_ms``, the longest a record waited before its flush committed.

``--stores postgresql-main`` adds the store with the flusher as it was on main 1a5293a
(``flush`` takes the whole buffer and loops while records arrive, one flush at a time;
``MainFlusherPostgresLedger``) on the same server, case by case beside the others;
``postgresql-daily`` the store as it was before migration 6: ``usage_daily`` upserted on the
write path for every record (the store now adds only records of days already compacted,
``gateway/ledger/sql/compact.py``).

Then **bytes on disk per record**: PostgreSQL after ``VACUUM ANALYZE``: ``pg_total_relation_size``
(heap, TOAST, every index) of the ``usage_records`` partitions and of ``usage_hourly``, over the
record count; SQLite: the file after a WAL checkpoint, over the record count. The rollup's share
depends on how many distinct (tenant, hour, key, model, class, version) groups the records fall
into: ``--tenants`` x ``--keys`` (per tenant) x ``--models`` x 2 classes x ``--versions``, uniform;
``usage_query_bench`` gives it for a month of 10 million records. Prints a markdown table and
writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import math
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger.sql import postgres as pg_store
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.schema import record_row
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.store import SqlLedger
from loadtest.bench.pgserver import PostgresServer

__all__ = ["CaseResult", "Workload", "cpu_between", "main", "pg_bytes", "pg_cpu",
           "pg_cpu_seconds", "run"]

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "ledger-bench.json"
TICK_S = 0.001
#: the buffered ``max`` case keeps this many batches waiting at most
MAX_BUFFER_BATCHES = 4


# -- the records ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """What records look like: every (tenant, key, model, class, version) group in turn, in a
    scrambled order (a multiplicative stride over all groups, so each one comes up once per
    cycle), token counts and timings from a pool of random templates."""

    tenants: int = 200
    keys: int = 20  # per tenant
    models: int = 5
    versions: int = 3
    seed: int = 7

    @property
    def groups(self) -> int:
        return self.tenants * self.keys * self.models * len(CLASSES) * self.versions

    def factory(self, prefix: str) -> Callable[[], UsageRecord]:
        """A maker of fresh records (ids ``<prefix>-<n>``, timestamps now), ~2 us each: the
        harness makes them on the loop, as the gateway makes its records."""
        rng = random.Random(self.seed)
        groups = [
            (f"tenant-{t:04d}", f"tenant-{t:04d}-k{k:02d}", f"model-{m}", cls, f"{cls}-pool",
             f"v{v}")
            for t in range(self.tenants) for k in range(self.keys) for m in range(self.models)
            for cls in CLASSES for v in range(self.versions)
        ]
        templates = [_template(rng) for _ in range(4096)]
        stride = _coprime_stride(len(groups))
        replace = msgspec.structs.replace
        counter = itertools.count()

        def make() -> UsageRecord:
            n = next(counter)
            tenant, key, model, cls, pool, version = groups[(n * stride) % len(groups)]
            return replace(templates[n & 4095], request_id=f"{prefix}-{n}",
                           ts_ms=time.time_ns() // 1_000_000, tenant=tenant, key_id=key,
                           model=model, request_class=cls, pool=pool, version=version)

        return make


CLASSES = ("interactive", "batch")


def _template(rng: random.Random) -> UsageRecord:
    system, history, new = rng.randint(0, 400), rng.randint(0, 4000), rng.randint(5, 400)
    output = rng.randint(1, 800)
    prompt = system + history + new
    cost_out = output * 12
    return UsageRecord(
        request_id="", ts_ms=0, tenant="", upstream_model="llama-3.1-8b-instruct",
        backend="vllm-3", attempts=1, status=200, system=system, history=history, new=new,
        output=output, prompt_total=prompt, ttft_ms=rng.uniform(50, 900),
        tpot_ms=rng.uniform(8, 40), duration_ms=rng.uniform(200, 20000),
        cost_micros=prompt * 3 + cost_out, cost_system=system * 3, cost_history=history * 3,
        cost_new=new * 3, cost_output=cost_out,
    )


def _coprime_stride(n: int) -> int:
    """A large odd stride sharing no factor with ``n``: ``(i * stride) % n`` visits every
    group once per ``n`` records, in an order that spreads them."""
    stride = 2_654_435_761  # a prime (Knuth's multiplicative hash)
    while math.gcd(stride, n) != 1:
        stride += 2
    return stride


# -- measuring the flusher --------------------------------------------------------------------


class _StepClock:
    """Awaits a coroutine, adding the loop thread's CPU time of each of its steps (from a
    resume to its next suspension) to ``owner.flush_ns``; what it awaits passes through."""

    __slots__ = ("_coro", "_owner")

    def __init__(self, coro: Any, owner: Any) -> None:
        self._coro, self._owner = coro, owner

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, clock = self._coro, time.thread_time_ns
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self._owner.flush_ns += clock() - t0
                return stop.value
            except BaseException:
                self._owner.flush_ns += clock() - t0
                raise
            self._owner.flush_ns += clock() - t0
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as exc:  # cancellation and the like go on into the flush
                error = exc


def _timed(cls: type[SqlLedger]) -> type[SqlLedger]:
    """``cls`` whose every batch flush (the flusher's and the final drain) is clocked."""

    class Timed(cls):  # type: ignore[valid-type,misc]
        flush_ns = 0

        async def _flush_batch(self, batch: Any) -> None:
            await _StepClock(super()._flush_batch(batch), self)

    Timed.__name__ = f"Timed{cls.__name__}"
    return Timed


# -- the flusher as it was on main (1a5293a): flush loops while records arrive, one at a time --


class MainFlusherPostgresLedger(PostgresLedger):
    """``PostgresLedger`` with the flusher as on main 1a5293a, for ``--stores
    postgresql-main``: every wake (``batch_size`` records, a durable writer, or the interval)
    calls ``flush``, which takes the whole buffer and loops while records keep arriving, one
    flush at a time. So the flusher's change is measured beside the store on one server in
    one run (the store itself is the same)."""

    async def _run_flusher(self) -> None:
        interval = self.settings.flush_interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._buffer:
                with contextlib.suppress(Exception):
                    await self.flush()


class DailyUpsertPostgresLedger(PostgresLedger):
    """``PostgresLedger`` with every record's daily upsert on the write path (the flush
    statement of migration 5, before the daily rollups were compacted from closed days), for
    ``--stores postgresql-daily``: what the compaction saves, beside the store on one server
    in one run (with migration 6 the reads take today from the hourly rows, so the extra
    daily rows are written and not read)."""

    async def _insert(self, batch: Sequence[UsageRecord]) -> int:
        days = [r.ts_ms // 86_400_000 for r in batch]
        if not self._partitions.issuperset(days):
            await self._prepare(batch)
        rows = [(pg_store._day(n), *record_row(r)) for n, r in zip(days, batch, strict=True)]
        new = await self._run("fetchval", _DAILY_UPSERT, rows)
        return self._counted(len(rows), int(new))


def _daily_upsert() -> str:
    statement = pg_store._INSERT
    start = statement.index("), daily AS (")
    end = statement.index("SELECT count(*) FROM new")
    daily = pg_store._rollup_upsert("usage_daily", 86_400_000, "day_ms")
    return statement[:start] + f"), daily AS ({daily}\n)\n" + statement[end:]


_DAILY_UPSERT = _daily_upsert()


# -- CPU of the database server ---------------------------------------------------------------


def pg_cpu(postmaster: int) -> dict[int, float]:
    """User + system CPU seconds of the postmaster and of each of its live children (the
    backends and helpers; each is its own process group, so the group does not find them),
    by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        if pid == postmaster or int(fields[1]) == postmaster:
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes used between two ``pg_cpu`` readings: a process started in
    between counts whole; one that exited in between (an autovacuum worker) is missed."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


def pg_cpu_seconds(postmaster: int) -> float:
    """The postmaster's and its live children's CPU seconds in all."""
    return sum(pg_cpu(postmaster).values())


# -- one case ---------------------------------------------------------------------------------


@dataclass(slots=True)
class CaseResult:
    store: str
    mode: str  # buffered | durable | null
    target: float | None  # records/s asked for; None = max
    seconds: float = 0.0
    written: int = 0
    stored: int = 0
    write_ns: int = 0
    flush_ns: int = 0
    loop_cpu: float = 0.0
    process_cpu: float = 0.0
    server_cpu: float | None = None
    latencies_ns: list[int] = field(default_factory=list)
    max_lag_ms: float = 0.0
    pending_end: int = 0
    flushes: int = 0

    @property
    def rate(self) -> float:
        count = self.written if self.mode == "null" else self.stored
        return count / self.seconds if self.seconds else 0.0

    def per_record_us(self, seconds: float) -> float | None:
        count = self.written if self.mode == "null" else self.stored
        return seconds / count * 1e6 if count else None

    def summary(self, null: CaseResult | None) -> dict[str, Any]:
        lat = sorted(self.latencies_ns)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6 if lat else None

        extra = None
        if null is not None and self.mode != "null" and self.stored:
            null_per_s = null.loop_cpu / null.seconds
            extra = (self.loop_cpu - null_per_s * self.seconds) / self.stored * 1e6
        return {
            "store": self.store, "mode": self.mode,
            "target": self.target, "rate": self.rate,
            "loop_us_ledger": self.per_record_us((self.write_ns + self.flush_ns) / 1e9),
            "loop_us_write": self.per_record_us(self.write_ns / 1e9),
            "loop_us_total_minus_null": extra,
            "loop_us_total": self.per_record_us(self.loop_cpu),
            "loop_busy": self.loop_cpu / self.seconds if self.seconds else None,
            "off_loop_us": self.per_record_us(self.process_cpu - self.loop_cpu),
            "server_us": (self.per_record_us(self.server_cpu)
                          if self.server_cpu is not None else None),
            "durable_p50_ms": pct(0.5), "durable_p99_ms": pct(0.99),
            "durable_max_ms": lat[-1] / 1e6 if lat else None,
            "max_lag_ms": self.max_lag_ms, "pending_end": self.pending_end,
            "records_per_flush": self.stored / self.flushes if self.flushes else None,
            "seconds": self.seconds, "stored": self.stored, "written": self.written,
        }


class _Sink:
    """Nothing: the ``null`` case's ledger."""

    pending = 0
    flush_ns = 0
    _buffer: list[UsageRecord] = []

    def write_nowait(self, record: UsageRecord) -> None:
        pass


async def _run_case(
    result: CaseResult, ledger: Any, make: Callable[[], UsageRecord], *, warmup: float,
    seconds: float, concurrency: int, server: PostgresServer | None, batch_size: int = 256,
) -> CaseResult:
    """Drive ``ledger`` for ``warmup + seconds``; measure the last ``seconds``."""
    measuring = False
    window_ns = 1 << 62  # records written from then on count (set when the window opens)
    stop = asyncio.Event()
    lat = result.latencies_ns
    clock = time.thread_time_ns
    perf = time.perf_counter_ns
    rate = result.target
    durable = result.mode == "durable"

    def done(t0: int, _: asyncio.Future[None]) -> None:
        if measuring and t0 >= window_ns:
            lat.append(perf() - t0)

    async def open_loop() -> None:
        started = time.perf_counter()
        written = 0
        bound = MAX_BUFFER_BATCHES * batch_size
        while not stop.is_set():
            if rate is None:
                due = bound - len(ledger._buffer)  # waiting, not in flight
            else:
                due = int((time.perf_counter() - started) * rate) - written
            if due > 0:
                records = [make() for _ in range(due)]
                t0 = clock()
                if durable:
                    # one clock reading per burst: the burst's records are written together
                    callback = functools.partial(done, perf())
                    for record in records:
                        ledger.write_durable(record).add_done_callback(callback)
                else:
                    for record in records:
                        ledger.write_nowait(record)
                if measuring:
                    result.write_ns += clock() - t0
                    result.written += due
                written += due
            await asyncio.sleep(TICK_S)

    async def closed_loop() -> None:
        while not stop.is_set():
            record = make()
            t0 = perf()
            c0 = clock()
            waiter = ledger.write_durable(record)
            if measuring:
                result.write_ns += clock() - c0
                result.written += 1
            await waiter
            if measuring and t0 >= window_ns:
                lat.append(perf() - t0)

    if rate is None and durable:
        tasks = [asyncio.create_task(closed_loop()) for _ in range(concurrency)]
    else:
        tasks = [asyncio.create_task(open_loop())]

    def snapshot() -> tuple[float, float, float, int, int, dict[int, float] | None, int]:
        server_cpu = pg_cpu(server.proc.pid) if server and server.proc else None
        stats = getattr(ledger, "stats", None)
        return (time.perf_counter(), time.thread_time(), time.process_time(),
                stats.stored if stats else 0, ledger.flush_ns, server_cpu,
                stats.flushes if stats else 0)

    try:
        await asyncio.sleep(warmup)
        if hasattr(ledger, "stats"):
            ledger.stats.max_lag_ms = 0.0
        before = snapshot()
        window_ns = perf()
        measuring = True
        await asyncio.sleep(seconds)
        measuring = False
        after = snapshot()
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    result.seconds = after[0] - before[0]
    result.loop_cpu = after[1] - before[1]
    result.process_cpu = after[2] - before[2]
    result.stored = after[3] - before[3]
    result.flush_ns = after[4] - before[4]
    if before[5] is not None and after[5] is not None:
        result.server_cpu = cpu_between(before[5], after[5])
    result.flushes = after[6] - before[6]
    if hasattr(ledger, "stats"):
        result.max_lag_ms = ledger.stats.max_lag_ms
        result.pending_end = ledger.pending
    return result


# -- the run ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Stores:
    """Where the cases write: a PostgreSQL URL (and its server, for CPU) and a SQLite file."""

    workdir: Path
    pg_url: str | None
    pg_server: PostgresServer | None
    settings: LedgerSettings = field(default_factory=LedgerSettings)

    def ledger(self, store: str) -> SqlLedger:
        spool = self.workdir / f"spool-{store}-{secrets.token_hex(3)}"
        if store.startswith("postgresql"):
            assert self.pg_url is not None
            cls = {"postgresql-main": MainFlusherPostgresLedger,
                   "postgresql-daily": DailyUpsertPostgresLedger}.get(store, PostgresLedger)
            return _timed(cls)(self.pg_url, spool_dir=spool, migrate=True,
                               settings=self.settings)
        return _timed(SqliteLedger)(self.workdir / "ledger.db", spool_dir=spool,
                                    settings=self.settings)


async def _case(stores: Stores, store: str, mode: str, rate: float | None, args: Any,
                workload: Workload) -> CaseResult:
    result = CaseResult(store, mode, rate)
    make = workload.factory(f"{store[:2]}{mode[:1]}{secrets.token_hex(4)}")
    if mode == "null":
        return await _run_case(result, _Sink(), make, warmup=args.warmup, seconds=args.seconds,
                               concurrency=args.concurrency, server=None)
    ledger = stores.ledger(store)
    await ledger.start()
    try:
        server = stores.pg_server if store.startswith("postgresql") else None
        return await _run_case(result, ledger, make, warmup=args.warmup, seconds=args.seconds,
                               concurrency=args.concurrency, server=server,
                               batch_size=stores.settings.batch_size)
    finally:
        await ledger.close()


async def pg_bytes(url: str) -> dict[str, Any]:
    """Rows and bytes on disk (``pg_total_relation_size``: heap, TOAST, indexes) of the
    ``usage_records`` partitions and of ``usage_hourly``, after ``VACUUM ANALYZE``."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
        parts = await conn.fetchval("""
            SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname = 'usage_records'""")
        heap = await conn.fetchval("""
            SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname = 'usage_records'""")
        # the rollups: hourly and daily (migration 5), together
        hourly = await conn.fetchval("SELECT pg_total_relation_size('usage_hourly') + "
                                     "coalesce(pg_total_relation_size("
                                     "to_regclass('usage_daily')), 0)")
        rows = await conn.fetchval("SELECT count(*) FROM usage_records")
        groups = await conn.fetchval("SELECT count(*) FROM usage_hourly")
    finally:
        await conn.close()
    return _bytes(rows, groups, records=int(parts), records_heap=int(heap), hourly=int(hourly))


def _sqlite_bytes(path: Path) -> dict[str, Any]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT count(*) FROM usage_records").fetchone()[0]
        groups = conn.execute("SELECT count(*) FROM usage_hourly").fetchone()[0]
        sizes: dict[str, int] = {}
        with contextlib.suppress(sqlite3.OperationalError):  # dbstat is optional in builds
            for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
                sizes[name] = int(size)
    finally:
        conn.close()
    total = path.stat().st_size
    hourly = sum(v for k, v in sizes.items() if "hourly" in k or "daily" in k) if sizes else None
    out = _bytes(rows, groups, records=total - (hourly or 0) if sizes else total, hourly=hourly)
    out["file_bytes"] = total
    return out


def _bytes(rows: int, groups: int, *, records: int, hourly: int | None,
           records_heap: int | None = None) -> dict[str, Any]:
    return {
        "records": rows, "rollup_rows": groups,
        "records_bytes": records, "hourly_bytes": hourly,
        "bytes_per_record": (records + (hourly or 0)) / rows if rows else None,
        "record_bytes_per_record": records / rows if rows else None,
        "record_heap_per_record": records_heap / rows if rows and records_heap else None,
        "hourly_bytes_per_record": hourly / rows if rows and hourly is not None else None,
        "hourly_bytes_per_group": hourly / groups if groups and hourly is not None else None,
    }


async def run(args: Any, stores: Stores) -> dict[str, Any]:
    workload = Workload(tenants=args.tenants, keys=args.keys, models=args.models,
                        versions=args.versions)
    results: list[CaseResult] = []
    nulls: dict[float | None, CaseResult] = {}
    for rate in args.rates:
        if rate is not None:
            nulls[rate] = await _case(stores, "null", "null", rate, args, workload)
            results.append(nulls[rate])
            _progress(nulls[rate], None)
        for mode in args.modes:
            for store in args.stores:
                case = await _case(stores, store, mode, rate, args, workload)
                results.append(case)
                _progress(case, nulls.get(rate))
    for rate in args.durable_only_rates:
        for store in args.stores:
            case = await _case(stores, store, "durable", rate, args, workload)
            results.append(case)
            _progress(case, None)
    disk: dict[str, Any] = {}
    if any(s.startswith("postgresql") for s in args.stores) and stores.pg_url:
        disk["postgresql"] = await pg_bytes(stores.pg_url)
    if "sqlite" in args.stores:
        disk["sqlite"] = _sqlite_bytes(stores.workdir / "ledger.db")
    return {
        "cases": [r.summary(nulls.get(r.target)) for r in results],
        "disk": disk,
        "workload": asdict(workload),
        "settings": asdict(stores.settings),
        "seconds": args.seconds, "warmup": args.warmup, "concurrency": args.concurrency,
        "loadavg_end": os.getloadavg(),
    }


def _progress(case: CaseResult, null: CaseResult | None) -> None:
    s = case.summary(null)
    bits = [f"{s['rate']:>9,.0f}/s"]
    if s["loop_us_ledger"] is not None and case.mode != "null":
        bits.append(f"loop {s['loop_us_ledger']:.2f} us/rec")
    if s["loop_us_total_minus_null"] is not None:
        bits.append(f"total-null {s['loop_us_total_minus_null']:.2f}")
    if case.mode == "null" and s["loop_us_total"] is not None:
        bits.append(f"loop {s['loop_us_total']:.2f} us/rec")
    if s["server_us"] is not None:
        bits.append(f"server {s['server_us']:.1f} us/rec")
    if s["durable_p50_ms"] is not None:
        bits.append(f"wait p50 {s['durable_p50_ms']:.2f} p99 {s['durable_p99_ms']:.2f} ms")
    target = "max" if case.target is None else f"{case.target:,.0f}"
    print(f"[ledger] {case.store:>10} {case.mode:>8} {target:>7}: " + "  ".join(bits),
          file=sys.stderr, flush=True)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(out: dict[str, Any]) -> str:
    lines = [
        "| store | mode | target/s | stored/s | loop us/rec ledger | loop us/rec total-null "
        "| loop busy | off-loop us/rec | server us/rec | wait p50 ms | wait p99 ms | lag max ms "
        "| rec/flush |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in out["cases"]:
        target = "max" if c["target"] is None else f"{c['target']:,.0f}"
        null = c["mode"] == "null"
        lines.append(
            f"| {c['store']} | {c['mode']} | {target} | {c['rate']:,.0f} "
            f"| {_fmt(None if null else c['loop_us_ledger'], '.2f')} "
            f"| {_fmt(c['loop_us_total'] if null else c['loop_us_total_minus_null'], '.2f')} "
            f"| {_fmt(c['loop_busy'], '.0%')} | {_fmt(c['off_loop_us'], '.2f')} "
            f"| {_fmt(c['server_us'], '.1f')} | {_fmt(c['durable_p50_ms'], '.2f')} "
            f"| {_fmt(c['durable_p99_ms'], '.2f')} "
            f"| {_fmt(None if null else c['max_lag_ms'], '.0f')} "
            f"| {_fmt(c['records_per_flush'], '.0f')} |")
    lines += ["", "| store | records | rollup rows | bytes/record (all) | records+indexes "
              "| of which heap | rollups/record | bytes/rollup row |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for store, d in out["disk"].items():
        lines.append(
            f"| {store} | {d['records']:,} | {d['rollup_rows']:,} "
            f"| {_fmt(d['bytes_per_record'], ',.0f')} "
            f"| {_fmt(d['record_bytes_per_record'], ',.0f')} "
            f"| {_fmt(d['record_heap_per_record'], ',.0f')} "
            f"| {_fmt(d['hourly_bytes_per_record'], ',.0f')} "
            f"| {_fmt(d['hourly_bytes_per_group'], ',.0f')} |")
    return "\n".join(lines)


def _rates(text: str) -> list[float | None]:
    out: list[float | None] = []
    for word in text.split(","):
        word = word.strip()
        if word:
            out.append(None if word == "max" else float(word))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.ledger_bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Measures: records/s stored into PostgreSQL and SQLite at target rates and at "
        "max, the event loop's CPU per record spent in the ledger (write + flusher; separate "
        "from the database server's CPU), the group-commit wait (write_durable p50/p99) per "
        "rate, and bytes on disk per record with indexes. See the module docstring.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stores", default="postgresql,sqlite",
                   help="postgresql,sqlite (both); postgresql-main: the store with main "
                   "1a5293a's flusher (one flush at a time, looping); postgresql-daily: every "
                   "record's daily upsert on the write path (before migration 6); beside the "
                   "others")
    p.add_argument("--modes", default="buffered,durable", help="buffered,durable (both)")
    p.add_argument("--rates", default="1000,5000,20000,max",
                   help="records/s per case, 'max' = as fast as the store takes them")
    p.add_argument("--durable-only-rates", default="100",
                   help="extra rates measured in durable mode only (the wait at low load)")
    p.add_argument("--seconds", type=float, default=12.0, help="measured seconds per case (12)")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first (2)")
    p.add_argument("--concurrency", type=int, default=256,
                   help="durable max: requests each waiting for its record (256)")
    p.add_argument("--batch-size", type=int, default=LedgerSettings().batch_size,
                   help="LedgerSettings.batch_size: records a flush statement carries at most "
                   "(the gateway's default, 256)")
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--keys", type=int, default=20, help="keys per tenant (20)")
    p.add_argument("--models", type=int, default=5)
    p.add_argument("--versions", type=int, default=3)
    p.add_argument("--shared-buffers", default="128MB",
                   help="the bench server's shared_buffers (PostgreSQL's own default, 128MB)")
    p.add_argument("--url", help="use this PostgreSQL (an empty database) instead of starting one;"
                   " its CPU is then not measured")
    p.add_argument("--no-uvloop", action="store_true", help="the default asyncio loop")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results ({DEFAULT_OUT})")
    args = p.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := set(args.stores) - {"postgresql", "postgresql-main", "postgresql-daily",
                                  "sqlite"}:
        p.error(f"unknown stores {sorted(bad)}")
    if bad := set(args.modes) - {"buffered", "durable"}:
        p.error(f"unknown modes {sorted(bad)}")
    args.rates = _rates(args.rates)
    args.durable_only_rates = _rates(args.durable_only_rates)
    if args.seconds <= 0 or args.warmup < 0 or args.concurrency < 1 or args.batch_size < 1:
        p.error("--seconds > 0, --warmup >= 0, --concurrency >= 1, --batch-size >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_uvloop:
        import uvloop

        uvloop.install()
    workdir = Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    server: PostgresServer | None = None
    try:
        url = args.url
        if any(s.startswith("postgresql") for s in args.stores) and url is None:
            server = PostgresServer(settings={"shared_buffers": args.shared_buffers}).start()
            url = server.url
        settings = LedgerSettings(batch_size=args.batch_size)
        out = asyncio.run(run(args, Stores(workdir, url, server, settings)))
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"[ledger] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
