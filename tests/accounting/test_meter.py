"""The meter stage: a request that failed before any output keeps its tokens, costs 0 unless
``prices.bill_failed``; a request that got its answer is metered as before."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from gateway.accounting import CostBreakdown, ModelPrice, PromptCounter
from gateway.accounting.meter import count_prompt, meter, meter_failed
from gateway.config import load_policy
from gateway.runtime import Runtime

PRICE = ModelPrice.parse(input="2.50", cached_input="1.25", output="10")
PAYLOAD = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three rivers of Europe."},
    ],
}
ERROR_BODY = msgspec.json.encode(
    {"error": {"message": "the backend is overloaded", "type": "server_error"}})


async def test_no_answer_at_all_keeps_the_counted_prompt_and_costs_nothing() -> None:
    counter = PromptCounter()
    split = count_prompt(counter, "chat", PAYLOAD)
    usage = await meter_failed(counter, "chat", PAYLOAD, 200, None, None, price=PRICE,
                               batch=False, bill_failed=False)
    assert usage.estimated and usage.output == 0
    assert (usage.system, usage.new, usage.prompt_total) == (split.system, split.new,
                                                             split.total)
    assert usage.prompt_total > 0
    assert usage.cost == CostBreakdown()


async def test_bill_failed_charges_the_tokens() -> None:
    counter = PromptCounter()
    split = count_prompt(counter, "chat", PAYLOAD)
    usage = await meter_failed(counter, "chat", PAYLOAD, 200, split, None, price=PRICE,
                               batch=False, bill_failed=True)
    assert usage.cost is not None and usage.cost.total > 0
    exact = split.total * PRICE.input
    assert abs(usage.cost.total * 1_000_000 - exact) <= 500_000  # one rounding
    assert usage.cost.system + usage.cost.new == usage.cost.total


async def test_an_error_answer_keeps_its_metered_tokens_at_no_cost() -> None:
    """The backend answered an error: meter ran on it; the failure is then unbilled, and a
    backend that reported usage in its error keeps those figures."""
    counter = PromptCounter()
    metered = await meter(counter, "chat", PAYLOAD, 200, None, body=ERROR_BODY, scanner=None,
                          price=PRICE, batch=False)
    assert metered.cost is not None and metered.cost.total > 0  # meter alone would charge
    usage = await meter_failed(counter, "chat", PAYLOAD, 200, None, metered, price=PRICE,
                               batch=False, bill_failed=False)
    assert msgspec.structs.replace(usage, cost=metered.cost) == metered
    assert usage.cost == CostBreakdown()

    reported = msgspec.json.encode({"error": {"message": "cut"},
                                    "usage": {"prompt_tokens": 40, "completion_tokens": 0}})
    metered = await meter(counter, "chat", PAYLOAD, 200, None, body=reported, scanner=None,
                          price=PRICE, batch=False)
    usage = await meter_failed(counter, "chat", PAYLOAD, 200, None, metered, price=PRICE,
                               batch=False, bill_failed=False)
    assert (usage.prompt_total, usage.estimated, usage.cost) == (40, False, CostBreakdown())
    billed = await meter_failed(counter, "chat", PAYLOAD, 200, None, metered, price=PRICE,
                                batch=False, bill_failed=True)
    assert billed == metered


async def test_a_model_without_price_stays_without_cost() -> None:
    counter = PromptCounter()
    usage = await meter_failed(counter, "chat", PAYLOAD, 200, None, None, price=None,
                               batch=False, bill_failed=False)
    assert usage.cost is None and usage.prompt_total > 0


@pytest.mark.parametrize("bill_failed", [True, False, None])
def test_policy_sets_bill_failed(tmp_path: Path, bill_failed: bool | None) -> None:
    """``prices.bill_failed`` in a policy reaches the runtime's price table (default false),
    with the new per-model and per-tenant prices."""
    prices: dict[str, object] = {
        "models": {"m": {"input": "3", "output": "15", "cache_write_input": "3.75",
                         "reasoning": "20"}},
        "tenants": {"t": {"m": {"reasoning": "18"}}},
    }
    if bill_failed is not None:
        prices["bill_failed"] = bill_failed
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump({
        "auth": {"required": False},
        "pools": [{"name": "p", "backends": [{"url": "http://127.0.0.1:9000"}]}],
        "models": [{"name": "m", "pool": "p"}],
        "plans": [{"name": "basic"}],
        "tenants": [{"name": "t", "plan": "basic"}],
        "prices": prices,
    }))
    table = Runtime(load_policy(policy_file)).prices
    assert table.bill_failed is bool(bill_failed)
    base, tenant = table.lookup("m"), table.lookup("m", "t")
    assert base is not None and tenant is not None
    assert (base.cache_write_input, base.reasoning, base.cached_input) == (
        3_750_000, 20_000_000, 3_000_000)
    assert (tenant.cache_write_input, tenant.reasoning) == (3_750_000, 18_000_000)
