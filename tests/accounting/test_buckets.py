"""Usage buckets: every token in exactly one bucket, whatever shape the backend answers in.

Input splits by cache (uncached, cache read, cache write) and by role (system, history, new,
tools); output into visible and reasoning. Both input rows sum to the backend's prompt total,
the output row to its completion total, and the cost is the sum of the buckets at their prices:
the invariant is checked for random payloads of every shape and random prices. The named tests
pin the bug many peer projects shipped: cached tokens priced inside the prompt total at the
input rate and again beside it at the cached rate.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.accounting import (
    BackendUsage,
    CostBreakdown,
    ModelPrice,
    PriceTable,
    PromptSplit,
    StreamScanner,
    TokenUsage,
    account,
    price_usage,
    usage_from_body,
    usage_from_mapping,
)
from gateway.accounting.prices import MICROS
from gateway.accounting.usage import Shape, checked_usage

# per million tokens: input 2.50, cache read 1.25, cache write 3.75, output 10, reasoning 12
PRICE = ModelPrice.parse(input="2.50", cached_input="1.25", cache_write_input="3.75",
                         output="10", reasoning="12")
SPLIT = PromptSplit(system=100, history=700, new=200)  # the gateway's own count: 1000


def cost_of(body: dict[str, Any], shape: Shape = "openai", price: ModelPrice = PRICE,
            split: PromptSplit = SPLIT) -> TokenUsage:
    """Account a non-streamed answer whose body carries ``usage``."""
    reported = usage_from_body(msgspec.json.encode({"id": "x", **body}), shape)
    assert reported is not None
    return account(split, reported, price=price)


def micros(tokens: int, price_per_million: str) -> int:
    """Hand arithmetic: tokens at a price per million, in micro-units (exact here)."""
    from decimal import Decimal

    value = Decimal(tokens) * Decimal(price_per_million)
    assert value == value.to_integral_value()
    return int(value)


# --- the peers' bug -------------------------------------------------------------------------


def test_cached_tokens_are_not_counted_twice() -> None:
    """OpenAI: prompt_tokens 1000 *includes* the 800 cached. The cost is 200 at the input rate
    plus 800 at the cached rate (1500 µ$), never all 1000 at input plus 800 cached again
    (3500 µ$), and the prompt total stays 1000, not 1800."""
    usage = cost_of({"usage": {"prompt_tokens": 1000, "completion_tokens": 0,
                               "prompt_tokens_details": {"cached_tokens": 800}}})
    assert usage.cost is not None
    assert usage.cost.total == micros(200, "2.50") + micros(800, "1.25") == 1500
    assert usage.cost.total != micros(1000, "2.50") + micros(800, "1.25")
    assert (usage.prompt_total, usage.cached, usage.cache_write) == (1000, 800, 0)
    assert usage.cost.cached == micros(800, "1.25")


def test_cached_tokens_under_two_names_are_not_counted_twice() -> None:
    """LiteLLM-style answers give the cache read twice (``prompt_tokens_details.cached_tokens``
    and the top-level ``cache_read_input_tokens``) and the write beside ``prompt_tokens``,
    which already includes both: one read of 800, one write of 100, 100 uncached."""
    usage = cost_of({"usage": {
        "prompt_tokens": 1000, "completion_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 800},
        "cache_read_input_tokens": 800, "cache_creation_input_tokens": 100,
    }})
    assert (usage.prompt_total, usage.cached, usage.cache_write) == (1000, 800, 100)
    assert usage.cost is not None
    assert usage.cost.total == micros(100, "2.50") + micros(800, "1.25") + micros(100, "3.75")


def test_deepseek_cache_hit_is_part_of_the_prompt() -> None:
    """DeepSeek: prompt_tokens = prompt_cache_hit_tokens + prompt_cache_miss_tokens."""
    usage = cost_of({"usage": {"prompt_tokens": 1000, "completion_tokens": 0,
                               "prompt_cache_hit_tokens": 800, "prompt_cache_miss_tokens": 200}})
    assert (usage.prompt_total, usage.cached) == (1000, 800)
    assert usage.cost is not None and usage.cost.total == 1500
    # without prompt_tokens, hit + miss is the prompt total
    bare = cost_of({"usage": {"completion_tokens": 0, "prompt_cache_hit_tokens": 800,
                              "prompt_cache_miss_tokens": 200}})
    assert (bare.prompt_total, bare.cached) == (1000, 800)


def test_openrouter_cache_write_is_part_of_the_prompt() -> None:
    usage = cost_of({"usage": {"prompt_tokens": 1000, "completion_tokens": 0,
                               "prompt_tokens_details": {"cached_tokens": 600,
                                                         "cache_write_tokens": 300}}})
    assert (usage.prompt_total, usage.cached, usage.cache_write) == (1000, 600, 300)
    assert usage.cost is not None
    assert usage.cost.total == micros(100, "2.50") + micros(600, "1.25") + micros(300, "3.75")
    assert usage.cost.cache_write == micros(300, "3.75")


def test_anthropic_cache_tokens_are_added_not_counted_twice() -> None:
    """Anthropic Messages: input_tokens (200) *excludes* the cache read (800) and write (100).
    The prompt total is their sum, 1100, each priced once; not 200 with the cache clamped into
    it, and not 1100 at the input rate with the cache priced again beside it."""
    body = {"type": "message", "usage": {"input_tokens": 200, "output_tokens": 50,
                                         "cache_read_input_tokens": 800,
                                         "cache_creation_input_tokens": 100}}
    usage = cost_of(body, "anthropic")
    assert (usage.prompt_total, usage.cached, usage.cache_write, usage.output) == (
        1100, 800, 100, 50)
    assert usage.system + usage.history + usage.new + usage.tools == 1100
    expected = (micros(200, "2.50") + micros(800, "1.25") + micros(100, "3.75")
                + micros(50, "10"))
    assert usage.cost is not None and usage.cost.total == expected
    double = micros(1100, "2.50") + micros(800, "1.25") + micros(100, "3.75") + micros(50, "10")
    assert usage.cost.total != double


def test_anthropic_write_by_lifetime_and_from_a_parsed_event() -> None:
    """Only ``cache_creation.ephemeral_*`` given: their sum is the write. A ``message_start``
    event's usage, already parsed, maps the same way."""
    by_ttl = {"input_tokens": 10, "output_tokens": 1,
              "cache_creation": {"ephemeral_5m_input_tokens": 30,
                                 "ephemeral_1h_input_tokens": 20}}
    assert usage_from_mapping(by_ttl, "anthropic") == BackendUsage(
        prompt_tokens=60, completion_tokens=1, total_tokens=61, cache_write_tokens=50)
    assert usage_from_mapping({"input_tokens": -1}, "anthropic") is None
    assert checked_usage({"input_tokens": -1}, "anthropic") == BackendUsage(
        rejected="negative:input_tokens")


