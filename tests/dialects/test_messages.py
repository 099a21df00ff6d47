"""The Anthropic Messages front-end's translation (gateway/dialects/messages/), table-driven from
examples written from Anthropic's API reference, plus round-trip properties:

* chat -> Messages -> chat keeps every message, tool call and setting (request direction), and
  chat answer -> Messages answer -> chat answer every content, tool call and usage figure;
* a translated stream, cut at random byte positions, folded by the ``anthropic`` SDK's own
  accumulator, is the same message as ``answer()`` of the same chat answer.

Outputs are validated with the SDK's pydantic models (``anthropic.types.Message``, the stream
event union, ``ErrorResponse``).
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.accounting.usage import BackendUsage, usage_from_mapping
from gateway.dialects.messages import (
    ERROR_PREFIX,
    MessagesFrontend,
    MessagesStream,
    count_tokens,
)
from gateway.errors import (
    AuthenticationFailed,
    BackendFailure,
    BodyTooLarge,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NoBackendAvailable,
    QuotaStoreUnavailable,
    RateLimited,
    RouteNotFound,
    ServerShuttingDown,
    UpstreamTimeout,
)
from gateway.tokenizers import count_chat_prompt
from tests.dialects.inverse_messages import chat_answer_from_message, to_messages
from tests.dialects.sse import chat_stream, read_events, split_at

FRONT = MessagesFrontend()
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
#: a 1x1 PNG
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
       "AAAABJRU5ErkJggg==")


def req(messages: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    """A Messages request; ``messages`` defaults to one user turn."""
    payload: dict[str, Any] = {
        "model": "claude-sonnet",
        "max_tokens": 256,
        "messages": messages if messages is not None else [{"role": "user", "content": "Hi"}],
    }
    payload.update(fields)
    return payload


def chat(messages: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    """The chat request expected for ``req`` with the same arguments."""
    payload: dict[str, Any] = {
        "model": "claude-sonnet",
        "messages": messages if messages is not None else [{"role": "user", "content": "Hi"}],
        "max_tokens": 256,
    }
    payload.update(fields)
    return payload


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a given location",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}
WEATHER_FUNCTION = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": WEATHER_TOOL["input_schema"],
        "description": WEATHER_TOOL["description"],
    },
}
TOOL_USE_TURNS = [
    {"role": "user", "content": "What's the weather like in Paris?"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "I'll check the weather."},
        {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9",
         "name": "get_weather", "input": {"location": "Paris, France"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
         "content": "15 degrees"},
    ]},
]
TOOL_USE_CHAT = [
    {"role": "user", "content": "What's the weather like in Paris?"},
    {"role": "assistant", "content": "I'll check the weather.", "tool_calls": [
        {"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"location":"Paris, France"}'}},
    ]},
    {"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "content": "15 degrees"},
]

TRANSLATIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("plain text", req(), chat()),
    ("system string", req(system="You are terse."),
     chat([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])),
    ("system blocks with cache_control: one system message each, cache_control dropped",
     req(system=[{"type": "text", "text": "You are terse."},
                 {"type": "text", "text": "<long manual>",
                  "cache_control": {"type": "ephemeral"}}]),
     chat([{"role": "system", "content": "You are terse."},
           {"role": "system", "content": "<long manual>"},
           {"role": "user", "content": "Hi"}])),
    ("user text blocks with cache_control and citations: text parts",
     req([{"role": "user", "content": [
         {"type": "text", "text": "<doc>", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
         {"type": "text", "text": "Summarise it.", "citations": None},
     ]}]),
     chat([{"role": "user", "content": [{"type": "text", "text": "<doc>"},
                                        {"type": "text", "text": "Summarise it."}]}])),
    ("a tool_use round trip", req(TOOL_USE_TURNS, tools=[WEATHER_TOOL]),
     chat(TOOL_USE_CHAT, tools=[WEATHER_FUNCTION])),
    ("tool_use only: content null; tool_result with is_error and text blocks",
     req([
         {"role": "user", "content": "Weather?"},
         {"role": "assistant", "content": [
             {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
              "content": [{"type": "text", "text": "ConnectionError:"},
                          {"type": "text", "text": "the weather service is down"}]}]},
     ]),
     chat([
         {"role": "user", "content": "Weather?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "t1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "t1",
          "content": ERROR_PREFIX + "ConnectionError:\nthe weather service is down"},
     ])),
    ("parallel tool results then text in one user turn: tool messages, then the user message",
     req([
         {"role": "assistant", "content": [
             {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}},
             {"type": "tool_use", "id": "b", "name": "f", "input": {"x": [2, "3"]}}]},
         {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "a", "content": "one"},
             {"type": "tool_result", "tool_use_id": "b", "is_error": False},
             {"type": "text", "text": "Now compare."}]},
     ]),
     chat([
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
             {"id": "b", "type": "function",
              "function": {"name": "f", "arguments": '{"x":[2,"3"]}'}}]},
         {"role": "tool", "tool_call_id": "a", "content": "one"},
         {"role": "tool", "tool_call_id": "b", "content": ""},
         {"role": "user", "content": [{"type": "text", "text": "Now compare."}]},
     ])),
    ("images: base64 as a data: URL, url as is",
     req([{"role": "user", "content": [
         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
         {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"},
          "cache_control": {"type": "ephemeral"}},
         {"type": "text", "text": "Compare these."}]}]),
     chat([{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
         {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
         {"type": "text", "text": "Compare these."}]}])),
    ("assistant text blocks: several are text parts; thinking blocks dropped",
     req([{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": [
              {"type": "thinking", "thinking": "hmm", "signature": "sig"},
              {"type": "redacted_thinking", "data": "xx"},
              {"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]},
          {"role": "user", "content": "Go on"}], thinking={"type": "enabled",
                                                           "budget_tokens": 1024}),
     chat([{"role": "user", "content": "Hi"},
           {"role": "assistant", "content": [{"type": "text", "text": "Hello"},
                                             {"type": "text", "text": " there"}]},
           {"role": "user", "content": "Go on"}], reasoning_effort="low")),
    ("prefill: a final assistant string",
     req([{"role": "user", "content": "Answer (A) or (B)"},
          {"role": "assistant", "content": "The answer is ("}]),
     chat([{"role": "user", "content": "Answer (A) or (B)"},
           {"role": "assistant", "content": "The answer is ("}])),
    ("sampling, stops, metadata; top_k and service_tier dropped",
     req(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:", "END"],
         metadata={"user_id": "user-1234"}, service_tier="auto",
         cache_control={"type": "ephemeral"}),
     chat(temperature=0.2, top_p=0.9, stop=["\n\nHuman:", "END"], user="user-1234")),
    ("metadata without user_id, empty stop_sequences, null optional fields",
     req(metadata={"user_id": None}, stop_sequences=[], temperature=None, top_k=None, tools=[]),
     chat()),
    ("stream: stream_options.include_usage", req(stream=True),
     chat(stream=True, stream_options={"include_usage": True})),
    ("stream false", req(stream=False), chat()),
    ("tool_choice auto", req(tools=[WEATHER_TOOL], tool_choice={"type": "auto"}),
     chat(tools=[WEATHER_FUNCTION], tool_choice="auto")),
    ("tool_choice any, one call at a time",
     req(tools=[WEATHER_TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
     chat(tools=[WEATHER_FUNCTION], tool_choice="required", parallel_tool_calls=False)),
    ("tool_choice tool", req(tools=[WEATHER_TOOL],
                             tool_choice={"type": "tool", "name": "get_weather"}),
     chat(tools=[WEATHER_FUNCTION],
          tool_choice={"type": "function", "function": {"name": "get_weather"}})),
    ("tool_choice none", req(tools=[WEATHER_TOOL], tool_choice={"type": "none"}),
     chat(tools=[WEATHER_FUNCTION], tool_choice="none")),
    ("tool_choice auto without tools: nothing to choose", req(tool_choice={"type": "auto"}),
     chat()),
    ("custom tool type, strict, cache_control on a tool",
     req(tools=[{"type": "custom", "name": "f", "input_schema": {"type": "object"},
                 "strict": True, "cache_control": {"type": "ephemeral"}}]),
     chat(tools=[{"type": "function", "function": {"name": "f",
                                                    "parameters": {"type": "object"},
                                                    "strict": True}}])),
]


@pytest.mark.parametrize(("payload", "expected"), [t[1:] for t in TRANSLATIONS],
                         ids=[t[0] for t in TRANSLATIONS])
def test_translate(payload: dict[str, Any], expected: dict[str, Any]) -> None:
    before = copy.deepcopy(payload)
    translated = FRONT.to_chat(payload)
    assert translated.chat == expected
    assert translated.model == "claude-sonnet"
    assert translated.max_output == 256
    assert translated.stream is bool(payload.get("stream"))
    assert payload == before  # the client's payload is not changed


def test_earlier_messages_come_after_the_system_and_before_the_request() -> None:
    earlier = [{"role": "user", "content": "Before"}, {"role": "assistant", "content": "Yes"}]
    translated = FRONT.to_chat(req(system="S"), earlier)
    assert translated.chat["messages"] == [
        {"role": "system", "content": "S"}, *earlier, {"role": "user", "content": "Hi"}]


def test_frontend_names() -> None:
    assert (FRONT.name, FRONT.path, FRONT.upstream_path) == (
        "messages", "/v1/messages", "/v1/messages")


# --- refusals: every one a 400 naming the field ----------------------------------------------


def _without(key: str) -> dict[str, Any]:
    payload = req()
    del payload[key]
    return payload


def _user(*blocks: Any) -> dict[str, Any]:
    return req([{"role": "user", "content": list(blocks)}])


def _assistant(*blocks: Any) -> dict[str, Any]:
    return req([{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": list(blocks)}])


def _result(**fields: Any) -> dict[str, Any]:
    return _user({"type": "tool_result", "tool_use_id": "t1", **fields})


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}

REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("model missing", _without("model"), "model", "field required"),
    ("model empty", req(model=""), "model", "must not be empty"),
    ("model not a string", req(model=3), "model", "must be a string"),
    ("max_tokens missing", _without("max_tokens"), "max_tokens", "field required"),
    ("max_tokens zero", req(max_tokens=0), "max_tokens", "at least 1"),
    ("max_tokens a string", req(max_tokens="100"), "max_tokens", "must be an integer"),
    ("max_tokens a boolean", req(max_tokens=True), "max_tokens", "must be an integer"),
    ("max_tokens a float", req(max_tokens=10.5), "max_tokens", "must be an integer"),
    ("messages missing", _without("messages"), "messages", "field required"),
    ("messages empty", req([]), "messages", "at least one message"),
    ("messages an object", req(messages={"role": "user"}), "messages", "must be an array"),
    ("a message not an object", req(["Hi"]), "messages[0]", "must be an object"),
    ("role tool", req([{"role": "tool", "content": "x"}]), "messages[0].role",
     "'user', 'assistant' or 'system'"),
    ("content missing", req([{"role": "user"}]), "messages[0].content", "field required"),
    ("content a number", req([{"role": "user", "content": 5}]), "messages[0].content",
     "must be an array"),
    ("content empty", req([{"role": "user", "content": []}]), "messages[0].content",
     "must not be empty"),
    ("block not an object", _user("text"), "messages[0].content[0]", "must be an object"),
    ("block without type", _user({"text": "x"}), "messages[0].content[0].type", "'type'"),
    ("text not a string", _user({"type": "text", "text": 1}), "messages[0].content[0].text",
     "must be a string"),
    ("tool_use in a user message", _user({"type": "tool_use", "id": "t", "name": "f",
                                          "input": {}}),
     "messages[0].content[0].type", "belong in assistant messages"),
    ("tool_result in an assistant message", _assistant({"type": "tool_result",
                                                        "tool_use_id": "t"}),
     "messages[1].content[0].type", "belong in user messages"),
    ("image source unknown", _user({"type": "image", "source": {"type": "s3"}}),
     "messages[0].content[0].source.type", "'base64', 'url' or 'file'"),
    ("image media type", _user({"type": "image", "source": {"type": "base64",
                                                            "media_type": "image/tiff",
                                                            "data": PNG}}),
     "messages[0].content[0].source.media_type", "image/png"),
    ("image without data", _user({"type": "image", "source": {"type": "base64",
                                                              "media_type": "image/png"}}),
     "messages[0].content[0].source.data", "must be a string"),
    ("image without source", _user({"type": "image"}), "messages[0].content[0].source",
     "must be an object"),
    ("tool_result without tool_use_id", _user({"type": "tool_result", "content": "x"}),
     "messages[0].content[0].tool_use_id", "must be a string"),
    ("tool_result content a number", _result(content=3), "messages[0].content[0].content",
     "must be an array"),
    ("tool_result is_error not a boolean", _result(content="x", is_error="yes"),
     "messages[0].content[0].is_error", "must be a boolean"),
    ("tool_use input not an object", _assistant({"type": "tool_use", "id": "t", "name": "f",
                                                 "input": "{}"}),
     "messages[1].content[0].input", "must be an object"),
    ("tool_use without id", _assistant({"type": "tool_use", "name": "f", "input": {}}),
     "messages[1].content[0].id", "must be a string"),
    ("tool_use without name", _assistant({"type": "tool_use", "id": "t", "input": {}}),
     "messages[1].content[0].name", "must be a string"),
    ("system a number", req(system=1), "system", "must be an array"),
    ("system image block", req(system=[IMAGE]), "system[0].type", "must be 'text'"),
    ("system text not a string", req(system=[{"type": "text", "text": None}]), "system[0].text",
     "must be a string"),
    ("temperature above 1", req(temperature=1.5), "temperature", "between 0 and 1"),
    ("temperature a string", req(temperature="hot"), "temperature", "must be a number"),
    ("top_p negative", req(top_p=-0.1), "top_p", "between 0 and 1"),
    ("top_k negative", req(top_k=-1), "top_k", "non-negative integer"),
    ("stop_sequences a string", req(stop_sequences="END"), "stop_sequences", "must be an array"),
    ("stop_sequences with a number", req(stop_sequences=["a", 1]), "stop_sequences[1]",
     "must be a string"),
    ("stop_sequences with an empty string", req(stop_sequences=[""]), "stop_sequences[0]",
     "must not be empty"),
    ("stream a string", req(stream="yes"), "stream", "must be a boolean"),
    ("metadata a string", req(metadata="x"), "metadata", "must be an object"),
    ("metadata.user_id a number", req(metadata={"user_id": 7}), "metadata.user_id",
     "must be a string"),
    ("tools an object", req(tools={"name": "f"}), "tools", "must be an array"),
    ("tool type not a string", req(tools=[{"type": 3, "name": "f"}]), "tools[0].type",
     "must be a string"),
    ("tool without input_schema", req(tools=[{"name": "f"}]), "tools[0].input_schema",
     "field required"),
    ("tool without name", req(tools=[{"input_schema": {}}]), "tools[0].name",
     "must be a string"),
    ("tool input_schema not an object", req(tools=[{"name": "f", "input_schema": []}]),
     "tools[0].input_schema", "must be an object"),
    ("tool description not a string",
     req(tools=[{"name": "f", "input_schema": {}, "description": 1}]), "tools[0].description",
     "must be a string"),
    ("tool_choice unknown", req(tools=[WEATHER_TOOL], tool_choice={"type": "required"}),
     "tool_choice.type", "'auto', 'any', 'tool' or 'none'"),
    ("tool_choice a string", req(tools=[WEATHER_TOOL], tool_choice="auto"), "tool_choice",
     "must be an object"),
    ("tool_choice tool without name", req(tools=[WEATHER_TOOL], tool_choice={"type": "tool"}),
     "tool_choice.name", "must be a string"),
    ("tool_choice any without tools", req(tool_choice={"type": "any"}), "tool_choice",
     "needs 'tools'"),
    ("disable_parallel_tool_use not a boolean",
     req(tools=[WEATHER_TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": 1}),
     "tool_choice.disable_parallel_tool_use", "must be a boolean"),
    ("structured output of another type", req(output_config={"format": {"type": "regex"}}),
     "output_config.format.type", "'json_schema'"),
    ("output_config.effort unknown", req(output_config={"effort": "extreme"}),
     "output_config.effort", "'low', 'medium'"),
    ("thinking type unknown", req(thinking={"type": "sometimes"}), "thinking.type",
     "'enabled', 'adaptive'"),
    ("thinking enabled without a budget", req(thinking={"type": "enabled"}),
     "thinking.budget_tokens", "must be an integer"),
]


@pytest.mark.parametrize(("payload", "param", "words"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_refusal(payload: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        FRONT.to_chat(payload)
    error = caught.value
    assert error.param == param
    assert error.message.startswith(f"{param}: ")
    assert words in error.message
    status, body = FRONT.error(error)
    assert status == 400
    parsed = ErrorResponse.model_validate_json(body)
    assert parsed.error.type == "invalid_request_error"
    assert parsed.error.message == error.message


def test_a_huge_unknown_key_is_named_clipped() -> None:
    """An unknown field is dropped and named, its name cut short: a client's key can be
    megabytes, and the name goes into a response header."""
    translated = FRONT.to_chat(req(**{"x" * 10_000: 1}))
    (name,) = translated.ignored
    assert name.startswith("xxx") and len(name) <= 64
    assert translated.refusal is None


# --- answers ----------------------------------------------------------------------------------

USAGE = {
    "prompt_tokens": 2095, "completion_tokens": 503, "total_tokens": 2598,
    "prompt_tokens_details": {"cached_tokens": 1800, "cache_write_tokens": 200},
}


def completion(content: str | None = "Hello!", *, finish: str | None = "stop",
               calls: list[tuple[str, str, str]] | None = None, usage: Any = USAGE,
               refusal: str | None = None, **choice_fields: Any) -> dict[str, Any]:
    """A chat completion; ``calls``: (id, name, arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls]
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
              **choice_fields}
    out: dict[str, Any] = {"id": "chatcmpl-9", "object": "chat.completion", "created": 1,
                           "model": "backend-model-v3", "choices": [choice]}
    if usage is not None:
        out["usage"] = usage
    return out


