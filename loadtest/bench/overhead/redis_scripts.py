"""Redis's own time per quota script call: ``python -m loadtest.bench.overhead.redis_scripts``.

A fresh redis-server (pinned to ``--redis-cpu``) and the gateway's Redis quota store with the
overhead bench's plan (every limit set, never refusing). The windows are first filled for
``--fill`` seconds by reserve/settle pairs, 50 at a time, as a minute of traffic fills them
(rpm and tpm are sliding windows: sorted sets of the last minute's requests); then ``--calls``
reserves one at a time, then their settles, each kind with ``INFO commandstats`` reset before
it: the script's own µs per call inside Redis, beside the client's round trip.

Why: the reserve is the longest stage of a request at one connection after the backend's round
trip (see docs/benchmarks/one-connection.md), and this says how much of it is Redis's
script rather than the wire.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

from gateway.quota import Limits, QuotaRequest, RedisQuotaStore, Scope
from gateway.redis.pipelined import PipelinedRedis
from loadtest.bench.redis_local import redis_server

#: the overhead bench's plan (gateway.QUOTAS)
LIMITS = Limits(rpm=100_000_000, tpm=100_000_000_000, concurrency=100_000,
                tokens_per_day=100_000_000_000_000, tokens_per_month=100_000_000_000_000)


def _pin(port: int, cpus: set[int]) -> None:
    for proc in Path("/proc").iterdir():  # the redis-server just started, by its port
        with contextlib.suppress(OSError, ValueError):
            if f"--port\0{port}\0" in (proc / "cmdline").read_text():
                os.sched_setaffinity(int(proc.name), cpus)


async def measure(url: str, fill_s: float, calls: int) -> dict[str, float]:
    store = RedisQuotaStore(PipelinedRedis.from_url(url), owns_client=True)
    stats = redis.Redis.from_url(url)
    scopes = (Scope("tenant", LIMITS),)

    def request() -> QuotaRequest:
        return QuotaRequest(request_id=uuid.uuid4().hex, tenant="bench", scopes=scopes,
                            estimated_tokens=100, lease_ttl=30.0)

    def script_us() -> float:
        return float(stats.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])

    try:
        filled, deadline = 0, time.monotonic() + fill_s
        while time.monotonic() < deadline:
            decisions = await asyncio.gather(*(store.reserve(request()) for _ in range(50)))
            await asyncio.gather(*(store.settle(d.reservation, 50) for d in decisions
                                   if d.reservation is not None))
            filled += 50
        stats.execute_command("CONFIG", "RESETSTAT")
        reserves, trips = [], []
        for _ in range(calls):
            started = time.perf_counter_ns()
            decision = await store.reserve(request())
            trips.append(time.perf_counter_ns() - started)
            assert decision.reservation is not None
            reserves.append(decision.reservation)
        reserve_us = script_us()
        stats.execute_command("CONFIG", "RESETSTAT")
        settles = []
        for reservation in reserves:
            started = time.perf_counter_ns()
            await store.settle(reservation, 50)
            settles.append(time.perf_counter_ns() - started)
        return {"window_requests": float(filled), "reserve_script_us": reserve_us,
                "reserve_round_trip_us": statistics.median(trips) / 1e3,
                "settle_script_us": script_us(),
                "settle_round_trip_us": statistics.median(settles) / 1e3}
    finally:
        stats.close()
        await store.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.overhead.redis_scripts",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--fill", type=float, default=15.0, help="seconds of filling (15)")
    p.add_argument("--calls", type=int, default=1000, help="reserves (and settles) timed")
    p.add_argument("--redis-cpu", default="1")
    p.add_argument("--client-cpu", default="0")
    args = p.parse_args(argv)
    with redis_server() as url:
        _pin(int(url.rsplit(":", 1)[1]), {int(c) for c in args.redis_cpu.split(",")})
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
        result = asyncio.run(measure(url, args.fill, args.calls))
    print(f"after {result['window_requests']:,.0f} requests in the windows "
          f"(load average {os.getloadavg()[0]:.2f}):")
    for kind in ("reserve", "settle"):
        print(f"  {kind}: {result[f'{kind}_script_us']:.1f} µs in Redis per call, "
              f"{result[f'{kind}_round_trip_us']:.1f} µs round trip (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