def test_responses_usage() -> None:
    """Responses: input_tokens includes cached_tokens, output_tokens includes reasoning."""
    body = {"object": "response", "usage": {
        "input_tokens": 1000, "input_tokens_details": {"cached_tokens": 800},
        "output_tokens": 500, "output_tokens_details": {"reasoning_tokens": 300},
        "total_tokens": 1500}}
    usage = cost_of(body, "responses")
    assert (usage.prompt_total, usage.cached, usage.output, usage.reasoning) == (
        1000, 800, 500, 300)
    assert usage.cost is not None
    assert usage.cost.output == micros(200, "10")
    assert usage.cost.reasoning == micros(300, "12")
    assert usage.cost.total == 1500 + micros(200, "10") + micros(300, "12")


def test_reasoning_has_its_own_line_and_price() -> None:
    """completion_tokens 500 includes 300 reasoning: the output line is the 200 visible."""
    usage = cost_of({"usage": {"prompt_tokens": 0, "completion_tokens": 500,
                               "completion_tokens_details": {"reasoning_tokens": 300}}})
    assert (usage.output, usage.reasoning) == (500, 300)
    assert usage.cost == CostBreakdown(output=2000, reasoning=3600, total=5600)


def test_defaults_cache_write_at_input_and_reasoning_at_output() -> None:
    price = ModelPrice.parse(input="2", output="8")
    cost = price_usage(price, new=100, cache_write=40, output=10, reasoning=4)
    assert cost.total == micros(100, "2") + micros(10, "8")
    assert cost.cache_write == micros(40, "2")
    built = ModelPrice(input=2_000_000, cached_input=1_000_000, output=8_000_000)
    assert built.write_rate == 2_000_000 and built.reasoning_rate == 8_000_000
    assert price_usage(built, new=100, cache_write=40, output=10, reasoning=4).total == (
        cost.total)


