"""Prices and costs: hand-computed examples, integer micro-units, no float anywhere."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.accounting import (
    CostBreakdown,
    ModelPrice,
    PriceTable,
    format_micros,
    price_usage,
    to_micros,
)

GPT4O = ModelPrice.parse(input="2.50", cached_input="1.25", output="10.00", batch_factor="0.5")


@pytest.mark.parametrize(
    ("value", "micros"),
    [
        pytest.param("2.50", 2_500_000, id="str"),
        pytest.param(Decimal("0.000001"), 1, id="decimal"),
        pytest.param(3, 3_000_000, id="int"),
        pytest.param(2.5, 2_500_000, id="yaml-float"),
        pytest.param(0.15, 150_000, id="yaml-float-inexact-in-binary"),
    ],
)
def test_to_micros(value: Any, micros: int) -> None:
    assert to_micros(value) == micros
    assert type(to_micros(value)) is int


@pytest.mark.parametrize("value", ["0.0000001", "-1", "abc", "NaN", "Infinity", True])
def test_to_micros_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        to_micros(value)


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        (0, "0.000000"),
        (5, "0.000005"),
        (3_875, "0.003875"),
        (12_345_678, "12.345678"),
        (-5, "-0.000005"),
    ],
)
def test_format_micros(micros: int, text: str) -> None:
    assert format_micros(micros) == text


def test_hand_computed_chat_turn() -> None:
    """system 100, history 1000 (800 cached), new 50, output 200 at 2.50/1.25/10.00 per M:
    system 100*2.5 = 250; history 200*2.5 + 800*1.25 = 1500; new 125; output 2000 -> 3875 µ$."""
    cost = price_usage(GPT4O, system=100, history=1000, new=50, cached=800, output=200)
    assert cost == CostBreakdown(
        system=250, history=1500, new=125, tools=0, output=2000, total=3875, cached=1000
    )
    assert format_micros(cost.total) == "0.003875"


def test_cached_taken_from_history_then_system_then_tools_then_new() -> None:
    price = ModelPrice.parse(input="4", cached_input="1", output="0")
    # 1000 cached over history 300, system 200, tools 100, new 500: 300 + 200 + 100 + 400
    cost = price_usage(price, system=200, history=300, new=500, tools=100, cached=1000)
    assert (cost.history, cost.system, cost.tools) == (300, 200, 100)  # all at 1 µ$/token
    assert cost.new == 400 * 1 + 100 * 4
    assert cost.cached == 1000


def test_half_even_total_and_lines_that_sum() -> None:
    """1 token at 2.5 µ$ rounds to 2 (half to even); 3 tokens (7.5) to 8. Two lines of 2.5
    make a total of 5: floors 2 + 2, the spare micro-unit to the earlier line on a tie."""
    assert price_usage(GPT4O, new=1).total == 2
    assert price_usage(GPT4O, new=3).total == 8
    cost = price_usage(GPT4O, system=1, new=1)
    assert (cost.system, cost.new, cost.total) == (3, 2, 5)


def test_batch_factor() -> None:
    full = price_usage(GPT4O, new=1000, output=1000)
    half = price_usage(GPT4O, new=1000, output=1000, batch=True)
    assert (full.new, full.output, full.total) == (2500, 10000, 12500)
    assert (half.new, half.output, half.total) == (1250, 5000, 6250)
    assert GPT4O.batch_factor == (1, 2)


@given(
    tokens=st.tuples(*[st.integers(min_value=0, max_value=10**7)] * 5),
    cached=st.integers(min_value=0, max_value=10**7),
    prices=st.tuples(*[st.integers(min_value=0, max_value=10**8)] * 3),
    batch=st.booleans(),
)
def test_lines_sum_to_total_and_are_ints(
    tokens: tuple[int, ...], cached: int, prices: tuple[int, int, int], batch: bool
) -> None:
    system, history, new, tools, output = tokens
    price = ModelPrice(
        input=prices[0], cached_input=prices[1], output=prices[2], batch_factor=(3, 7)
    )
    cost = price_usage(
        price,
        system=system,
        history=history,
        new=new,
        tools=tools,
        cached=cached,
        output=output,
        batch=batch,
    )
    lines = (cost.system, cost.history, cost.new, cost.tools, cost.output)
    assert sum(lines) == cost.total
    assert all(type(v) is int and v >= 0 for v in (*lines, cost.total, cost.cached))


POLICY = {
    "currency": "EUR",
    "batch_factor": "0.5",
    "models": {
        "gpt-4o": {"input": "2.50", "cached_input": "1.25", "output": "10"},
        "small": {"input": 0.15, "output": 0.6},
    },
    "tenants": {"acme": {"gpt-4o": {"output": "8"}, "small": {"input": "0.1", "output": "0.5"}}},
}


def test_table_from_policy_with_tenant_overrides() -> None:
    table = PriceTable.from_mapping(POLICY)
    assert table.currency == "EUR"
    base = table.lookup("gpt-4o")
    acme = table.lookup("gpt-4o", "acme")
    assert base is not None and acme is not None
    assert (base.input, base.cached_input, base.output) == (2_500_000, 1_250_000, 10_000_000)
    assert (acme.input, acme.cached_input, acme.output) == (2_500_000, 1_250_000, 8_000_000)
    small = table.lookup("small")
    assert small is not None and small.cached_input == small.input == 150_000
    assert small.batch_factor == (1, 2)
    assert table.lookup("small", "other") == small
    assert table.lookup("unknown") is None
    assert repr(table) == "<PriceTable [2 models | 1 tenants with overrides | EUR]>"


def test_table_rejects_incomplete_entry() -> None:
    with pytest.raises(ValueError, match="output"):
        PriceTable.from_mapping({"models": {"m": {"input": "1"}}})
    with pytest.raises(ValueError):
        ModelPrice.parse(input="1", output="1", batch_factor="1.5")