ANTHROPIC_USAGE = {"input_tokens": 95, "cache_creation_input_tokens": 200,
                   "cache_read_input_tokens": 1800, "output_tokens": 503}

ANSWERS: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, str | None]] = [
    ("text", completion(), [{"type": "text", "text": "Hello!"}], "end_turn", None),
    ("tool calls after text",
     completion("Let me check.", finish="tool_calls",
                calls=[("call_1", "get_weather", '{"location": "Paris"}'),
                       ("call_2", "get_time", "")]),
     [{"type": "text", "text": "Let me check."},
      {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"location": "Paris"}},
      {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}],
     "tool_use", None),
    ("tool calls with finish stop, no text",
     completion(None, calls=[("call_1", "f", '{"a": [1, 2]}')]),
     [{"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": [1, 2]}}],
     "tool_use", None),
    ("arguments that are not a JSON object are kept raw",
     completion(None, finish="tool_calls", calls=[("c1", "f", '{"a": '), ("c2", "g", "[1]")]),
     [{"type": "tool_use", "id": "c1", "name": "f", "input": {"_raw": '{"a": '}},
      {"type": "tool_use", "id": "c2", "name": "g", "input": {"_raw": "[1]"}}],
     "tool_use", None),
    ("a tool call without an id gets one from the request id",
     completion(None, finish="tool_calls", calls=[("", "f", "{}")]),
     [{"type": "tool_use", "id": "toolu_req42_0", "name": "f", "input": {}}], "tool_use", None),
    ("length", completion("Once upon", finish="length"), [{"type": "text", "text": "Once upon"}],
     "max_tokens", None),
    ("length during a tool call",
     completion(None, finish="length", calls=[("c", "f", '{"a": 1}')]),
     [{"type": "tool_use", "id": "c", "name": "f", "input": {"a": 1}}], "max_tokens", None),
    ("a stop sequence named by the backend (vLLM stop_reason)",
     completion("1, 2, 3", stop_reason="END"), [{"type": "text", "text": "1, 2, 3"}],
     "stop_sequence", "END"),
    ("an EOS token id as vLLM stop_reason is a natural end",
     completion("Done.", stop_reason=128001), [{"type": "text", "text": "Done."}],
     "end_turn", None),
    ("content_filter", completion("", finish="content_filter"), [], "refusal", None),
    ("an OpenAI refusal", completion(None, refusal="I can't help with that."),
     [{"type": "text", "text": "I can't help with that."}], "refusal", None),
    ("content as text parts", completion([{"type": "text", "text": "a"},  # type: ignore[arg-type]
                                          {"type": "text", "text": "b"}]),
     [{"type": "text", "text": "ab"}], "end_turn", None),
    ("empty content", completion(""), [], "end_turn", None),
    ("no finish reason", completion("Hi", finish=None), [{"type": "text", "text": "Hi"}],
     "end_turn", None),
]


