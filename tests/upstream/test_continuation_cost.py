"""The price of a stream's continuation (issue 38): its prompt (the prompt again plus the text
already sent) is recorded as ``continuation_cost``, at the model's uncached input price, on
every continued stream (the operator's cost line); ``continuation.billed`` decides whether the
tenant pays it too (in the record's ``cost_micros`` and its spend budget's settle) or not (the
default: the tenant pays what an unbroken stream with the same output costs).

In-process, like ``tests/pipeline``: the app's real state (memory quota store, embedded
ledger) and two simulated engines on sockets: ``faulty`` (picked first) breaks its streams
after a few tokens when told to, ``good`` continues them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.accounting.meter import add_continuation
from gateway.accounting.prices import ModelPrice, price_continuation
from gateway.accounting.split import PromptSplit
from gateway.accounting.tokens import account
from gateway.app.state import Gateway
from gateway.dialects.shape import ENDPOINTS
from gateway.ledger import UsageRecord
from gateway.pipeline import Inbound
from gateway.sim.faults import FaultConfig
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, policy
from tests.pipeline.common import Answer, records, running

CHAT = ENDPOINTS["/v1/chat/completions"]
TOKENS = 8
#: micro-units per token (the prices are per million tokens)
INPUT, OUTPUT = 3, 5


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimServer, SimServer]]:
    with (SimServer("interactive", speedup=50, jitter=0.0) as faulty,
          SimServer("interactive", speedup=50, jitter=0.0) as good):
        yield faulty, good


@asynccontextmanager
async def _gateway(sims: tuple[SimServer, SimServer], tmp: Path,
                   continuation: dict[str, Any]) -> AsyncIterator[Gateway]:
    faulty, good = sims
    data = policy({"chat": [faulty.url, good.url]})
    pool = data["pools"][0]
    pool["backends"][0]["name"], pool["backends"][1]["name"] = "faulty", "good"
    pool["backends"][1]["weight"] = 0.01  # picked only once ``faulty`` is excluded
    pool["health"] = {"eject_after": 1000}
    pool["continuation"] = {"enabled": True, **continuation}
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"cost_per_day": "100"}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": str(INPUT), "output": str(OUTPUT)}}}
    data["store"] = {"spool_dir": str(tmp / "spool"), "data_dir": str(tmp / "data")}
    async with running(data) as gw:
        yield gw


def _break_after(sim: SimServer, tokens: int | None) -> None:
    """The simulator's streams break after ``tokens`` tokens (None: they do not)."""
    sim.app.config = dataclasses.replace(sim.app.config,
                                         faults=FaultConfig(disconnect_after=tokens))


async def _stream(gw: Gateway) -> UsageRecord:
    """One streamed chat answer, read whole; its usage record, once its settle ran."""
    raw = json.dumps({"model": "chat-model", "max_tokens": TOKENS, "stream": True,
                      "messages": [{"role": "user", "content": "tell me something"}]}).encode()

    async def read(limit: int) -> bytes:
        return raw

    answer = Answer()
    await gw.pipeline.run(Inbound(method="POST", endpoint=CHAT, read_body=read,
                                  headers=[(b"authorization", f"Bearer {TEST_KEY}".encode())]),
                          answer)
    assert answer.status == 200 and b'"error"' not in answer.body, answer.body
    if gw.settles:  # the settle runs in the background once the answer is complete
        await asyncio.wait(set(gw.settles))
    request_id = answer.headers[b"x-request-id"].decode()
    [record] = [r for r in await records(gw) if r.request_id == request_id]
    return record


