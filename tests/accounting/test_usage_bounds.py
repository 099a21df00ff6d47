"""A backend's token counts are validated before they reach a bill, a quota or a record
(issue 34, point 7): a count that is not an integer (``1e30``, ``"12"``, ``true``, ``null``),
negative, or beyond what the request can have used is not billed; the gateway's own estimate
is, marked ``estimated`` with the reason. Every usage shape, whole and streamed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.accounting import PromptCounter, PromptSplit, StreamScanner, account_body
from gateway.accounting.tokens import account_stream
from gateway.accounting.usage import (
    BackendUsage,
    Shape,
    checked_usage,
    text_from_body,
    usage_from_body,
    usage_from_mapping,
)
from gateway.accounting.usage_bounds import (
    CEILING,
    PROMPT_FACTOR,
    PROMPT_SLACK,
    UsageLimits,
    bounds,
    check,
    count_problem,
    rejection_kind,
    request_limits,
    screen,
)
from gateway.dialects.native import NativeStreamScanner

SPLIT = PromptSplit(system=10, new=30)  # the gateway's own count of the prompt: 40
LIMITS = UsageLimits(output=16)  # the request's max_tokens
REPLY = "The rivers are the Danube, the Rhine and the Volga."

#: (value, what reading it says): the table of the issue
BAD = [
    pytest.param(1e30, "not_integer", id="1e30"),
    pytest.param(12.0, "not_integer", id="integral-float"),
    pytest.param(-1, "negative", id="-1"),
    pytest.param("12", "not_integer", id="string"),
    pytest.param(True, "not_integer", id="true"),
    pytest.param(None, "null", id="null"),
    pytest.param([3], "not_integer", id="array"),
    pytest.param({"n": 3}, "not_integer", id="object"),
]

#: each shape's totals: (shape, a good usage, the names of its totals)
SHAPES: list[tuple[Shape, dict[str, Any], tuple[str, ...]]] = [
    ("openai", {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
     ("prompt_tokens", "completion_tokens", "total_tokens")),
    ("anthropic", {"input_tokens": 40, "output_tokens": 12},
     ("input_tokens", "output_tokens")),
    ("responses", {"input_tokens": 40, "output_tokens": 12, "total_tokens": 52},
     ("input_tokens", "output_tokens", "total_tokens")),
]

#: each shape's parts (cache read, cache write, reasoning, splits), as (path, name)
PARTS: list[tuple[Shape, tuple[str, ...], str]] = [
    ("openai", ("prompt_tokens_details", "cached_tokens"), "cached_tokens"),
    ("openai", ("prompt_tokens_details", "cache_write_tokens"), "cache_write_tokens"),
    ("openai", ("prompt_tokens_details", "cache_creation_tokens"), "cache_creation_tokens"),
    ("openai", ("completion_tokens_details", "reasoning_tokens"), "reasoning_tokens"),
    ("openai", ("cache_read_input_tokens",), "cache_read_input_tokens"),
    ("openai", ("cache_creation_input_tokens",), "cache_creation_input_tokens"),
    ("openai", ("prompt_cache_hit_tokens",), "prompt_cache_hit_tokens"),
    ("anthropic", ("cache_read_input_tokens",), "cache_read_input_tokens"),
    ("anthropic", ("cache_creation_input_tokens",), "cache_creation_input_tokens"),
    ("anthropic", ("cache_creation", "ephemeral_5m_input_tokens"), "ephemeral_5m_input_tokens"),
    ("responses", ("input_tokens_details", "cached_tokens"), "cached_tokens"),
    ("responses", ("output_tokens_details", "reasoning_tokens"), "reasoning_tokens"),
]


def _with(usage: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = msgspec.json.decode(msgspec.json.encode(usage))
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out  # type: ignore[no-any-return]


def _body(usage: Any, shape: Shape = "openai") -> bytes:
    """A whole answer of ``shape`` carrying ``usage`` and ``REPLY`` as its text."""
    if shape == "anthropic":
        answer: dict[str, Any] = {"type": "message", "content": [{"type": "text", "text": REPLY}]}
    elif shape == "responses":
        answer = {"object": "response", "output": [
            {"type": "message", "content": [{"type": "output_text", "text": REPLY}]}]}
    else:
        answer = {"object": "chat.completion",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}}]}
    return msgspec.json.encode({**answer, "usage": usage})


# --- reading: each figure a JSON integer >= 0 ------------------------------------------------


@pytest.mark.parametrize(("value", "kind"), BAD)
def test_count_problem(value: Any, kind: str) -> None:
    assert count_problem(value) == kind


@pytest.mark.parametrize("value", [0, 1, 10**12, 10**30])
def test_an_integer_is_a_count_whatever_its_size(value: int) -> None:
    """Size is the request's business (``check``), not the reading's."""
    assert count_problem(value) is None


@pytest.mark.parametrize(("value", "kind"), BAD)
@pytest.mark.parametrize(("shape", "good", "totals"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_bad_total_refuses_the_usage_in_every_shape(
        value: Any, kind: str, shape: Shape, good: dict[str, Any], totals: tuple[str, ...]
) -> None:
    for name in totals:
        usage = {**good, name: value}
        expected = BackendUsage(rejected=f"{kind}:{name}")
        assert usage_from_body(_body(usage, shape), shape) == expected, name
        assert checked_usage(usage, shape) == expected, name
        assert usage_from_mapping(usage, shape) is None, name  # a client is shown none


@pytest.mark.parametrize(("value", "kind"), [p for p in BAD if p.id != "null"])
@pytest.mark.parametrize(("shape", "path", "name"), PARTS,
                         ids=[f"{s}-{n}" for s, _, n in PARTS])
def test_a_bad_part_refuses_the_usage(value: Any, kind: str, shape: Shape,
                                      path: tuple[str, ...], name: str) -> None:
    good = next(g for s, g, _ in SHAPES if s == shape)
    usage = _with(good, path, value)
    assert checked_usage(usage, shape) == BackendUsage(rejected=f"{kind}:{name}")


@pytest.mark.parametrize(("shape", "path", "name"), PARTS,
                         ids=[f"{s}-{n}" for s, _, n in PARTS])
def test_a_null_part_is_a_split_not_reported(shape: Shape, path: tuple[str, ...],
                                             name: str) -> None:
    """LiteLLM writes null for every detail it lacks, Anthropic's cache figures are nullable:
    a null part reads as 0 and the totals stand."""
    good = next(g for s, g, _ in SHAPES if s == shape)
    usage = checked_usage(_with(good, path, None), shape)
    assert usage.rejected is None and usage.prompt_tokens == 40
    assert usage.completion_tokens == 12


@pytest.mark.parametrize(("shape", "usage", "name"), [
    ("openai", {"completion_tokens": 5}, "prompt_tokens"),
    ("anthropic", {"output_tokens": 5}, "input_tokens"),
    ("responses", {"output_tokens": 5}, "input_tokens"),
])
def test_a_usage_without_its_prompt_total_is_refused(shape: Shape, usage: dict[str, Any],
                                                     name: str) -> None:
    """Absent is not 0: a usage that does not say how long the prompt was bills no prompt."""
    assert checked_usage(usage, shape) == BackendUsage(rejected=f"missing:{name}")


def test_deepseek_split_stands_for_the_prompt_total() -> None:
    usage = checked_usage({"prompt_cache_hit_tokens": 30, "prompt_cache_miss_tokens": 10,
                           "completion_tokens": 2})
    assert (usage.prompt_tokens, usage.cached_tokens, usage.rejected) == (40, 30, None)


@pytest.mark.parametrize("usage", ["12", 5, [1, 2], {"prompt_tokens_details": 4},
                                   {"prompt_tokens": 1, "completion_tokens_details": "x"}])
def test_a_usage_that_is_not_an_object_is_malformed(usage: Any) -> None:
    assert usage_from_body(_body(usage)) == BackendUsage(rejected="malformed:usage")
    assert checked_usage(usage) == BackendUsage(rejected="malformed:usage")


def test_no_usage_and_no_json_are_none() -> None:
    assert usage_from_body(_body(None)) is None
    assert usage_from_body(b'["an array"]') is None
    assert usage_from_body(b"<html>502</html>") is None


# --- the request's bounds ---------------------------------------------------------------------


def test_request_limits() -> None:
    assert request_limits({"max_tokens": 16}, "chat") == UsageLimits(output=16)
    assert request_limits({"max_completion_tokens": 8, "max_tokens": 16}, "chat").output == 8
    assert request_limits({"max_tokens": 16, "n": 3}, "chat") == UsageLimits(output=48,
                                                                              choices=3)
    assert request_limits({"max_tokens": 16, "n": 2, "best_of": 5},
                          "text_completion").output == 80
    assert request_limits({}, "chat").output is None
    assert request_limits({}, "chat", default_output=4096).output == 4096
    assert request_limits({"max_tokens": True}, "chat", default_output=99).output == 99
    assert request_limits({"input": "x"}, "embeddings").output == 0
    assert request_limits({}, "chat", context=8192).context == 8192


def test_bounds() -> None:
    assert bounds(SPLIT, LIMITS) == (40 * PROMPT_FACTOR + PROMPT_SLACK, 16)
    assert bounds(SPLIT, UsageLimits()) == (40 * PROMPT_FACTOR + PROMPT_SLACK, CEILING)
    # images and files: the gateway's count is a guess; the window bounds them
    assert bounds(PromptSplit(new=40, non_text_parts=1), UsageLimits())[0] == CEILING
    assert bounds(PromptSplit(new=40, non_text_parts=1), UsageLimits(context=8192)) == (
        8192, 8192)
    assert bounds(SPLIT, UsageLimits(output=10**9, context=100, choices=2)) == (100, 200)
    assert bounds(PromptSplit(new=10**9), UsageLimits(output=10**9)) == (CEILING, CEILING)


@pytest.mark.parametrize(("usage", "reason"), [
    (BackendUsage(prompt_tokens=40, completion_tokens=16, total_tokens=56), None),
    (BackendUsage(prompt_tokens=40 * PROMPT_FACTOR + PROMPT_SLACK), None),
    (BackendUsage(prompt_tokens=40 * PROMPT_FACTOR + PROMPT_SLACK + 1),
     "too_large:prompt_tokens"),
    (BackendUsage(prompt_tokens=10**30), "too_large:prompt_tokens"),
    (BackendUsage(prompt_tokens=10**12), "too_large:prompt_tokens"),
    (BackendUsage(prompt_tokens=40, completion_tokens=17), "too_large:completion_tokens"),
    (BackendUsage(prompt_tokens=40, completion_tokens=10**12), "too_large:completion_tokens"),
    (BackendUsage(prompt_tokens=40, total_tokens=10**12), "too_large:total_tokens"),
    (BackendUsage(prompt_tokens=40, cached_tokens=40, overstated=10**12), "too_large:details"),
    (BackendUsage(prompt_tokens=40, cached_tokens=40, overstated=41), None),  # cut, harmless
    (BackendUsage(rejected="null:prompt_tokens"), "null:prompt_tokens"),
])
def test_check(usage: BackendUsage, reason: str | None) -> None:
    assert check(usage, SPLIT, LIMITS) == reason


def test_screen() -> None:
    good = BackendUsage(prompt_tokens=40, completion_tokens=3)
    assert screen(SPLIT, good, LIMITS) == (good, None)
    assert screen(SPLIT, None, LIMITS) == (None, "no_usage")
    assert screen(SPLIT, BackendUsage(prompt_tokens=10**30), None) == (
        None, "too_large:prompt_tokens")


def test_rejection_kind() -> None:
    assert rejection_kind("too_large:prompt_tokens") == "too_large"
    assert rejection_kind("null:completion_tokens") == "null"
    assert rejection_kind("no_usage") is None
    assert rejection_kind(None) is None


# --- accounting: the estimate is billed, and says why -----------------------------------------

#: (usage the backend answers, the reason the record gives): the issue's table, plus a few
HOSTILE = [
    pytest.param({"prompt_tokens": 1e30, "completion_tokens": 3}, "not_integer:prompt_tokens",
                 id="1e30"),
    pytest.param({"prompt_tokens": -1, "completion_tokens": 3}, "negative:prompt_tokens",
                 id="-1"),
    pytest.param({"prompt_tokens": "12", "completion_tokens": 3}, "not_integer:prompt_tokens",
                 id="string"),
    pytest.param({"prompt_tokens": True, "completion_tokens": 3}, "not_integer:prompt_tokens",
                 id="true"),
    pytest.param({"prompt_tokens": 40, "completion_tokens": None}, "null:completion_tokens",
                 id="null"),
    pytest.param({"prompt_tokens": 10**12, "completion_tokens": 3}, "too_large:prompt_tokens",
                 id="10**12"),
    pytest.param({"prompt_tokens": 40, "completion_tokens": 10**30},
                 "too_large:completion_tokens", id="10**30-output"),
    pytest.param({"prompt_tokens": 40, "completion_tokens": 3,
                  "prompt_tokens_details": {"cached_tokens": 10**12}}, "too_large:details",
                 id="10**12-cached"),
    pytest.param({"prompt_tokens": 40, "completion_tokens": 3,
                  "completion_tokens_details": {"reasoning_tokens": -1}},
                 "negative:reasoning_tokens", id="-1-reasoning"),
]


def _estimate(counter: PromptCounter) -> tuple[int, int]:
    return SPLIT.total, counter.count_text(REPLY)


@pytest.mark.parametrize(("usage", "reason"), HOSTILE)
def test_a_whole_answer_bills_the_estimate(usage: dict[str, Any], reason: str) -> None:
    counter = PromptCounter()
    metered = account_body(SPLIT, _body(usage), counter, limits=LIMITS)
    assert (metered.estimated, metered.estimate_reason) == (True, reason)
    assert (metered.prompt_total, metered.output) == _estimate(counter)
    assert (metered.cached, metered.cache_write, metered.reasoning) == (0, 0, 0)


@pytest.mark.parametrize(("usage", "reason"), HOSTILE)
def test_a_stream_bills_the_estimate(usage: dict[str, Any], reason: str) -> None:
    counter = PromptCounter()
    scanner = StreamScanner(strip_usage=False)
    words = REPLY.split(" ")
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        scanner.feed(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
    scanner.feed(b"data: " + msgspec.json.encode({"choices": [], "usage": usage}) + b"\n\n")
    scanner.feed(b"data: [DONE]\n\n")
    scanner.flush()
    metered = account_stream(SPLIT, scanner, counter, limits=LIMITS)
    assert (metered.estimated, metered.estimate_reason) == (True, reason)
    assert (metered.prompt_total, metered.output) == _estimate(counter)


@pytest.mark.parametrize(("shape", "usage", "reason"), [
    ("anthropic", {"input_tokens": 1e30, "output_tokens": 3}, "not_integer:input_tokens"),
    ("anthropic", {"input_tokens": 40, "output_tokens": 10**12}, "too_large:completion_tokens"),
    ("anthropic", {"input_tokens": 40, "output_tokens": 3, "cache_read_input_tokens": 10**12},
     "too_large:prompt_tokens"),
    ("responses", {"input_tokens": None, "output_tokens": 3}, "null:input_tokens"),
    ("responses", {"input_tokens": 10**30, "output_tokens": 3}, "too_large:prompt_tokens"),
    ("responses", {"input_tokens": 40, "output_tokens": 3,
                   "output_tokens_details": {"reasoning_tokens": "3"}},
     "not_integer:reasoning_tokens"),
])
def test_messages_and_responses_answers_bill_the_estimate(shape: Shape, usage: dict[str, Any],
                                                          reason: str) -> None:
    """Passed through in their own API: the estimate counts their own text."""
    counter = PromptCounter()
    metered = account_body(SPLIT, _body(usage, shape), counter, limits=LIMITS, shape=shape)
    assert (metered.estimated, metered.estimate_reason) == (True, reason)
    assert (metered.prompt_total, metered.output) == _estimate(counter)


@pytest.mark.parametrize(("api", "events", "reason"), [
    ("messages", [
        {"type": "message_start", "message": {"usage": {"input_tokens": 10**30,
                                                        "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": REPLY}},
        {"type": "message_delta", "usage": {"output_tokens": 3}},
        {"type": "message_stop"}], "too_large:prompt_tokens"),
    ("messages", [
        {"type": "message_start", "message": {"usage": {"input_tokens": 40,
                                                        "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": REPLY}},
        {"type": "message_delta", "usage": {"output_tokens": "3"}},
        {"type": "message_stop"}], "not_integer:output_tokens"),
    ("responses", [
        {"type": "response.output_text.delta", "delta": REPLY},
        {"type": "response.completed", "response": {"usage": {
            "input_tokens": 40, "output_tokens": -3, "total_tokens": 37}}}],
     "negative:output_tokens"),
])
def test_native_streams_bill_the_estimate(api: str, events: list[dict[str, Any]],
                                          reason: str) -> None:
    counter = PromptCounter()
    scanner = NativeStreamScanner(api)
    for event in events:
        scanner.feed(b"data: " + msgspec.json.encode(event) + b"\n\n")
    scanner.flush()
    metered = account_stream(SPLIT, scanner, counter, limits=LIMITS)
    assert (metered.estimated, metered.estimate_reason) == (True, reason)
    assert (metered.prompt_total, metered.output) == _estimate(counter)


def test_good_usage_stands() -> None:
    counter = PromptCounter()
    metered = account_body(SPLIT, _body({"prompt_tokens": 44, "completion_tokens": 16,
                                         "total_tokens": 60}), counter, limits=LIMITS)
    assert (metered.prompt_total, metered.output, metered.estimated,
            metered.estimate_reason) == (44, 16, False, None)


def test_text_of_every_shape() -> None:
    shapes: tuple[Shape, ...] = ("openai", "anthropic", "responses")
    for shape in shapes:
        assert text_from_body(_body(None, shape), shape) == REPLY
    call = {"content": [{"type": "tool_use", "input": {"city": "Oslo"}}]}
    assert text_from_body(msgspec.json.encode(call), "anthropic") == '{"city":"Oslo"}'