@pytest.mark.parametrize(("answer", "content", "reason", "sequence"),
                         [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_answer(answer: dict[str, Any], content: list[dict[str, Any]], reason: str,
                sequence: str | None) -> None:
    message = FRONT.answer(answer, model="claude-sonnet", request_id="req42")
    assert message == {
        "id": "msg_req42", "type": "message", "role": "assistant", "model": "claude-sonnet",
        "content": content, "stop_reason": reason, "stop_sequence": sequence,
        "usage": ANTHROPIC_USAGE,
    }
    Message.model_validate(message)


def test_answer_usage_excludes_the_cache_from_input_tokens() -> None:
    """input_tokens = prompt - cache read - cache write; the accounting reads the total back."""
    message = FRONT.answer(completion(), model="m", request_id="r")
    assert message["usage"]["input_tokens"] == 2095 - 1800 - 200
    assert FRONT.usage(message) == BackendUsage(
        prompt_tokens=2095, completion_tokens=503, total_tokens=2598, cached_tokens=1800,
        cache_write_tokens=200)


@pytest.mark.parametrize(("usage", "expected"), [
    ({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
     {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
      "output_tokens": 4}),
    # DeepSeek's names; LiteLLM's Anthropic-style cache names on an OpenAI-shaped usage
    ({"prompt_tokens": 10, "completion_tokens": 4, "prompt_cache_hit_tokens": 6,
      "prompt_cache_miss_tokens": 4},
     {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 6,
      "output_tokens": 4}),
    ({"prompt_tokens": 10, "completion_tokens": 4, "cache_read_input_tokens": 3,
      "cache_creation_input_tokens": 5},
     {"input_tokens": 2, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 3,
      "output_tokens": 4}),
    ({"prompt_tokens": 10, "completion_tokens": 40,
      "completion_tokens_details": {"reasoning_tokens": 32}},
     {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
      "output_tokens": 40, "output_tokens_details": {"thinking_tokens": 32}}),
    (None, {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": 0}),
    ({"prompt_tokens": -1}, {"input_tokens": 0, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0, "output_tokens": 0}),
], ids=["plain", "deepseek", "anthropic-names", "reasoning", "none", "malformed"])
def test_answer_usage_shapes(usage: Any, expected: dict[str, int]) -> None:
    message = FRONT.answer(completion(usage=usage), model="m", request_id="r")
    assert message["usage"] == expected
    Message.model_validate(message)


def test_answer_of_a_malformed_completion_is_empty_not_an_error() -> None:
    for body in ({}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": None}]},
                 {"choices": [{"message": {"tool_calls": ["x", {"function": None}]}}]}):
        message = FRONT.answer(body, model="m", request_id="r")
        assert message["content"] == []
        Message.model_validate(message)


@pytest.mark.parametrize(("usage", "expected"), [
    ({"input_tokens": 25, "output_tokens": 9, "cache_read_input_tokens": 100,
      "cache_creation_input_tokens": 50},
     BackendUsage(prompt_tokens=175, completion_tokens=9, total_tokens=184, cached_tokens=100,
                  cache_write_tokens=50)),
    ({"input_tokens": 25, "output_tokens": 9,
      "cache_creation": {"ephemeral_5m_input_tokens": 3, "ephemeral_1h_input_tokens": 4}},
     BackendUsage(prompt_tokens=32, completion_tokens=9, total_tokens=41, cache_write_tokens=7)),
    ({"input_tokens": -3, "output_tokens": 9}, None),
    ("not an object", None),
], ids=["cache", "by-lifetime", "malformed", "not-an-object"])
def test_usage_of_a_native_answer(usage: Any, expected: BackendUsage | None) -> None:
    assert FRONT.usage({"type": "message", "usage": usage}) == expected
    assert FRONT.usage({"type": "message"}) is None


# --- errors -----------------------------------------------------------------------------------

ERRORS: list[tuple[GatewayError, int, str]] = [
    (InvalidRequest("bad"), 400, "invalid_request_error"),
    (AuthenticationFailed("Invalid API key"), 401, "authentication_error"),
    (ModelNotFound("no such model"), 404, "not_found_error"),
    (RouteNotFound("no route"), 404, "not_found_error"),
    (MethodNotAllowed("use POST"), 405, "invalid_request_error"),
    (BodyTooLarge("too big"), 413, "request_too_large"),
    (RateLimited("rpm of tenant:t", headers={"Retry-After": "3"}), 429, "rate_limit_error"),
    (InternalError("Internal error"), 500, "api_error"),
    (BackendFailure("backend said 500"), 502, "api_error"),
    (NoBackendAvailable("every backend is full"), 529, "overloaded_error"),
    (ServerShuttingDown("shutting down"), 529, "overloaded_error"),
    (QuotaStoreUnavailable("quota store away"), 503, "api_error"),
    (UpstreamTimeout("no first token in time"), 504, "timeout_error"),
]


@pytest.mark.parametrize(("error", "status", "kind"), ERRORS,
                         ids=[type(e[0]).__name__ for e in ERRORS])
def test_error(error: GatewayError, status: int, kind: str) -> None:
    got_status, body = FRONT.error(error)
    assert got_status == status
    assert json.loads(body) == {"type": "error", "error": {"type": kind,
                                                           "message": error.message}}
    if kind != "request_too_large":  # Anthropic documents it; the SDK's union lacks it
        ErrorResponse.model_validate_json(body)
    # the stream form is the same object as an ``error`` event
    stream = MessagesStream(model="m", request_id="r", prompt_tokens=1)
    stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
    assert read_events(stream.fail(error)) == [("error", json.loads(body))]


def test_error_keeps_the_headers_for_the_caller() -> None:
    error = RateLimited("rpm", headers={"Retry-After": "7"})
    FRONT.error(error)
    assert error.headers == {"Retry-After": "7"}


# --- count_tokens -----------------------------------------------------------------------------


def _count(chat_payload: dict[str, Any]) -> int:
    return count_chat_prompt(chat_payload["messages"])


def test_count_tokens_counts_the_translated_request() -> None:
    payload = {"model": "claude-sonnet", "system": "You are terse.", "messages": TOOL_USE_TURNS,
               "tools": [WEATHER_TOOL]}
    got = count_tokens(payload, _count)
    translated = FRONT.to_chat({**payload, "max_tokens": 1})
    assert got == {"input_tokens": count_chat_prompt(translated.chat["messages"])}
    assert got["input_tokens"] > 10
    # max_tokens may be given, and is checked
    assert count_tokens({**payload, "max_tokens": 5}, _count) == got
    with pytest.raises(InvalidRequest) as caught:
        count_tokens({**payload, "max_tokens": 0}, _count)
    assert caught.value.param == "max_tokens"
    # what a translation would refuse is counted without (the count is of what chat gets)
    document = {"type": "document", "source": {}}
    with_document = count_tokens({**payload, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Read"}, document]}]}, _count)
    without = count_tokens({**payload, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Read"}]}]}, _count)
    assert with_document == without


def test_count_tokens_ignores_stream() -> None:
    seen: list[dict[str, Any]] = []
    count_tokens({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
                 lambda c: seen.append(c) or 1)
    assert "stream" not in seen[0] and "stream_options" not in seen[0]


# --- streams: examples ------------------------------------------------------------------------


def translate_stream(data: bytes, *, cuts: list[int] | None = None, prompt_tokens: int = 2095,
                     end: bool = True) -> list[tuple[str, dict[str, Any]]]:
    stream = FRONT.stream(model="claude-sonnet", request_id="req42", prompt_tokens=prompt_tokens)
    out = b"".join(stream.feed(piece) for piece in split_at(data, cuts or []))
    if end:
        out += stream.finish()
    events = read_events(out)
    for name, event in events:
        if name not in ("ping", "error"):
            EVENTS.validate_python(event)
    return events


def fold(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The message the ``anthropic`` SDK accumulates from the events."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, event in events:
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(event=event,  # type: ignore[arg-type]
                                    current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump()).model_dump(exclude_none=True)


def names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in events]


def assert_anthropic_order(seen: list[str]) -> None:
    """message_start first, one ping right after the first content_block_start (before
    message_delta when no block came), message_delta and message_stop last."""
    assert seen[0] == "message_start"
    assert seen[-2:] == ["message_delta", "message_stop"]
    assert seen.count("ping") == 1
    if "content_block_start" in seen:
        assert seen.index("ping") == seen.index("content_block_start") + 1
    else:
        assert seen.index("ping") == len(seen) - 3


def test_stream_of_text_in_anthropic_order() -> None:
    answer = completion("Hello there!")
    events = translate_stream(chat_stream(answer, content_pieces=["Hel", "lo", " there!"]))
    assert names(events) == [  # the ping after the first block's start, as Anthropic sends it
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    start = events[0][1]["message"]
    assert start["usage"] == {"input_tokens": 2095, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 0, "output_tokens": 1}
    assert start["content"] == [] and start["stop_reason"] is None
    assert [e["delta"] for _, e in events[3:6]] == [
        {"type": "text_delta", "text": t} for t in ("Hel", "lo", " there!")]
    assert events[7][1] == {"type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": ANTHROPIC_USAGE}
    assert fold(events) == Message.model_validate(
        FRONT.answer(answer, model="claude-sonnet", request_id="req42")).model_dump(
            exclude_none=True)


def test_stream_of_tool_calls() -> None:
    answer = completion("Checking.", finish="tool_calls",
                        calls=[("call_a", "get_weather", '{"location": "Paris"}'),
                               ("call_b", "get_time", "")])
    data = chat_stream(answer, argument_pieces=[['{"loc', 'ation": "Paris"}'], []])
    events = translate_stream(data)
    assert names(events) == [
        "message_start",
        "content_block_start", "ping", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_stop",
        "message_delta", "message_stop"]
    assert events[5][1]["content_block"] == {"type": "tool_use", "id": "call_a",
                                             "name": "get_weather", "input": {}}
    assert [e["delta"]["partial_json"] for _, e in events[6:8]] == ['{"loc', 'ation": "Paris"}']
    assert events[9][1] == {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "call_b", "name": "get_time", "input": {}}}
    assert events[11][1]["delta"]["stop_reason"] == "tool_use"
    final = fold(events)
    assert final["content"][1]["input"] == {"location": "Paris"}
    assert final == Message.model_validate(
        FRONT.answer(answer, model="claude-sonnet", request_id="req42")).model_dump(
            exclude_none=True)


def test_each_feed_returns_what_it_can_write_now() -> None:
    """Never buffered: a whole chat event gives its Anthropic events in the same feed."""
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=3)
    first = read_events(stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"A"}}]}'))
    assert names(first) == ["message_start"]  # the head goes out at once
    assert names(read_events(stream.feed(b"\n\n"))) == ["content_block_start", "ping",
                                                        "content_block_delta"]
    assert stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"B"}}]}\n') == b""
    assert names(read_events(stream.feed(b"\n"))) == ["content_block_delta"]
    done = read_events(stream.feed(
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'))
    assert names(done) == ["content_block_stop"]  # message_delta waits for the usage chunk
    tail = read_events(stream.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,'
                                   b'"completion_tokens":2}}\n\n'))
    assert names(tail) == ["message_delta", "message_stop"]
    assert stream.feed(b"data: [DONE]\n\n") == b""
    assert stream.finish() == b""


def test_usage_on_the_finish_chunk_and_crlf_lines() -> None:
    answer = completion("Hi", finish="length")
    data = chat_stream(answer, usage="on-finish", newline=b"\r\n")
    events = translate_stream(data, cuts=list(range(0, len(data), 7)))
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"] == ANTHROPIC_USAGE


def test_a_stop_sequence_in_the_stream() -> None:
    answer = completion("1, 2", stop_reason="END")
    events = translate_stream(chat_stream(answer))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stream_without_usage_ends_at_done_with_an_output_estimate() -> None:
    answer = completion("abc")
    data = chat_stream(answer, content_pieces=["a", "b", "c"], usage="none")
    events = translate_stream(data, end=False)  # [DONE] alone closes the message
    assert names(events)[-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["usage"] == {"output_tokens": 3}
    final = fold(events)
    assert final["usage"]["input_tokens"] == 2095  # the gateway's count from message_start


def test_stream_cut_before_its_finish_reason_is_closed_by_finish() -> None:
    data = b'data: {"choices":[{"index":0,"delta":{"content":"Hal"}}]}\n\ndata: {"choices":[{"ind'
    events = translate_stream(data)
    assert names(events) == ["message_start", "content_block_start", "ping",
                             "content_block_delta", "content_block_stop", "message_delta",
                             "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert fold(events)["content"] == [{"type": "text", "text": "Hal"}]


def test_finish_of_an_empty_stream_is_a_whole_empty_message() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    events = read_events(stream.finish())
    assert names(events) == ["message_start", "ping", "message_delta", "message_stop"]
    # (no block came: the one ping goes before the end)
    assert fold(events)["content"] == []


def test_a_last_event_without_a_blank_line_is_read_at_finish() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    out = stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"},'
                      b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,'
                      b'"completion_tokens":1}}')
    out += stream.finish()
    events = read_events(out)
    assert fold(events)["content"] == [{"type": "text", "text": "x"}]
    assert events[-2][1]["usage"]["output_tokens"] == 1


def test_fail_ends_the_stream_with_an_error_event() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
    assert read_events(stream.fail(UpstreamTimeout("the backend stopped sending"))) == [
        ("error", {"type": "error", "error": {"type": "timeout_error",
                                              "message": "the backend stopped sending"}})]
    assert stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"y"}}]}\n\n') == b""
    assert stream.finish() == b""


