"""Load shedding through a real gateway process and a simulated engine (HTTP sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}


def _chat(tokens: int, max_tokens: int = 1) -> dict[str, object]:
    return {"model": "chat-model", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": " the" * tokens}]}


async def test_a_backlogged_pool_answers_503_with_retry_after_at_once(tmp_path: Path) -> None:
    """A 200,000-token prompt is prefilling (seconds of work ahead at any plausible rate): the
    next interactive request, whose class may wait 1 s, is refused with 503, a Retry-After and
    the OpenAI error shape, and the refusal is counted by class and reason. Before it, the same
    pool with nothing ahead sent the huge prompt itself (room: never shed)."""
    with SimServer("interactive", speedup=1, jitter=0.0) as sim:
        data = policy({"chat": [sim.url]})
        data["pools"][0]["shed"] = {"margin": 0.8}
        data["classes"] = [{"name": "interactive", "priority": 0, "start_deadline": 1.0},
                           {"name": "batch", "priority": 10, "start_deadline": 600}]
        with GatewayProcess(tmp_path, data) as gw:
            async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=60) as client:
                big = asyncio.create_task(
                    client.post("/v1/chat/completions", json=_chat(200_000)))
                while sim.engine.num_running + sim.engine.num_waiting == 0:  # the pool sent it
                    assert not big.done(), big.result()
                    await asyncio.sleep(0.01)
                small = await client.post("/v1/chat/completions", json=_chat(10))
                assert small.status_code == 503
                assert int(small.headers["retry-after"]) >= 1
                error = small.json()["error"]
                assert error["code"] == "no_backend_available"
                assert "overloaded" in error["message"]
                metrics = (await client.get("/metrics")).text
                big.cancel()
    assert ('gateway_shed_total{class="interactive",model="chat-model",pool="chat",'
            'reason="deadline"} 1.0') in metrics
