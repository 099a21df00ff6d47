"""Redis cost per request: ``python -m loadtest.bench.redis_cost [--requests 2000]``.

Starts its own redis-server, a simulator and a gateway with quotas (every limit set) in Redis
(the usage records go to the ledger's database, not to Redis), sends ``--requests`` requests
(32 at a time, after 20 warm-up ones), and prints the Redis commands (from INFO commandstats,
counting those run inside the Lua scripts), the bytes per request and Redis's own CPU time
since it started (warm-up and start-up included: an upper bound per request).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import redis

__all__ = ["main"]

KEY = "sk-gw-rediscost-0123456789abcdef0123456789abcdef"


def free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def policy(tmp: str, sim_port: int) -> str:
    """A policy with every quota limit set (high enough to admit all) and a spool in ``tmp``."""
    return f"""
auth: {{keys: [{{id: k, tenant: t, sha256: {hashlib.sha256(KEY.encode()).hexdigest()}}}]}}
plans: [{{name: p, limits: {{rpm: 100000000, tpm: 100000000000, concurrency: 100000,
                             tokens_per_day: 100000000000000,
                             tokens_per_month: 100000000000000}}}}]
tenants: [{{name: t, plan: p}}]
store: {{spool_dir: {tmp}/spool}}
pools: [{{name: p, backends: [{{url: "http://127.0.0.1:{sim_port}", max_in_flight: 1000}}]}}]
models: [{{name: m, pool: p}}]
"""


async def measure(gport: int, r: redis.Redis, n: int) -> None:
    """Send ``n`` requests through the gateway and print Redis' counters per request."""
    async with aiohttp.ClientSession() as s:
        body = {
            "model": "m",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello there"}],
        }

        async def one() -> None:
            async with s.post(
                f"http://127.0.0.1:{gport}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEY}"},
            ) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

        for _ in range(20):
            await one()
        time.sleep(1)
        before: tuple[Any, Any] = (r.info("stats"), r.info("commandstats"))
        sem = asyncio.Semaphore(32)

        async def lim() -> None:
            async with sem:
                await one()

        await asyncio.gather(*(lim() for _ in range(n)))
        await asyncio.sleep(1.5)
        after: tuple[Any, Any] = (r.info("stats"), r.info("commandstats"))
        cmds = sum(v["calls"] for v in after[1].values()) - sum(
            v["calls"] for v in before[1].values()
        )
        print("commands per request", cmds / n)
        for k, v in after[1].items():
            d = v["calls"] - before[1].get(k, {"calls": 0})["calls"]
            if d:
                print(" ", k, d / n)
        print(
            "bytes in per request",
            (after[0]["total_net_input_bytes"] - before[0]["total_net_input_bytes"]) / n,
        )
        print(
            "bytes out per request",
            (after[0]["total_net_output_bytes"] - before[0]["total_net_output_bytes"]) / n,
        )
        cpu: Any = r.info("cpu")
        print("redis cpu used total s", cpu["used_cpu_sys"] + cpu["used_cpu_user"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.redis_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="measured requests (2000)")
    args = parser.parse_args(argv)
    rport, sport, gport = free(), free(), free()
    tmp = tempfile.mkdtemp()
    with open(f"{tmp}/p.yaml", "w") as fh:
        fh.write(policy(tmp, sport))
    env = {
        **os.environ,
        "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{rport}/0",
        "GATEWAY_ACCESS_LOG": "off",
    }
    procs = [
        subprocess.Popen(
            ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "gateway", "sim", "--port", str(sport), "--speedup", "50"],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", f"{tmp}/p.yaml",
             "--port", str(gport)],
            env=env,
            stdout=subprocess.DEVNULL,
        ),
    ]
    try:
        time.sleep(3)
        asyncio.run(measure(gport, redis.Redis(port=rport), args.requests))
    finally:
        for p in reversed(procs):
            p.terminate()


if __name__ == "__main__":
    main()
