"""Ledger throughput: records/s one process stores in Redis, and what ``write`` costs a request.

``python -m loadtest.bench.ledger_bench`` starts its own ``redis-server`` on a free loopback port
(no persistence) and, in one asyncio process (uvloop):

* **write cost**: the time of each ``ledger.write`` call, which is all a request pays (the
  record is appended to a buffer; the flusher does the I/O in the background);
* **throughput**: ``--records`` records written by ``--tasks`` concurrent "requests" as fast
  as the loop allows, until every record is stored in Redis (one Lua call per record, a
  pipeline of ``batch_size`` per round trip); Redis CPU and commands per record from ``INFO``;
* **spool**: the same with Redis unreachable, i.e. records/s to the fsync'd spool file.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.ledger import LedgerSettings, RedisLedger, UsageRecord
from loadtest.bench.redis_local import free_port, redis_server

__all__ = ["BenchResult", "main", "run"]


@dataclass(slots=True)
class BenchResult:
    """One run: wall time to store everything, and the per-call cost of ``write``."""

    label: str
    records: int
    seconds: float
    write_ns: list[int]
    redis_cpu: float = 0.0
    redis_calls: int = 0

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def make_records(n: int, tenants: int) -> list[UsageRecord]:
    now = time.time_ns() // 1_000_000
    return [
        UsageRecord(
            request_id=uuid.uuid4().hex,
            ts_ms=now,
            tenant=f"bench-{i % tenants}",
            key_id="key-1",
            model=("chat-model", "code-model")[i % 2],
            upstream_model="llama-3-8b",
            request_class=("interactive", "batch")[i % 3 == 0],
            pool="chat",
            backend="b1",
            attempts=1,
            status=200,
            system=120,
            history=800 + i % 100,
            new=40,
            tools=0,
            cached=512,
            output=200 + i % 50,
            prompt_total=960 + i % 100,
            ttft_ms=120.0,
            tpot_ms=15.0,
            duration_ms=3100.0,
            cost_micros=1234 + i % 10,
            cost_history=800,
            cost_output=434,
        )
        for i in range(n)
    ]


async def _redis_stats(url: str) -> tuple[float, int]:
    client = Redis.from_url(url)
    try:
        cpu = await client.info("cpu")
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    calls = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


async def run(url: str, label: str, records: list[UsageRecord], tasks: int) -> BenchResult:
    """Write ``records`` from ``tasks`` concurrent writers; time until all are durable."""
    with tempfile.TemporaryDirectory() as spool:
        ledger = RedisLedger.from_url(url, spool_dir=spool, settings=LedgerSettings())
        await ledger.start()
        reachable = label == "redis"
        cpu0, calls0 = await _redis_stats(url) if reachable else (0.0, 0)
        write_ns: list[int] = []
        per_task = len(records) // tasks
        clock = time.perf_counter_ns

        async def writer(chunk: list[UsageRecord]) -> None:
            for i, record in enumerate(chunk):
                t0 = clock()
                await ledger.write(record)
                write_ns.append(clock() - t0)
                if i % 16 == 15:
                    await asyncio.sleep(0)  # other requests' work between records

        start = time.perf_counter()
        chunks = [records[i * per_task : (i + 1) * per_task] for i in range(tasks)]
        await asyncio.gather(*(writer(c) for c in chunks))
        await ledger.flush()
        seconds = time.perf_counter() - start
        stats = ledger.stats
        await ledger.close()
        if reachable:  # everything went to Redis, nothing to the spool
            assert (stats.stored, stats.spooled) == (per_task * tasks, 0), ledger
        stored = per_task * tasks
        cpu1, calls1 = await _redis_stats(url) if reachable else (0.0, 0)
    return BenchResult(label, stored, seconds, write_ns, cpu1 - cpu0, calls1 - calls0)


def _pct(values: list[int], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1000


def report(result: BenchResult) -> str:
    w = result.write_ns
    lines = [
        f"{result.label:>6}: {result.records} records in {result.seconds:.2f} s = "
        f"{result.rate:,.0f} records/s",
        f"        write() per call: mean {sum(w) / len(w) / 1000:.2f} us, "
        f"p50 {_pct(w, 0.5):.2f} us, p99 {_pct(w, 0.99):.2f} us, max {max(w) / 1000:.0f} us",
    ]
    if result.redis_calls:
        lines.append(
            f"        redis: {result.redis_calls / result.records:.2f} EVALSHA/record, "
            f"{result.redis_cpu / result.records * 1e6:.1f} us CPU/record"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.ledger_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--url", help="use this Redis instead of starting one (it is written to)")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    print(f"ledger bench: one process, {args.tasks} writers, {args.tenants} tenants")

    async def both(url: str) -> None:
        print(report(await run(url, "redis", make_records(args.records, args.tenants), args.tasks)))
        dead = f"redis://127.0.0.1:{free_port()}"
        n = max(args.records // 4, args.tasks)
        print(report(await run(dead, "spool", make_records(n, args.tenants), args.tasks)))

    if args.url:
        asyncio.run(both(args.url))
    else:
        with redis_server() as url:
            asyncio.run(both(url))


if __name__ == "__main__":
    main()
