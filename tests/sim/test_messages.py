"""``POST /v1/messages`` served natively, driven by the official ``anthropic`` client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

from gateway.sim.app import SimApp
from gateway.sim.engine import Engine
from gateway.sim.errors import Overloaded, render_error
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer
from gateway.tokenizers import REPLY_PRIMING, count_chat_prompt, count_text
from tests.sim.sse import post_stream

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather.", "input_schema": SCHEMA}]
ARGUMENTS = '{"city":"sim","days":1}'
USER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
SYSTEM = "You are a careful assistant who answers questions about the weather. " * 20


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=10, jitter=0.0) as s:
        yield s


@pytest.fixture
def client(server: SimServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as c:
        yield c


def _raw(server: SimServer, body: dict[str, Any]) -> Message:
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    return Message.model_validate(r.json())


def test_plain_text(server: SimServer, client: anthropic.Anthropic) -> None:
    """max_tokens tokens of text, stop_reason max_tokens, input counted as the chat messages."""
    body = {"model": "claude-x", "max_tokens": 11, "system": "Be brief.", "messages": USER}
    raw = _raw(server, body)
    assert raw.type == "message" and raw.role == "assistant" and raw.model == "claude-x"
    assert raw.id.startswith("msg_") and raw.stop_reason == "max_tokens"
    assert len(raw.content) == 1 and raw.content[0].type == "text"
    assert count_text(raw.content[0].text) == 11
    chat = [{"role": "system", "content": "Be brief."}, *USER]
    assert raw.usage.input_tokens == count_chat_prompt(chat)
    assert raw.usage.output_tokens == 11
    assert (raw.usage.cache_creation_input_tokens, raw.usage.cache_read_input_tokens) == (0, 0)
    sdk = client.messages.create(
        model="claude-x",
        max_tokens=11,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": USER[0]["content"]}]}],
    )
    assert sdk.content == raw.content  # blocks or strings: the same prompt, the same words


def test_same_prompt_says_the_same_as_chat(server: SimServer) -> None:
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    c = chat.chat.completions.create(model="m", messages=USER, max_tokens=8)
    m = _raw(server, {"model": "m", "max_tokens": 8, "messages": USER})
    assert m.content[0].text == c.choices[0].message.content  # type: ignore[union-attr]
    assert c.usage is not None and m.usage.input_tokens == c.usage.prompt_tokens


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    full = client.messages.create(model="m", max_tokens=40, messages=USER)
    words = full.content[0].text.split(" ")[1:]  # type: ignore[union-attr]
    stop = " " + words[5]
    r = client.messages.create(model="m", max_tokens=40, messages=USER, stop_sequences=[stop])
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert r.usage.output_tokens == words.index(words[5])


def test_stream_event_sequence(server: SimServer) -> None:
    """Anthropic's order, ping included; every event parses; text and usage match the whole."""
    body = {"model": "m", "max_tokens": 10, "messages": USER}
    whole = _raw(server, body)
    r, events = post_stream(server.url + "/v1/messages", {**body, "stream": True})
    assert r.status_code == 200
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 10,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    parsed = [EVENTS.validate_python(data) for name, data in events if name != "ping"]
    start = parsed[0].message
    assert start.content == [] and start.stop_reason is None
    assert start.usage.input_tokens == whole.usage.input_tokens and start.usage.output_tokens == 0
    text = "".join(e.delta.text for e in parsed if e.type == "content_block_delta")
    assert text == whole.content[0].text  # type: ignore[union-attr]
    delta = parsed[-2]
    assert delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 10
    assert delta.usage.input_tokens == whole.usage.input_tokens


def test_tool_use_round_trip_with_the_stream_helper(client: anthropic.Anthropic) -> None:
    """messages.stream(...).get_final_message() with a tool: a tool_use block; then text."""
    with client.messages.stream(model="m", max_tokens=200, messages=USER, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and len(final.content) == 1
    block = final.content[0]
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input == {"city": "sim", "days": 1} and block.id.startswith("toolu_")
    assert final.usage.output_tokens == count_text("get_weather") + count_text(ARGUMENTS)
    whole = client.messages.create(model="m", max_tokens=200, messages=USER, tools=TOOLS)
    assert whole.content[0].input == block.input  # type: ignore[union-attr]
    turns: list[Any] = [
        *USER,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": block.id, "content": "sunny"},
                {"type": "text", "text": "Thanks."},
            ],
        },
    ]
    answer = client.messages.create(model="m", max_tokens=6, messages=turns, tools=TOOLS)
    assert answer.stop_reason == "max_tokens" and answer.content[0].type == "text"
    chat = [
        *USER,
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "sunny"},
        {"role": "user", "content": "Thanks."},
    ]
    tool_call = count_text("get_weather") + count_text(ARGUMENTS)
    assert answer.usage.input_tokens == count_chat_prompt(chat) + tool_call
    count = client.messages.count_tokens(model="m", messages=turns, tools=TOOLS)
    assert count.input_tokens == answer.usage.input_tokens


def test_tool_choice(client: anthropic.Anthropic) -> None:
    tools = [*TOOLS, {"name": "get_time", "input_schema": {"type": "object"}}]
    named = client.messages.create(
        model="m", max_tokens=50, messages=USER, tools=tools,
        tool_choice={"type": "tool", "name": "get_time"},
    )  # fmt: skip
    assert named.content[0].type == "tool_use" and named.content[0].name == "get_time"
    assert named.content[0].input == {}
    none = client.messages.create(
        model="m", max_tokens=5, messages=USER, tools=tools, tool_choice={"type": "none"}
    )
    assert none.content[0].type == "text"


def _cached(server: SimServer, system: Any, messages: list[Any], model: str = "m") -> Any:
    body = {"model": model, "max_tokens": 3, "system": system, "messages": messages}
    return _raw(server, body).usage


