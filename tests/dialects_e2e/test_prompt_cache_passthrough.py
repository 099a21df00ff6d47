"""Prompt caching survives the gateway: ``cache_control`` reaches a backend that speaks the
Messages API unchanged, so a 20-turn agent session reads from the backend's prompt cache through
the gateway as it does going direct, and the records carry those cache reads and writes.

The backend is the simulator's Messages API, whose prompt cache honours ``cache_control``
breakpoints as Anthropic's does (``cache_creation_input_tokens`` on a write,
``cache_read_input_tokens`` on a hit). The same session runs twice, each on a simulator of its
own: straight to it, and through the gateway (the tenant's cache salt keeps the session's
entries its own, and within a tenant changes nothing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anthropic
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, wait_usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-cache-passthrough"
TURNS = 20
SYSTEM = [{"type": "text", "text": "You are a careful coding agent. " * 120,
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "bash", "description": "Run a shell command. " * 40,
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
          "cache_control": {"type": "ephemeral"}}]


def _session(client: anthropic.Anthropic) -> list[dict[str, int]]:
    """An agent loop's shape: every turn re-sends the system prompt, the tools and the whole
    conversation, with a breakpoint on the last message (as Claude Code marks it)."""
    history: list[dict[str, Any]] = []
    usages = []
    for turn in range(TURNS):
        history.append({"role": "user", "content": [
            {"type": "text", "text": f"step {turn}: " + "look at the next file. " * 20,
             "cache_control": {"type": "ephemeral"}}]})
        sent = [dict(m) for m in history]
        for m in sent[:-1]:  # only the newest message carries the moving breakpoint
            m["content"] = [{k: v for k, v in block.items() if k != "cache_control"}
                            for block in m["content"]]
        answer = client.messages.create(model="chat-model", max_tokens=16, system=SYSTEM,
                                        tools=TOOLS, tool_choice={"type": "none"},
                                        messages=sent)
        usages.append({"read": answer.usage.cache_read_input_tokens or 0,
                       "write": answer.usage.cache_creation_input_tokens or 0,
                       "input": answer.usage.input_tokens})
        history.append({"role": "assistant",
                        "content": [{"type": "text", "text": answer.content[0].text}]})  # type: ignore[union-attr]
    return usages


def test_cache_reads_through_the_gateway_equal_going_direct(tmp_path: Path) -> None:
    with SimServer("interactive", speedup=50, jitter=0.0) as direct_sim:
        direct = _session(anthropic.Anthropic(base_url=direct_sim.url, api_key="x",
                                              max_retries=0))
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=50, jitter=0.0) as sim:
            data = policy({"chat": [sim.url]})
            data["pools"][0]["backends"][0]["api"] = ["chat", "messages"]
            data["auth"]["keys"][0]["tenant"] = "acme"
            data["plans"] = [{"name": "p", "limits": {"rpm": 10_000}}]
            data["tenants"] = [{"name": "acme", "plan": "p"}]
            data["prices"] = {"models": {"chat-model": {
                "input": "3", "output": "15", "cached_input": "0.3", "cache_write_input": "3.75"}}}
            with GatewayProcess(tmp_path, data) as gw:
                through = _session(anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY,
                                                       max_retries=0))
                records = _records(gw, TURNS)
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
    direct_reads = sum(u["read"] for u in direct)
    through_reads = sum(u["read"] for u in through)
    assert direct_reads > 0 and sum(u["write"] for u in direct) > 0  # the cache was used
    # within 1% of going direct (the same backend, the same requests: equal in practice)
    assert abs(through_reads - direct_reads) <= 0.01 * direct_reads, (through_reads, direct_reads)
    assert sum(u["write"] for u in through) == sum(u["write"] for u in direct)
    # the records hold what the client was told, in the cache buckets, billed at cache prices
    assert [r["cached"] for r in records] == [u["read"] for u in through]
    assert [r["cache_write"] for r in records] == [u["write"] for u in through]
    hits = [r for r in records if r["cached"] > 0]
    assert hits and all(r["cost_cached"] > 0 for r in hits)


def _records(gw: GatewayProcess, n: int) -> list[dict[str, Any]]:
    rows = wait_usage_records(gw.url, ADMIN, lambda rows: len(rows) >= n, within=15)
    return sorted(rows, key=lambda x: x["ts_ms"])[-n:]