def test_fail_after_message_stop_adds_nothing() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    stream.feed(chat_stream(completion("x")))
    assert stream.fail(BackendFailure("reset")) == b""


def test_a_backend_error_event_mid_stream_is_an_error_without_its_detail() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    out = stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
                      b'data: {"error":{"message":"CUDA OOM at 10.0.0.7","type":"server"}}\n\n')
    events = read_events(out + stream.finish())
    assert events[-1] == ("error", {"type": "error", "error": {
        "type": "api_error", "message": "The backend failed during the stream."}})
    assert b"10.0.0.7" not in out


def test_malformed_and_foreign_events_are_skipped() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    out = stream.feed(b": keep-alive\n\nevent: chunk\nid: 3\ndata: not json\n\n"
                      b'data: {"choices":[{"index":1,"delta":{"content":"second choice"}}]}\n\n'
                      b'data: {"choices":[{"index":0,"delta":{"content":5}}]}\n\n'
                      b'data: {"choices":[{"index":0,"delta":{"content":"ok"}}],'
                      b'"usage":{"prompt_tokens":"many"}}\n\n')
    out += stream.finish()
    assert stream.malformed == 2
    events = read_events(out)
    assert fold(events)["content"] == [{"type": "text", "text": "ok"}]
    assert events[-2][1]["usage"] == {"output_tokens": 1}  # the malformed usage is not used