def test_cache_control_writes_then_reads() -> None:
    """First sight of a breakpoint's prefix writes it; the same prefix later reads it."""
    with SimServer(speedup=10, jitter=0.0) as s:
        system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
        prefix = count_chat_prompt([{"role": "system", "content": SYSTEM}]) - REPLY_PRIMING
        total = count_chat_prompt([{"role": "system", "content": SYSTEM}, *USER])
        first = _cached(s, system, USER)
        assert first.cache_creation_input_tokens == prefix
        assert first.cache_creation.ephemeral_5m_input_tokens == prefix
        assert first.cache_read_input_tokens == 0
        assert first.input_tokens == total - prefix
        other = [{"role": "user", "content": "Something else entirely"}]
        second = _cached(s, system, other)
        assert (second.cache_read_input_tokens, second.cache_creation_input_tokens) == (prefix, 0)
        assert (
            second.input_tokens
            == count_chat_prompt([{"role": "system", "content": SYSTEM}, *other]) - prefix
        )
        assert _cached(s, system, USER, model="n").cache_read_input_tokens == 0  # per model
        plain = _cached(s, [{"type": "text", "text": SYSTEM}], USER)
        assert (plain.cache_read_input_tokens, plain.cache_creation_input_tokens) == (0, 0)
        stats = s.stats()
        assert stats["apis"]["messages"]["cache_read_tokens"] == prefix
        assert stats["apis"]["messages"]["cache_write_tokens"] == 2 * prefix
        assert stats["prompt_cache_entries"] == 2


def test_cache_follows_a_conversation() -> None:
    """Turn 2 moves the breakpoint to its last block: it reads turn 1's prefix, writes the rest."""
    with SimServer(speedup=10, jitter=0.0) as s:
        mark = {"type": "ephemeral"}

        def turn(text: str, cached: bool) -> dict[str, Any]:
            block: dict[str, Any] = {"type": "text", "text": text}
            if cached:
                block["cache_control"] = mark
            return {"role": "user", "content": [block]}

        one = [turn("First question, rather long. " * 30, True)]
        u1 = _cached(s, SYSTEM, one)
        assert u1.cache_read_input_tokens == 0 and u1.cache_creation_input_tokens > 0
        two = [
            turn("First question, rather long. " * 30, False),
            {"role": "assistant", "content": "An answer."},
            turn("Second question.", True),
        ]
        u2 = _cached(s, SYSTEM, two)
        assert u2.cache_read_input_tokens == u1.cache_creation_input_tokens
        chat = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "First question, rather long. " * 30},
            {"role": "assistant", "content": "An answer."},
            {"role": "user", "content": "Second question."},
        ]
        assert u2.cache_creation_input_tokens == (
            count_chat_prompt(chat) - REPLY_PRIMING - u2.cache_read_input_tokens
        )
        assert u2.input_tokens == REPLY_PRIMING
        total = u2.input_tokens + u2.cache_read_input_tokens + u2.cache_creation_input_tokens
        assert total == count_chat_prompt(chat)
        again = _cached(s, SYSTEM, two)  # the whole prefix is now cached
        assert again.cache_read_input_tokens == total - REPLY_PRIMING
        assert again.cache_creation_input_tokens == 0


def test_errors_have_anthropic_shape(server: SimServer, client: anthropic.Anthropic) -> None:
    r = httpx.post(server.url + "/v1/messages", json={"model": "m", "messages": USER})
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=5, messages=[])
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(
            model="m", max_tokens=5, messages=USER, extra_headers={"x-sim-retry-after": "3"}
        )
    assert limited.value.response.headers["retry-after"] == "3"
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(
            model="m", max_tokens=5, messages=USER, extra_headers={"x-sim-error-status": "529"}
        )
    r = httpx.get(server.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    status, body = render_error(Overloaded("waiting queue full"), "messages")
    assert status == 529 and b'"overloaded_error"' in body


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 5, "messages": USER},  # no model
        {"model": "m", "max_tokens": 0, "messages": USER},
        {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
        {"model": "m", "max_tokens": 5, "messages": USER, "tools": [{"name": "f"}]},
        {"model": "m", "max_tokens": 5, "messages": USER, "tools": TOOLS,
         "tool_choice": {"type": "tool", "name": "nope"}},
        {"model": "m", "max_tokens": 5, "messages": USER, "stop_sequences": "x"},
        {"model": "m", "max_tokens": 5, "messages": USER, "system": [{"type": "image"}, 3]},
    ],
)  # fmt: skip
def test_bad_requests_are_400(server: SimServer, body: dict[str, Any]) -> None:
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_strict_model_is_not_found() -> None:
    with SimServer(models=["only"], strict_models=True, speedup=10) as s:
        c = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as err:
            c.messages.create(model="nope", max_tokens=1, messages=USER)
        assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_error_after_the_headers_is_an_error_event() -> None:
    # the API layer refuses a limit beyond the context before the headers; an engine holding
    # fewer tokens than that context is left to refuse it after them
    s = SimServer(speedup=10, jitter=0.0)
    s.app = SimApp(s.config, engine=Engine(get_profile("interactive", kv_tokens=256),
                                           speedup=10, jitter=0.0))
    with s:
        body = {"model": "m", "max_tokens": 1000, "messages": USER, "stream": True}
        r, events = post_stream(s.url + "/v1/messages", body)
        assert r.status_code == 200
        name, data = events[-1]
        assert name == "error" and data["type"] == "error"
        assert data["error"]["type"] == "invalid_request_error"
        c = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError):  # noqa: SIM117
            with c.messages.stream(model="m", max_tokens=1000, messages=USER) as stream:
                stream.get_final_message()
