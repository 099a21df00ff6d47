"""Load check (not a test): can one simulator process hold thousands of open streams?

Starts ``python -m gateway.sim`` in a child process, opens N concurrent streaming chat requests
with aiohttp, and reports how many were open at once, tokens received, the simulator's CPU time
and its step lag (how late its step timer fired on average; near the timer granularity means the
model, not the process, sets the pace).

    .venv/bin/python -m tests.sim.stream_load --streams 2000 --speedup 5 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass

import aiohttp
import uvloop

from gateway.sim.server import spawn
from tests.ports import free_port

__all__ = ["main"]

_PROMPT = "Summarise the following notes about continuous batching. " * 80  # ~800 tokens


@dataclass
class Result:
    ok: bool = False
    headers_at: float = 0.0
    first_at: float = 0.0
    done_at: float = 0.0
    tokens: int = 0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(session: aiohttp.ClientSession, url: str, max_tokens: int, r: Result) -> None:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with session.post(url, json=body) as resp:
        r.headers_at = time.perf_counter()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"content":"' in line and b'"content":""' not in line:
                r.tokens += 1
                if r.tokens == 1:
                    r.first_at = time.perf_counter()
        r.ok = resp.status == 200 and r.tokens == max_tokens
    r.done_at = time.perf_counter()


async def _run(args: argparse.Namespace, base: str, pid: int) -> dict[str, object]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for _ in range(200):
            try:
                async with session.get(base + "/health") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        results = [Result() for _ in range(args.streams)]
        cpu0 = _cpu_seconds(pid)
        client0 = time.process_time()
        start = time.perf_counter()
        url = base + "/v1/chat/completions"
        tasks = [asyncio.create_task(_one(session, url, args.max_tokens, r)) for r in results]
        # Peak concurrently open streams: headers received and not yet finished.
        peak, peak_waiting, all_open_at = 0, 0, 0.0
        first_stats: dict[str, float] = {}
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
            open_now = sum(1 for r in results if r.headers_at and not r.done_at)
            if open_now > peak:
                peak = open_now
                async with session.get(base + "/sim/stats") as resp:
                    snap = await resp.json()
                peak_waiting = snap["waiting"]
                if peak == args.streams:
                    all_open_at = time.perf_counter() - start
                    first_stats = snap
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - start
        cpu = _cpu_seconds(pid) - cpu0
        client_cpu = time.process_time() - client0
        async with session.get(base + "/sim/stats") as resp:
            stats = await resp.json()
    # Step lag once every stream is open (excludes the arrival burst's prompt counting).
    steady_steps = stats["steps"] - first_stats.get("steps", 0)
    steady_lag = (
        stats["step_lag_ms_mean"] * stats["steps"]
        - first_stats.get("step_lag_ms_mean", 0.0) * first_stats.get("steps", 0)
    ) / max(steady_steps, 1)
    ttft = sorted(r.first_at - start for r in results if r.first_at)
    tokens = sum(r.tokens for r in results)
    return {
        "streams": args.streams,
        "ok": sum(r.ok for r in results),
        "peak_open_streams": peak,
        "all_open_after_s": round(all_open_at, 2) if all_open_at else None,
        "waiting_at_peak": peak_waiting,
        "wall_s": round(wall, 2),
        "tokens_received": tokens,
        "tokens_per_s": round(tokens / wall),
        "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
        "ttft_max_s": round(ttft[-1], 3) if ttft else None,
        "sim_cpu_s": round(cpu, 2),
        "sim_cpu_util": round(cpu / wall, 2),
        "client_cpu_util": round(client_cpu / wall, 2),
        "sim_steps": stats["steps"],
        "sim_step_lag_ms_mean": round(stats["step_lag_ms_mean"], 3),
        "sim_step_lag_ms_mean_all_open": round(steady_lag, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speedup", type=float, default=5.0)
    parser.add_argument("--profile", default="batch")
    parser.add_argument("--port", type=int, help="use a simulator already running here")
    parser.add_argument("--pid", type=int, help="its process id (for CPU time)")
    args = parser.parse_args()
    if args.port:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(_run(args, f"http://127.0.0.1:{args.port}", args.pid))
        print(json.dumps(report, indent=2))
        return
    port = free_port()
    proc = spawn(port, args.profile, "--speedup", str(args.speedup), "--queue-limit", "100000")
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(_run(args, f"http://127.0.0.1:{port}", proc.pid))
    finally:
        proc.terminate()
        proc.wait(10)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