def test_multi_line_data_events() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)
    out = stream.feed(b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"ok"}}]}\n\n')
    assert fold(read_events(out + stream.finish()))["content"] == [{"type": "text",
                                                                     "text": "ok"}]


def test_interleaved_tool_call_fragments_still_reach_their_block() -> None:
    stream = FRONT.stream(model="m", request_id="r", prompt_tokens=5)

    def call(index: int, arguments: str, **first: str) -> bytes:
        function: dict[str, str] = {"arguments": arguments}
        if "name" in first:
            function["name"] = first["name"]
        body = {"index": index, **({"id": first["id"]} if "id" in first else {}),
                "function": function}
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {
            "tool_calls": [body]}}]}).encode() + b"\n\n"

    out = stream.feed(call(0, '{"a":', id="x", name="f") + call(1, '{"b":2}', id="y", name="g")
                      + call(0, "1}"))
    out += stream.finish()
    final = fold(read_events(out))
    assert [b["input"] for b in final["content"]] == [{"a": 1}, {"b": 2}]


# --- properties -------------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
WORD = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORD, inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(WORD, JSON_VALUE, max_size=4)


def _encode_args(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


@st.composite
def tool_calls(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 3))
    return [{"id": f"{prefix}_{i}", "type": "function",
             "function": {"name": draw(WORD), "arguments": _encode_args(draw(ARGUMENTS))}}
            for i in range(n)]