async def _unbroken_and_continued(gw: Gateway, faulty: SimServer
                                  ) -> tuple[UsageRecord, UsageRecord]:
    unbroken = await _stream(gw)
    _break_after(faulty, 3)
    try:
        continued = await _stream(gw)
    finally:
        _break_after(faulty, None)
    assert not unbroken.continued and unbroken.continuation_cost == 0
    assert continued.continued and continued.backend == "good", continued
    assert continued.output == unbroken.output == TOKENS
    assert continued.prompt_total == unbroken.prompt_total
    # the continuation's prompt: the prompt again, plus the 3 tokens sent before the break
    assert continued.continuation_prompt >= continued.prompt_total + 3
    # the operator's cost line, at the input price, whatever the policy bills
    assert continued.continuation_cost == continued.continuation_prompt * INPUT > 0
    return unbroken, continued


def _spent(gw: Gateway) -> Any:
    return gw.quota.usage("acme", "cost")


def _prompt_tokens_counted(gw: Gateway) -> float | None:
    return gw.metrics.registry.get_sample_value(
        "gateway_stream_continuation_prompt_tokens_total", {"pool": "chat"})


async def test_by_default_the_continuation_is_priced_for_the_operator_only(
        sims: tuple[SimServer, SimServer], tmp_path: Path) -> None:
    """Not billed (the default): the record's cost is the unbroken stream's for the same
    output, and so is what the tenant's spend budget is charged."""
    async with _gateway(sims, tmp_path, {}) as gw:
        unbroken, continued = await _unbroken_and_continued(gw, sims[0])
        expected = continued.prompt_total * INPUT + continued.output * OUTPUT
        assert continued.cost_micros == unbroken.cost_micros == expected
        spent = await _spent(gw)
        assert spent.tokens_today == unbroken.cost_micros + continued.cost_micros
        assert _prompt_tokens_counted(gw) == continued.continuation_prompt


async def test_billed_the_continuation_is_in_the_tenants_cost_and_budget(
        sims: tuple[SimServer, SimServer], tmp_path: Path) -> None:
    """``billed: true``: the record's cost (and the quota settle, and so the tenant's spend
    budget) carries the continuation's price on top of the unbroken stream's."""
    async with _gateway(sims, tmp_path, {"billed": True}) as gw:
        unbroken, continued = await _unbroken_and_continued(gw, sims[0])
        assert continued.cost_micros == unbroken.cost_micros + continued.continuation_cost
        spent = await _spent(gw)
        assert spent.tokens_today == unbroken.cost_micros + continued.cost_micros


# -- the pricing itself -------------------------------------------------------------------------

PRICE = ModelPrice.parse(input="2.5", cached_input="1", output="10", batch_factor="0.5")


def test_the_continuation_is_priced_at_the_uncached_input_price() -> None:
    """Half-even rounded micro-units; the batch factor applies to batch requests as it does
    to their input."""
    assert price_continuation(PRICE, 1_000) == 2_500
    assert price_continuation(PRICE, 1) == 2  # 2.5 -> 2, half to even
    assert price_continuation(PRICE, 3) == 8  # 7.5 -> 8
    assert price_continuation(PRICE, 1_000, batch=True) == 1_250
    assert price_continuation(PRICE, -5) == 0


@pytest.mark.parametrize("billed", [False, True])
def test_the_meter_adds_the_continuation_line_billed_or_not(billed: bool) -> None:
    usage = account(PromptSplit(system=10, new=30), None, estimated_output=4, price=PRICE)
    assert usage.cost is not None
    priced = add_continuation(usage, 40 + 3, PRICE, batch=False, billed=billed)
    assert priced.cost is not None
    assert priced.cost.continuation == price_continuation(PRICE, 43) == 108  # 107.5 -> 108
    assert priced.cost.total == usage.cost.total + (108 if billed else 0)
    assert _lines(priced) == _lines(usage)  # no line moves
    # nothing to price: no continuation, or no price for the model
    assert add_continuation(usage, 0, PRICE, batch=False, billed=billed) is usage
    assert add_continuation(usage, 43, None, batch=False, billed=billed) is usage


def _lines(usage: Any) -> tuple[int, ...]:
    """The cost lines other than the continuation's and the total."""
    c = usage.cost
    return (c.system, c.history, c.new, c.tools, c.output, c.reasoning, c.cached,
            c.cache_write)
