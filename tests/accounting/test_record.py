"""The usage result: backend figures win, the split is fitted to them, estimates are marked."""

from __future__ import annotations

import msgspec

from gateway.accounting import (
    BackendUsage,
    CostBreakdown,
    ModelPrice,
    PromptCounter,
    PromptSplit,
    StreamScanner,
    TokenUsage,
    account,
    account_body,
    account_stream,
)
from gateway.accounting.messages import message_key

from .streams import chat_events

PRICE = ModelPrice.parse(input="2.50", cached_input="1.25", output="10.00")
SPLIT = PromptSplit(system=100, history=300, new=100)


def test_reported_usage_fits_the_split() -> None:
    reported = BackendUsage(prompt_tokens=1001, completion_tokens=20, cached_tokens=500)
    usage = account(SPLIT, reported, price=PRICE)
    assert (usage.system, usage.history, usage.new, usage.tools) == (200, 601, 200, 0)
    assert (usage.prompt_total, usage.cached, usage.output, usage.estimated) == (
        1001,
        500,
        20,
        False,
    )
    # system 200*2.5 = 500; history 101*2.5 + 500 cached*1.25 = 877.5; new 500; output 200:
    # exact 2077.5 -> 2078 (half to even); the spare micro-unit goes to history's .5
    assert usage.cost == CostBreakdown(
        system=500, history=878, new=500, tools=0, output=200, total=2078, cached=625
    )


def test_no_usage_means_estimated() -> None:
    usage = account(SPLIT, None, estimated_output=42)
    assert usage == TokenUsage(
        system=100, history=300, new=100, output=42, prompt_total=500, estimated=True,
        estimate_reason="no_usage",
    )


def test_account_stream_with_and_without_usage() -> None:
    counter = PromptCounter()
    words = [" one", " two", " three"]
    for kind, estimated in (("separate", False), ("none", True)):
        events, _ = chat_events(words, usage=kind)
        scanner = StreamScanner(strip_usage=True)
        for e in events:
            scanner.feed(e)
        scanner.flush()
        usage = account_stream(SPLIT, scanner, counter, price=PRICE, remember_reply=True)
        assert usage.estimated is estimated
        assert usage.output == (3 if estimated else 7)
        assert usage.prompt_total == (500 if estimated else 120)
    reply = {"role": "assistant", "content": " one two three"}
    assert counter.cache.get(message_key(reply)) is not None


def test_account_body() -> None:
    counter = PromptCounter()
    with_usage = msgspec.json.encode(
        {
            "choices": [{"message": {"role": "assistant", "content": "hello there"}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52},
        }
    )
    without = msgspec.json.encode({"choices": [{"message": {"content": "hello there"}}]})
    a = account_body(SPLIT, with_usage, counter, remember_reply=True)
    b = account_body(SPLIT, without, counter)
    assert (a.prompt_total, a.output, a.estimated) == (50, 2, False)
    assert (b.prompt_total, b.output, b.estimated) == (500, 2, True)
    assert counter.cache.get(message_key({"role": "assistant", "content": "hello there"}))


def test_record_encodes_for_the_ledger() -> None:
    usage = account(SPLIT, BackendUsage(prompt_tokens=500, completion_tokens=1), price=PRICE)
    decoded = msgspec.json.decode(msgspec.json.encode(usage), type=TokenUsage)
    assert decoded == usage