@st.composite
def user_content(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(TEXT)
    part = st.one_of(
        TEXT.map(lambda t: {"type": "text", "text": t}),
        st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]).map(
            lambda m: {"type": "image_url", "image_url": {"url": f"data:{m};base64,{PNG}"}}),
        WORD.map(lambda w: {"type": "image_url",
                            "image_url": {"url": f"https://example.com/{w}.png"}}),
    )
    return draw(st.lists(part, min_size=1, max_size=3))


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    """Chat requests in the subset the Messages API expresses too."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": text} for text in draw(st.lists(TEXT.filter(bool),
                                                                      max_size=2))]
    for turn in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["user", "assistant", "calls"]))
        if kind == "user":
            messages.append({"role": "user", "content": draw(user_content())})
        elif kind == "assistant":
            messages.append({"role": "assistant", "content": draw(TEXT)})
        else:
            calls = draw(tool_calls(f"call{turn}"))
            content = draw(st.none() | TEXT.filter(bool))
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            messages.extend({"role": "tool", "tool_call_id": call["id"], "content": draw(TEXT)}
                            for call in calls)
    payload: dict[str, Any] = {"model": draw(WORD), "messages": messages,
                               "max_tokens": draw(st.integers(1, 10**6))}
    if draw(st.booleans()):
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p"):
        if draw(st.booleans()):
            payload[name] = draw(st.floats(0, 1))
    if draw(st.booleans()):
        payload["stop"] = draw(st.lists(TEXT.filter(bool), min_size=1, max_size=4))
    if draw(st.booleans()):
        payload["user"] = draw(TEXT)
    if draw(st.booleans()):
        names = draw(st.lists(WORD, min_size=1, max_size=3, unique=True))
        payload["tools"] = [{"type": "function", "function": {
            "name": name, "parameters": {"type": "object", "properties": {
                p: {"type": "string"} for p in draw(st.lists(WORD, max_size=2))}},
            **({"description": draw(TEXT)} if draw(st.booleans()) else {})}} for name in names]
        choice = draw(st.sampled_from(["auto", "required", "none", "function", None]))
        if choice == "function":
            payload["tool_choice"] = {"type": "function",
                                      "function": {"name": draw(st.sampled_from(names))}}
        elif choice is not None:
            payload["tool_choice"] = choice
        if choice not in (None, "none") and draw(st.booleans()):
            payload["parallel_tool_calls"] = False
    return payload


def parsed_arguments(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with each tool call's arguments parsed: arguments are JSON text, re-encoded
    by the trip through a tool_use ``input`` (spacing and number spelling may change)."""
    out = copy.deepcopy(payload)
    for message in out["messages"]:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


