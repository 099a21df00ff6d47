"""``POST /v1/responses`` served natively, driven by the official ``openai`` client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from gateway.sim.app import SimApp
from gateway.sim.engine import Engine
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer
from gateway.tokenizers import count_chat_prompt, count_text
from tests.sim.sse import post_stream

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": True},
]
ARGUMENTS = '{"city":"sim","days":1}'


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=10, jitter=0.0) as s:
        yield s


@pytest.fixture
def client(server: SimServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def _raw(server: SimServer, body: dict[str, Any]) -> Response:
    r = httpx.post(server.url + "/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return Response.model_validate(r.json())


def test_plain_text(server: SimServer, client: openai.OpenAI) -> None:
    """A string input: one message item; without a limit it completes at the default length."""
    raw = _raw(server, {"model": "m", "input": "Tell me about batching."})
    assert raw.object == "response" and raw.status == "completed" and raw.model == "m"
    assert raw.id.startswith("resp_") and raw.incomplete_details is None
    assert len(raw.output) == 1 and raw.output[0].type == "message"
    assert count_text(raw.output_text) == 64
    usage = raw.usage
    assert usage is not None
    assert usage.input_tokens == count_chat_prompt(
        [{"role": "user", "content": "Tell me about batching."}]
    )
    assert (usage.output_tokens, usage.total_tokens) == (64, usage.input_tokens + 64)
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    sdk = client.responses.create(model="m", input="Tell me about batching.")
    assert sdk.output_text == raw.output_text  # deterministic


def test_same_prompt_costs_and_says_the_same_as_chat(client: openai.OpenAI) -> None:
    """Instructions and input items count as the equivalent chat messages and seed the same text."""
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "And then?"},
    ]
    items: list[Any] = [
        {"role": "user", "content": "Hello"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi there."}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "And then?"}]},
    ]
    r = client.responses.create(
        model="m", instructions="Be brief.", input=items, max_output_tokens=9
    )
    c = client.chat.completions.create(model="m", messages=chat, max_tokens=9)  # type: ignore[arg-type]
    assert r.usage is not None and c.usage is not None
    assert r.usage.input_tokens == c.usage.prompt_tokens == count_chat_prompt(chat)
    assert r.output_text == c.choices[0].message.content


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="hi", max_output_tokens=6)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.output_tokens == 6 == count_text(r.output_text)


def test_stream_event_sequence(server: SimServer) -> None:
    """Every event parses as the SDK's typed event, sequence numbers run 0..n-1, in order."""
    body = {"model": "m", "input": "Stream please.", "max_output_tokens": 12}
    whole = _raw(server, body)
    r, events = post_stream(server.url + "/v1/responses", {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    parsed = [EVENTS.validate_python(data) for _, data in events]
    assert [name for name, _ in events] == [e.type for e in parsed]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    kinds = [e.type for e in parsed]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 12,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert parsed[0].response.status == "in_progress" and parsed[0].response.usage is None
    text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    assert text == whole.output_text == parsed[-4].text
    final = parsed[-1].response
    assert final.output_text == text and final.usage == whole.usage
    assert final.id == parsed[0].response.id


def test_stream_with_the_official_client(client: openai.OpenAI) -> None:
    """client.responses.create(stream=True) and the responses.stream helper both complete."""
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    with client.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == len(deltas) == 64


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    """With a function tool: a function_call item; fed its output: a text message."""
    first = client.responses.create(model="m", input="Weather in Paris?", tools=TOOLS)
    assert first.status == "completed" and len(first.output) == 1
    call = first.output[0]
    assert call.type == "function_call"
    assert (call.name, call.arguments, call.status) == ("get_weather", ARGUMENTS, "completed")
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    assert first.usage is not None
    assert first.usage.output_tokens == count_text("get_weather") + count_text(ARGUMENTS)
    items: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = client.responses.create(model="m", input=items, tools=TOOLS, max_output_tokens=5)
    assert second.output[0].type == "message" and count_text(second.output_text) == 5
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "sunny"},
    ]
    tool_call = count_text("get_weather") + count_text(ARGUMENTS)
    assert second.usage is not None
    assert second.usage.input_tokens == count_chat_prompt(chat) + tool_call
    forced = client.responses.create(
        model="m", input=items, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"}
    )
    assert forced.output[0].type == "message"  # a tool result was last: text even when forced
    none = client.responses.create(model="m", input="x", tools=TOOLS, tool_choice="none")
    assert none.output[0].type == "message"


def test_function_call_stream(server: SimServer) -> None:
    body = {"model": "m", "input": "Weather?", "tools": TOOLS, "stream": True}
    _, events = post_stream(server.url + "/v1/responses", body)
    parsed = [EVENTS.validate_python(data) for _, data in events]
    kinds = [e.type for e in parsed]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = parsed[2].item
    assert added.type == "function_call" and added.name == "get_weather" and added.arguments == ""
    deltas = [e.delta for e in parsed if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == ARGUMENTS == parsed[-3].arguments
    assert len(deltas) == count_text(ARGUMENTS)
    done = parsed[-2].item
    assert (
        done.type == "function_call" and done.arguments == ARGUMENTS and done.status == "completed"
    )
    assert parsed[-1].response.output[0].call_id == added.call_id


def test_stateful_fields_are_refused(server: SimServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="x", previous_response_id="resp_1")
    assert err.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert httpx.get(server.url + "/v1/responses/resp_1").status_code == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        ({"input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "nope"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"input": "x", "instructions": 1}, "instructions"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "no"}},
         "tool_choice"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ],
)  # fmt: skip
def test_bad_requests_are_400(server: SimServer, body: dict[str, Any], param: str) -> None:
    r = httpx.post(server.url + "/v1/responses", json={"model": "m", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_error_after_the_headers_is_an_error_event() -> None:
    """A request the KV cache can never hold, streamed: 200, then an ``error`` event (the API
    layer refuses a limit beyond the context before the headers; an engine holding fewer
    tokens than that context is left to refuse it after them)."""
    s = SimServer(speedup=10, jitter=0.0)
    s.app = SimApp(s.config, engine=Engine(get_profile("interactive", kv_tokens=256),
                                           speedup=10, jitter=0.0))
    with s:
        body = {"model": "m", "input": "x", "max_output_tokens": 1000}
        assert httpx.post(s.url + "/v1/responses", json=body).status_code == 400
        r, events = post_stream(s.url + "/v1/responses", {**body, "stream": True})
        assert r.status_code == 200
        last = EVENTS.validate_python(events[-1][1])
        assert events[-1][0] == "error" and last.type == "error"
        assert "KV cache" in last.message and last.sequence_number == len(events) - 1