def test_cache_write_taken_in_prompt_order_after_the_read() -> None:
    """Reads come from history first; writes from what is left, system, tools, history, new."""
    price = ModelPrice.parse(input="1", cached_input="0", cache_write_input="10", output="0")
    cost = price_usage(price, system=50, history=300, new=100, tools=20, cached=310,
                       cache_write=80)
    # read: history 300, system 10; write: system 40, tools 20, history 0, new 20
    assert cost.system == 40 * 10
    assert cost.tools == 20 * 10
    assert cost.history == 0
    assert cost.new == 20 * 10 + 80 * 1
    assert cost.cache_write == 80 * 10


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -5},
                      "completion_tokens": 4, "completion_tokens_details":
                      {"reasoning_tokens": -1}},
                     BackendUsage(rejected="negative:cached_tokens"), id="negative-details"),
        pytest.param({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 12}},
                     BackendUsage(prompt_tokens=10, cached_tokens=10, overstated=12),
                     id="read-over-prompt"),
        pytest.param({"prompt_tokens": 10, "cache_read_input_tokens": 6,
                      "cache_creation_input_tokens": 9},
                     BackendUsage(prompt_tokens=10, cached_tokens=6, cache_write_tokens=4,
                                  overstated=9),
                     id="write-over-what-is-left"),
        pytest.param({"prompt_tokens": 0, "completion_tokens": 3, "completion_tokens_details":
                      {"reasoning_tokens": 7}},
                     BackendUsage(completion_tokens=3, reasoning_tokens=3, overstated=7),
                     id="reasoning-over-completion"),
        pytest.param({"prompt_tokens": 10, "completion_tokens": -1},
                     BackendUsage(rejected="negative:completion_tokens"), id="negative-total"),
        pytest.param({"prompt_tokens": 1.5}, BackendUsage(rejected="not_integer:prompt_tokens"),
                     id="fractional-total"),
        pytest.param({"completion_tokens": 3}, BackendUsage(rejected="missing:prompt_tokens"),
                     id="no-prompt-total"),
    ],
)
def test_nonsense_is_clamped_or_refused(usage: dict[str, Any], expected: BackendUsage) -> None:
    assert usage_from_body(msgspec.json.encode({"usage": usage})) == expected
    assert checked_usage(usage) == expected
    assert usage_from_mapping(usage) == (None if expected.rejected else expected)


def test_account_clamps_a_hand_built_report() -> None:
    reported = BackendUsage(prompt_tokens=100, completion_tokens=5, cached_tokens=90,
                            cache_write_tokens=90, reasoning_tokens=9)
    usage = account(SPLIT, reported, price=PRICE)
    assert (usage.cached, usage.cache_write, usage.reasoning) == (90, 10, 5)


# --- the invariant, for random payloads of every shape and random prices ---------------------

counts = st.integers(min_value=0, max_value=10**7)
maybe = st.none() | counts
rates = st.integers(min_value=0, max_value=10**8)


@st.composite
def openai_payloads(draw: st.DrawFn, consistent: bool) -> tuple[dict[str, Any], BackendUsage]:
    """An OpenAI-shaped usage (with any of the compatible backends' extra names) and what it
    means. ``consistent``: the parts fit their totals, so they must be read back exactly."""
    prompt, completion = draw(counts), draw(counts)
    read = draw(st.integers(0, prompt)) if consistent else draw(counts)
    write = draw(st.integers(0, prompt - read)) if consistent else draw(counts)
    reasoning = draw(st.integers(0, completion)) if consistent else draw(counts)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    details: dict[str, Any] = {}
    # the read under one or more of its names (aliases carry the same count)
    for name in draw(st.sets(st.sampled_from(["details", "top", "deepseek"]), min_size=1)):
        if name == "details":
            details["cached_tokens"] = read
        elif name == "top":
            usage["cache_read_input_tokens"] = read
        else:
            usage["prompt_cache_hit_tokens"] = read
            usage["prompt_cache_miss_tokens"] = max(0, prompt - read)
    write_names = draw(st.sets(st.sampled_from(["openrouter", "litellm", "top"])))
    for name in write_names:
        if name == "openrouter":
            details["cache_write_tokens"] = write
        elif name == "litellm":
            details["cache_creation_tokens"] = write
        else:
            usage["cache_creation_input_tokens"] = write
    empty_details = draw(st.booleans())  # an empty object must read like an absent one
    if details or empty_details:
        usage["prompt_tokens_details"] = details
    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage, BackendUsage(prompt_tokens=prompt, completion_tokens=completion,
                               total_tokens=prompt + completion, cached_tokens=read,
                               cache_write_tokens=write if write_names else 0,
                               reasoning_tokens=reasoning)