@settings(max_examples=300, deadline=None)
@given(chat_requests())
def test_chat_to_messages_to_chat_keeps_every_message(payload: dict[str, Any]) -> None:
    messages = to_messages(payload)
    back = FRONT.to_chat(copy.deepcopy(messages))
    assert parsed_arguments(back.chat) == parsed_arguments(payload)
    assert back.max_output == payload["max_tokens"]
    assert back.stream is bool(payload.get("stream"))


@st.composite
def chat_answers(draw: st.DrawFn) -> dict[str, Any]:
    """Chat answers whose stop reason survives the trip (tool calls end with tool_calls or
    length; a stop sequence is named the vLLM way)."""
    calls = draw(st.none() | tool_calls("call"))
    content = draw(st.none() | TEXT.filter(bool))
    fields: dict[str, Any] = {}
    if calls:
        finish = draw(st.sampled_from(["tool_calls", "length"]))
    else:
        finish = draw(st.sampled_from(["stop", "length", "content_filter", "stop_sequence"]))
        if finish == "stop_sequence":
            finish, fields["stop_reason"] = "stop", draw(TEXT.filter(bool))
    prompt = draw(st.integers(0, 10**7))
    cached = draw(st.integers(0, prompt))
    write = draw(st.integers(0, prompt - cached))
    output = draw(st.integers(0, 10**6))
    reasoning = draw(st.integers(0, output))
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": output,
                             "total_tokens": prompt + output}
    shape = draw(st.sampled_from(["openai", "openrouter", "litellm"]))
    if shape == "openai":
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
        write = 0
    elif shape == "openrouter":
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "cache_write_tokens": write}
    else:
        usage["cache_read_input_tokens"] = cached
        usage["cache_creation_input_tokens"] = write
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    answer = completion(content, finish=finish, usage=usage, **fields)
    if calls:
        answer["choices"][0]["message"]["tool_calls"] = calls
    return answer


