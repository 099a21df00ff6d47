"""Redis cost per request: ``python -m loadtest.redis_cost``.

Starts its own redis-server, a simulator and a gateway with quotas (every limit set) and the
ledger in Redis, sends 2,000 requests, and prints the Redis commands (from INFO commandstats,
counting those run inside the Lua scripts) and the bytes per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time

import aiohttp
import redis


def free():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


rport, sport, gport = free(), free(), free()
rd = subprocess.Popen(
    ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
    stdout=subprocess.DEVNULL,
)
sim = subprocess.Popen(
    [sys.executable, "-m", "gateway", "sim", "--port", str(sport), "--speedup", "50"],
    stdout=subprocess.DEVNULL,
)
key = "sk-gw-rediscost-0123456789abcdef0123456789abcdef"
tmp = tempfile.mkdtemp()
cfg = f"""
auth: {{keys: [{{id: k, tenant: t, sha256: {hashlib.sha256(key.encode()).hexdigest()}}}]}}
plans: [{{name: p, limits: {{rpm: 100000000, tpm: 100000000000, concurrency: 100000,
                             tokens_per_day: 100000000000000,
                             tokens_per_month: 100000000000000}}}}]
tenants: [{{name: t, plan: p}}]
store: {{spool_dir: {tmp}/spool}}
pools: [{{name: p, backends: [{{url: "http://127.0.0.1:{sport}", max_in_flight: 1000}}]}}]
models: [{{name: m, pool: p}}]
"""
with open(f"{tmp}/p.yaml", "w") as fh:
    fh.write(cfg)
env = {
    **os.environ,
    "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{rport}/0",
    "GATEWAY_ACCESS_LOG": "off",
}
gw = subprocess.Popen(
    [sys.executable, "-m", "gateway", "serve", "--config", f"{tmp}/p.yaml", "--port", str(gport)],
    env=env,
    stdout=subprocess.DEVNULL,
)
time.sleep(3)
r = redis.Redis(port=rport)
N = 2000


async def main():
    async with aiohttp.ClientSession() as s:
        body = {
            "model": "m",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello there"}],
        }

        async def one():
            async with s.post(
                f"http://127.0.0.1:{gport}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

        for _ in range(20):
            await one()
        time.sleep(1)
        before = (r.info("stats"), r.info("commandstats"))
        sem = asyncio.Semaphore(32)

        async def lim():
            async with sem:
                await one()

        await asyncio.gather(*(lim() for _ in range(N)))
        await asyncio.sleep(1.5)
        after = (r.info("stats"), r.info("commandstats"))
        cmds = sum(v["calls"] for v in after[1].values()) - sum(
            v["calls"] for v in before[1].values()
        )
        print("commands per request", cmds / N)
        for k, v in after[1].items():
            d = v["calls"] - before[1].get(k, {"calls": 0})["calls"]
            if d:
                print(" ", k, d / N)
        print(
            "bytes in per request",
            (after[0]["total_net_input_bytes"] - before[0]["total_net_input_bytes"]) / N,
        )
        print(
            "bytes out per request",
            (after[0]["total_net_output_bytes"] - before[0]["total_net_output_bytes"]) / N,
        )
        cpu = r.info("cpu")
        print("redis cpu used total s", cpu["used_cpu_sys"] + cpu["used_cpu_user"])


try:
    asyncio.run(main())
finally:
    for p in (gw, sim, rd):
        p.terminate()
