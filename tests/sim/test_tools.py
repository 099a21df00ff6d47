"""Simulated tool calls: the choice rule, deterministic arguments, their tokens; the prefix LRU."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.sim.cache import PrefixHasher, PromptCache
from gateway.sim.errors import BadRequest
from gateway.sim.tools import ToolSpec, arguments_for, make_call, pick_tool
from gateway.tokenizers import count_text

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "ratio": {"type": "number"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "unit": {"type": "string", "enum": ["celsius", "kelvin"]},
        "nullable": {"type": ["null", "string"]},
        "where": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "note": {"type": "string"}},
            "required": ["lat"],
        },
        "optional": {"type": "string"},
    },
    "required": ["city", "days", "ratio", "metric", "tags", "unit", "nullable", "where"],
}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            WEATHER,
            {
                "city": "sim",
                "days": 1,
                "ratio": 1,
                "metric": True,
                "tags": [],
                "unit": "celsius",
                "nullable": "sim",
                "where": {"lat": 1},
            },
        ),
        ({}, {}),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, {}),  # nothing required
        ({"required": ["x"]}, {"x": {}}),  # a property without a schema
        ({"required": ["c"], "properties": {"c": {"const": 7}}}, {"c": 7}),
        ({"required": ["u"], "properties": {"u": {"anyOf": [{"type": "null"}]}}}, {"u": None}),
    ],
)
def test_arguments_fill_required_properties(schema: dict[str, Any], expected: Any) -> None:
    text = arguments_for(schema)
    assert json.loads(text) == expected
    assert " " not in text  # compact, as OpenAI sends arguments
    assert arguments_for(schema) == text  # deterministic


def test_recursive_schema_ends() -> None:
    loop: dict[str, Any] = {"type": "object", "required": ["next"]}
    loop["properties"] = {"next": loop}
    assert json.loads(arguments_for(loop))  # bounded depth, no RecursionError


def test_non_ascii_property_names_are_escaped() -> None:
    text = arguments_for({"required": ["ville"], "properties": {"ville": {"type": "string"}}})
    escaped = arguments_for({"required": ["\u00e9t\u00e9"], "properties": {}})
    assert text.isascii() and escaped.isascii()
    assert json.loads(escaped) == {"\u00e9t\u00e9": {}}


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_call_tokens_are_name_plus_arguments(encoding: str) -> None:
    call = make_call(ToolSpec("get_weather", WEATHER), "call_1", 10_000, encoding)
    assert call.complete and call.sent_arguments == call.arguments
    assert call.name_tokens == count_text("get_weather", encoding)
    assert len(call.pieces) == count_text(call.arguments, encoding)
    assert call.tokens == count_text("get_weather", encoding) + count_text(call.arguments, encoding)


def test_call_cut_by_the_limit() -> None:
    full = make_call(ToolSpec("get_weather", WEATHER), "c", 10_000, "o200k_base")
    cut = make_call(ToolSpec("get_weather", WEATHER), "c", full.name_tokens + 3, "o200k_base")
    assert not cut.complete and cut.tokens == full.name_tokens + 3
    assert cut.pieces == full.pieces[:3]
    tiny = make_call(ToolSpec("get_weather", WEATHER), "c", 1, "o200k_base")
    assert tiny.tokens == 1 and tiny.pieces == []


def test_pick_tool_rule() -> None:
    a, b = ToolSpec("a"), ToolSpec("b")
    pick = pick_tool
    assert pick([a, b], None, none=False, after_result=False, param="tool_choice") == a
    assert pick([a, b], "b", none=False, after_result=False, param="tool_choice") == b
    assert pick([a, b], None, none=True, after_result=False, param="tool_choice") is None
    assert pick([a, b], "b", none=False, after_result=True, param="tool_choice") is None
    assert pick([], None, none=False, after_result=False, param="tool_choice") is None
    with pytest.raises(BadRequest) as err:
        pick([a], "zz", none=False, after_result=False, param="tool_choice")
    assert err.value.param == "tool_choice"


def test_prompt_cache_longest_prefix_and_lru() -> None:
    def digests(*elements: bytes) -> list[bytes]:
        h = PrefixHasher(b"model")
        for e in elements:
            h.add(e)
        return h.digests

    one = digests(b"sys", b"u1")
    two = digests(b"sys", b"u1", b"a1", b"u2")
    assert one == two[:2]  # a prefix hashes the same inside a longer prompt
    assert digests(b"sy", b"su1")[1] != one[1]  # element boundaries count
    other = PrefixHasher(b"other model")
    other.add(b"sys")
    assert other.digests[0] != one[0]  # the scope (the model) counts
    cache = PromptCache(entries=2)
    assert cache.longest(two, 3) == -1
    cache.write([one[1]])
    assert cache.longest(two, 3) == 1 and cache.longest(two, 0) == -1
    cache.write([two[3], two[0]])  # over the cap: the least recently used (one[1]) goes
    assert len(cache) == 2 and cache.longest(two, 2) == 0 and cache.longest(two, 3) == 3
    assert repr(cache) == "<PromptCache 2/2 prefixes>"
