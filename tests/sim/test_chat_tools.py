"""Tool calls in chat completions, driven by the official ``openai`` client on a real socket."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.sim.server import SimServer
from gateway.tokenizers import count_chat_prompt, count_text
from tests.sim.sse import post_stream

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "where"},
        "days": {"type": "integer"},
        "detail": {
            "type": "object",
            "properties": {"hourly": {"type": "boolean"}, "note": {"type": "string"}},
            "required": ["hourly"],
        },
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "days", "detail"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
ARGUMENTS = '{"city":"sim","days":1,"detail":{"hourly":true}}'
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=10, jitter=0.0) as s:
        yield s


@pytest.fixture
def client(server: SimServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def _call_tokens(name: str, arguments: str) -> int:
    return count_text(name) + count_text(arguments)


def test_tool_call_whole(server: SimServer) -> None:
    """The first tool is called with arguments from its schema; usage counts the call."""
    before = server.stats()
    raw = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "tools": TOOLS},
    ).json()
    reply = ChatCompletion.model_validate(raw)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "function"
    assert calls[0].id.startswith("call_")
    assert (calls[0].function.name, calls[0].function.arguments) == ("get_weather", ARGUMENTS)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == _call_tokens("get_weather", ARGUMENTS)
    assert reply.usage.prompt_tokens == count_chat_prompt(MESSAGES)
    after = server.stats()  # the engine generated the call's tokens like text
    assert after["generated_tokens_total"] - before["generated_tokens_total"] == (
        reply.usage.completion_tokens
    )


def test_tool_choice_named_and_none(client: openai.OpenAI) -> None:
    named = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = named.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "get_time"  # type: ignore[union-attr]
    assert calls[0].function.arguments == "{}"  # type: ignore[union-attr]
    text = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=5
    )
    assert text.choices[0].message.tool_calls is None
    assert text.choices[0].finish_reason == "length"
    assert count_text(text.choices[0].message.content or "") == 5


def test_round_trip_answers_text_after_the_tool_result(client: openai.OpenAI) -> None:
    """The sim calls the tool; fed the result, it answers with text; deterministic both times."""
    first = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history: list[Any] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},  # type: ignore[union-attr]
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=7)
    assert second.choices[0].finish_reason == "length"
    assert second.choices[0].message.tool_calls is None
    assert count_text(second.choices[0].message.content or "") == 7
    assert second.usage is not None
    # the assistant's tool call counts in the prompt (name and arguments), as the gateway counts
    assert second.usage.prompt_tokens == count_chat_prompt(history) + _call_tokens(
        "get_weather", ARGUMENTS
    )
    again = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=7)
    assert again.choices[0].message.content == second.choices[0].message.content


def test_tool_call_stream(server: SimServer, client: openai.OpenAI) -> None:
    """Head delta (index, id, name), one delta per argument token, tool_calls finish, usage."""
    r, events = post_stream(
        server.url + "/v1/chat/completions",
        {
            "model": "m",
            "messages": MESSAGES,
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and events[-1] == (None, "[DONE]")
    chunks = [ChatCompletionChunk.model_validate(data) for _, data in events[:-1]]
    head = chunks[0].choices[0].delta
    assert head.role == "assistant" and head.tool_calls is not None
    assert head.tool_calls[0].index == 0 and head.tool_calls[0].id
    assert head.tool_calls[0].function is not None
    assert head.tool_calls[0].function.name == "get_weather"
    pieces = []
    for c in chunks[1:-2]:
        tool_calls = c.choices[0].delta.tool_calls
        assert tool_calls is not None and tool_calls[0].index == 0 and tool_calls[0].id is None
        pieces.append(tool_calls[0].function.arguments)  # type: ignore[union-attr]
    assert "".join(p or "" for p in pieces) == ARGUMENTS
    assert len(pieces) == count_text(ARGUMENTS)
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == _call_tokens("get_weather", ARGUMENTS)
    # the official client reads the same stream
    streamed = list(
        client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True)
    )
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_call_cut_by_max_tokens(client: openai.OpenAI) -> None:
    name_tokens = count_text("get_weather")
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, max_tokens=name_tokens + 4
    )
    assert r.choices[0].finish_reason == "length"
    arguments = r.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    assert ARGUMENTS.startswith(arguments) and arguments != ARGUMENTS
    assert r.usage is not None and r.usage.completion_tokens == name_tokens + 4


def test_no_limit_ends_naturally(server: SimServer) -> None:
    """Without max_tokens a text answer is the default length and ends with 'stop'."""
    raw = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    r = ChatCompletion.model_validate(raw.json())
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.usage is not None and r.usage.completion_tokens == 64
    assert count_text(r.choices[0].message.content or "") == 64


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": 3}, "tool_choice"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
         "tools[0].function.parameters"),
    ],
)  # fmt: skip
def test_bad_tools_are_400(server: SimServer, extra: dict[str, Any], param: str) -> None:
    r = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **extra}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
