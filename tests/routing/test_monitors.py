"""Engine signals and active checks against a real simulator."""

from __future__ import annotations

import asyncio

from gateway.config import Backend, Health, Pool, Signals, Timeouts
from gateway.http.client import H1Upstream
from gateway.routing.pool import PoolState
from gateway.sim.server import SimServer
from gateway.upstream.monitors import Monitors, parse_engine_metrics


def test_parse_vllm_and_sglang_names() -> None:
    text = b"""# HELP vllm:num_requests_waiting waiting
vllm:num_requests_waiting{model_name="a"} 3.0
vllm:num_requests_waiting{model_name="b"} 2.0
vllm:kv_cache_usage_perc{model_name="a"} 0.25
"""
    assert parse_engine_metrics(text) == (5.0, 0.25)
    old = b'vllm:gpu_cache_usage_perc{model_name="a"} 0.5\n'
    assert parse_engine_metrics(old) == (None, 0.5)
    sglang = b"sglang:num_queue_reqs 7\nsglang:token_usage 0.9\n"
    assert parse_engine_metrics(sglang) == (7.0, 0.9)


async def test_scrape_reads_simulator_queue() -> None:
    """With more requests than slots, the scraped waiting count reaches the backend state."""
    with SimServer("interactive", speedup=1, jitter=0.0, max_running=1) as sim:
        pool = PoolState(Pool(name="p", backends=[Backend(url=sim.url)],
                              signals=Signals(interval=0.05), health=Health(path="/health")))
        upstream = H1Upstream(Timeouts())
        monitors = Monitors([pool], upstream)
        import httpx

        async with httpx.AsyncClient(base_url=sim.url, timeout=10) as client:
            # long answers, so the first is still running when the fourth has arrived however
            # slow the machine; the scrape is repeated until all four are in (or 10 s)
            body = {"model": "m", "max_tokens": 2000,
                    "messages": [{"role": "user", "content": "x"}]}
            reqs = [asyncio.create_task(client.post("/v1/chat/completions", json=body))
                    for _ in range(4)]
            backend = pool.backends[0]
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                await asyncio.sleep(0.05)
                await monitors.scrape(pool, backend)
                if backend.engine_waiting >= 3.0 or asyncio.get_running_loop().time() > deadline:
                    break
            assert backend.engine_waiting == 3.0
            assert await monitors.check(pool, backend) is True
            for r in reqs:
                r.cancel()
        await upstream.close()