@st.composite
def anthropic_payloads(draw: st.DrawFn) -> tuple[dict[str, Any], BackendUsage]:
    uncached, read, write, output = draw(counts), draw(counts), draw(counts), draw(counts)
    usage: dict[str, Any] = {"input_tokens": uncached, "output_tokens": output}
    if read or draw(st.booleans()):
        usage["cache_read_input_tokens"] = read
    if write or draw(st.booleans()):
        usage["cache_creation_input_tokens"] = write
    prompt = uncached + read + write
    return usage, BackendUsage(prompt_tokens=prompt, completion_tokens=output,
                               total_tokens=prompt + output, cached_tokens=read,
                               cache_write_tokens=write)


@st.composite
def responses_payloads(draw: st.DrawFn) -> tuple[dict[str, Any], BackendUsage]:
    prompt, completion = draw(counts), draw(counts)
    read, reasoning = draw(st.integers(0, prompt)), draw(st.integers(0, completion))
    usage = {"input_tokens": prompt, "output_tokens": completion,
             "total_tokens": prompt + completion,
             "input_tokens_details": {"cached_tokens": read},
             "output_tokens_details": {"reasoning_tokens": reasoning}}
    return usage, BackendUsage(prompt_tokens=prompt, completion_tokens=completion,
                               total_tokens=prompt + completion, cached_tokens=read,
                               reasoning_tokens=reasoning)


payloads = st.one_of(
    st.tuples(st.just("openai"), openai_payloads(consistent=True)),
    st.tuples(st.just("anthropic"), anthropic_payloads()),
    st.tuples(st.just("responses"), responses_payloads()),
)

prices = st.builds(
    ModelPrice,
    input=rates, cached_input=rates, output=rates,
    cache_write_input=st.none() | rates, reasoning=st.none() | rates,
    batch_factor=st.sampled_from([(1, 1), (1, 2), (3, 7)]),
)

splits = st.builds(PromptSplit, system=counts, history=counts, new=counts, tools=counts)


def half_even(numerator: int, denominator: int) -> int:
    """Reference rounding, written apart from the module's own."""
    from fractions import Fraction

    return round(Fraction(numerator, denominator))  # Fraction rounds half to even


def check_buckets(usage: TokenUsage, reported: BackendUsage, price: ModelPrice,
                  batch: bool) -> None:
    """The three bucket rows sum to the backend's totals; the cost is the sum of the buckets."""
    prompt, completion = reported.prompt_tokens, reported.completion_tokens
    assert usage.system + usage.history + usage.new + usage.tools == usage.prompt_total == prompt
    uncached = usage.prompt_total - usage.cached - usage.cache_write
    assert min(uncached, usage.cached, usage.cache_write) >= 0
    visible = usage.output - usage.reasoning
    assert usage.output == completion and min(visible, usage.reasoning) >= 0
    cost = usage.cost
    assert cost is not None
    lines = (cost.system, cost.history, cost.new, cost.tools, cost.output, cost.reasoning)
    assert sum(lines) == cost.total
    assert all(type(v) is int and v >= 0 for v in (*lines, cost.cached, cost.cache_write))
    num, den = price.batch_factor if batch else (1, 1)
    write_rate = price.input if price.cache_write_input is None else price.cache_write_input
    think_rate = price.output if price.reasoning is None else price.reasoning
    exact = (uncached * price.input + usage.cached * price.cached_input
             + usage.cache_write * write_rate + visible * price.output
             + usage.reasoning * think_rate) * num
    assert cost.total == half_even(exact, MICROS * den)
    assert cost.cached == half_even(usage.cached * price.cached_input * num, MICROS * den)
    assert cost.cache_write == half_even(usage.cache_write * write_rate * num, MICROS * den)


