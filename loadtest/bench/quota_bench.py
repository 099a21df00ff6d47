"""Quota store throughput: reserve+settle pairs per second from one asyncio process.

``python -m loadtest.bench.quota_bench`` starts its own ``redis-server`` on a free loopback port,
runs ``--tasks`` concurrent reserve -> settle loops (uvloop) for ``--seconds`` against one
tenant with three scopes (tenant: every limit; key: rpm; model: tpm), all limits high enough
that every request is admitted, and prints admissions/s, p50/p99 latency of each step and the
Redis commands per step from ``INFO commandstats`` (one ``EVALSHA`` per step = one round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis

from gateway.quota import Limits, QuotaRequest, RedisQuotaStore, build_scopes
from loadtest.bench.redis_local import redis_server

__all__ = ["BenchResult", "main", "run"]

BIG = 10**12


@dataclass(slots=True)
class BenchResult:
    """Counts and latencies (ns) of one run."""

    seconds: float = 0.0
    admitted: int = 0
    refused: int = 0
    reserve_ns: list[int] = field(default_factory=list)
    settle_ns: list[int] = field(default_factory=list)
    commands: dict[str, int] = field(default_factory=dict)
    client_cpu: float = 0.0  # CPU seconds of this process in the window
    redis_cpu: float = 0.0  # CPU seconds of redis-server in the window


async def _server_stats(url: str) -> tuple[dict[str, int], float]:
    """Calls per command, and CPU seconds used by redis-server so far."""
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        cpu = await client.info("cpu")
    finally:
        await client.aclose()
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def run(url: str, *, tasks: int, seconds: float, warmup: float = 1.0) -> BenchResult:
    """Run the loops; commands are counted over the measured part only."""
    store = RedisQuotaStore.from_url(url, timeout=1.0, connect_timeout=1.0)
    tenant = Limits(rpm=BIG, tpm=BIG, concurrency=BIG, tokens_per_day=BIG, tokens_per_month=BIG)
    scopes = build_scopes(
        tenant, key_id="k1", key=Limits(rpm=BIG), model="m1", per_model=Limits(tpm=BIG)
    )
    result = BenchResult()
    measuring = False
    stop = False

    async def loop(worker: int) -> None:
        n = 0
        while not stop:
            n += 1
            request = QuotaRequest(
                request_id=f"w{worker}-{n}",
                tenant="bench",
                scopes=scopes,
                estimated_tokens=1200,
                key_id="k1",
                model="m1",
            )
            t0 = time.perf_counter_ns()
            decision = await store.reserve(request)
            t1 = time.perf_counter_ns()
            if decision.reservation is None:
                result.refused += 1
                continue
            await store.settle(decision.reservation, 900)
            t2 = time.perf_counter_ns()
            if measuring:
                result.admitted += 1
                result.reserve_ns.append(t1 - t0)
                result.settle_ns.append(t2 - t1)

    try:
        await store.load_scripts()
        workers = [asyncio.create_task(loop(i)) for i in range(tasks)]
        await asyncio.sleep(warmup)
        before, redis_cpu = await _server_stats(url)
        measuring, started, cpu = True, time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        measuring, result.seconds = False, time.perf_counter() - started
        result.client_cpu = time.process_time() - cpu
        after, redis_cpu_after = await _server_stats(url)
        result.redis_cpu = redis_cpu_after - redis_cpu
        stop = True
        await asyncio.gather(*workers)
    finally:
        await store.aclose()
    result.commands = {
        k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0
    }
    return result


def _pct(values: list[int], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1e6


def report(result: BenchResult, tasks: int) -> str:
    """A small table. Commands run inside a script are counted by Redis too; the round trips
    are the EVALSHA calls (plus the harness's own INFO calls)."""
    rate = result.admitted / result.seconds
    steps = 2 * result.admitted
    evalsha = result.commands.get("evalsha", 0)
    lines = [
        f"quota bench: {tasks} tasks, {result.seconds:.1f} s, one process (uvloop)",
        f"{'admissions/s (reserve+settle)':<34}{rate:>12,.0f}",
        f"{'reserve p50 / p99 ms':<34}{_pct(result.reserve_ns, 0.5):>8.3f} / "
        f"{_pct(result.reserve_ns, 0.99):.3f}",
        f"{'settle  p50 / p99 ms':<34}{_pct(result.settle_ns, 0.5):>8.3f} / "
        f"{_pct(result.settle_ns, 0.99):.3f}",
        f"{'admissions per client CPU-second':<34}{result.admitted / result.client_cpu:>12,.0f}",
        f"{'client CPU / redis CPU (cores)':<34}{result.client_cpu / result.seconds:>8.2f} / "
        f"{result.redis_cpu / result.seconds:.2f}",
        f"{'EVALSHA per step':<34}{evalsha / max(1, steps):>12.3f}",
        f"{'round trips in window':<34}"
        f"{ {k: v for k, v in result.commands.items() if k in ('evalsha', 'info')} }",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.quota_bench",
                                     description=__doc__)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--url", help="use this Redis instead of starting one")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(redis_server())
        result = asyncio.run(run(url, tasks=args.tasks, seconds=args.seconds))
    print(report(result, args.tasks))


if __name__ == "__main__":
    main()