def _calls(message: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []]


@settings(max_examples=300, deadline=None)
@given(chat_answers())
def test_chat_answer_to_message_to_chat_keeps_content_calls_and_usage(
        answer: dict[str, Any]) -> None:
    message = FRONT.answer(answer, model="public", request_id="rid")
    Message.model_validate(message)
    back = chat_answer_from_message(message)
    choice, got = answer["choices"][0], back["choices"][0]
    assert got["message"]["content"] == choice["message"]["content"]
    assert _calls(got["message"]) == _calls(choice["message"])
    assert got["finish_reason"] == choice["finish_reason"]
    assert got.get("stop_reason") == choice.get("stop_reason")
    assert (usage_from_mapping(back["usage"], "openai")
            == usage_from_mapping(answer["usage"], "openai"))
    # and the accounting reads the same figures from the Anthropic usage itself
    native = FRONT.usage(message)
    assert native is not None
    assert native == BackendUsage(**{
        **msgspec_fields(usage_from_mapping(answer["usage"], "openai")), "reasoning_tokens": 0})


def msgspec_fields(usage: BackendUsage | None) -> dict[str, int]:
    assert usage is not None
    return {f: getattr(usage, f) for f in usage.__struct_fields__}


def _pieces(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=4))))
    points = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(points) if b > a]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_answers(), st.data())
def test_a_translated_stream_reassembles_to_the_answer(answer: dict[str, Any],
                                                       data: st.DataObject) -> None:
    message = answer["choices"][0]["message"]
    content = message.get("content") or ""
    stream = chat_stream(
        answer,
        content_pieces=_pieces(data.draw, content),
        argument_pieces=[_pieces(data.draw, c["function"]["arguments"])
                         for c in message.get("tool_calls") or []],
        usage=data.draw(st.sampled_from(["separate", "on-finish"])),
        done=data.draw(st.booleans()),
        newline=data.draw(st.sampled_from([b"\n", b"\r\n"])),
    )
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    events = translate_stream(stream, cuts=cuts)
    expected = FRONT.answer(answer, model="claude-sonnet", request_id="req42")
    assert fold(events) == Message.model_validate(expected).model_dump(exclude_none=True)
    assert_anthropic_order(names(events))