@given(payload=payloads, price=prices, split=splits, batch=st.booleans())
def test_buckets_sum_to_the_backend_totals_and_cost_to_the_lines(
    payload: tuple[Shape, tuple[dict[str, Any], BackendUsage]], price: ModelPrice,
    split: PromptSplit, batch: bool,
) -> None:
    shape, (wire, meaning) = payload
    body = msgspec.json.encode({"usage": wire})
    reported = usage_from_body(body, shape)
    assert reported == meaning  # every figure read once, as the shape defines it
    assert usage_from_mapping(wire, shape) == meaning
    usage = account(split, reported, price=price, batch=batch)
    check_buckets(usage, meaning, price, batch)
    assert (usage.cached, usage.cache_write, usage.reasoning) == (
        meaning.cached_tokens, meaning.cache_write_tokens, meaning.reasoning_tokens)


@given(payload=openai_payloads(consistent=False), price=prices, split=splits,
       batch=st.booleans())
def test_nonsense_payloads_still_give_valid_buckets(
    payload: tuple[dict[str, Any], BackendUsage], price: ModelPrice, split: PromptSplit,
    batch: bool,
) -> None:
    """Parts larger than their totals: clamped, and the invariant still holds."""
    wire, meaning = payload
    reported = usage_from_body(msgspec.json.encode({"usage": wire}))
    assert reported is not None
    assert (reported.prompt_tokens, reported.completion_tokens) == (
        meaning.prompt_tokens, meaning.completion_tokens)
    check_buckets(account(split, reported, price=price, batch=batch), meaning, price, batch)


@given(payload=openai_payloads(consistent=True))
def test_stream_usage_reads_like_the_body(payload: tuple[dict[str, Any], BackendUsage]) -> None:
    """The same usage on the final SSE chunk of a stream reads the same buckets."""
    wire, meaning = payload
    scanner = StreamScanner(strip_usage=True)
    event = b"data: " + msgspec.json.encode({"choices": [], "usage": wire}) + b"\n\n"
    assert scanner.feed(event) == b""
    assert scanner.usage == meaning


@given(payload=payloads, price=prices, batch=st.booleans())
def test_ceiling_price_bounds_every_split(
    payload: tuple[Shape, tuple[dict[str, Any], BackendUsage]], price: ModelPrice, batch: bool,
) -> None:
    """What a request can cost before its usage is known, at ``ceiling()``, is never below
    what it costs once the backend says how its tokens split."""
    _, (_, meaning) = payload
    usage = account(SPLIT, meaning, price=price, batch=batch)
    top = price_usage(price.ceiling(), new=meaning.prompt_tokens,
                      output=meaning.completion_tokens, batch=batch)
    assert usage.cost is not None and top.total >= usage.cost.total


# --- prices from policy ----------------------------------------------------------------------


def test_table_reads_cache_write_reasoning_and_bill_failed() -> None:
    table = PriceTable.from_mapping({
        "bill_failed": True,
        "models": {"m": {"input": "3", "cached_input": "0.30", "cache_write_input": "3.75",
                         "output": "15", "reasoning": "20"},
                   "plain": {"input": "1", "output": "4"}},
        "tenants": {"acme": {"m": {"reasoning": "18"}, "plain": {"input": "2"}}},
    })
    assert table.bill_failed is True
    m, acme = table.lookup("m"), table.lookup("m", "acme")
    assert m is not None and acme is not None
    assert (m.cache_write_input, m.reasoning) == (3_750_000, 20_000_000)
    assert (acme.cache_write_input, acme.reasoning) == (3_750_000, 18_000_000)
    plain, acme_plain = table.lookup("plain"), table.lookup("plain", "acme")
    assert plain is not None and acme_plain is not None
    assert (plain.cache_write_input, plain.reasoning) == (1_000_000, 4_000_000)
    # a tenant's input price is also its cache-write price when none is set
    assert (acme_plain.input, acme_plain.cache_write_input) == (2_000_000, 2_000_000)
    assert PriceTable.from_mapping({}).bill_failed is False
    with pytest.raises(ValueError, match="bill_failed"):
        PriceTable.from_mapping({"bill_failed": "yes"})
