"""The Responses front-end's translations, table-driven and property-tested.

The SDK's own models are the reference of the API's shapes: every answer is checked with
``openai.types.responses.Response``, every streamed event with the ``ResponseStreamEvent``
union, and streams are also folded by the SDK's stream helper state (what
``client.responses.stream(...)`` runs) besides our own fold.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.accounting.usage import BackendUsage, usage_from_mapping
from gateway.dialects.base import Frontend
from gateway.dialects.responses import (
    ResponsesFrontend,
    chat_answer_from_response,
    earlier_messages,
    input_items,
)
from gateway.dialects.responses.answer import responses_usage
from gateway.dialects.responses.stored import turn_messages
from gateway.errors import BackendFailure, InvalidRequest, UpstreamTimeout
from tests.dialects.inverse_responses import to_responses

FE = ResponsesFrontend()
RID = "0123456789abcdef0123456789abcdef"
EVENT = TypeAdapter(ResponseStreamEvent)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}, "strict": True}
CHAT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": WEATHER["parameters"], "strict": True}}
#: Codex's free-form tool (its Lark grammar is named when translated: test_ignored.py)
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "text"}}
CHAT_APPLY_PATCH = {"type": "function", "function": {
    "name": "apply_patch", "description": "Edit files.", "parameters": {
        "type": "object", "properties": {"input": {
            "type": "string",
            "description": "The raw free-form input of the tool, as plain text (not JSON)."}},
        "required": ["input"], "additionalProperties": False}}}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+h\u00e9 \"quoted\"\n*** End Patch\n"


def test_is_a_frontend() -> None:
    assert isinstance(FE, Frontend)
    assert (FE.name, FE.path, FE.upstream_path) == ("responses", "/v1/responses", "/v1/responses")


# -- requests ----------------------------------------------------------------------------------

TRANSLATIONS = [
    pytest.param(
        {"model": "m", "input": "Hello"},
        {"model": "m", "messages": [{"role": "user", "content": "Hello"}]},
        id="plain-string",
    ),
    pytest.param(
        {"model": "m", "input": "Hi", "instructions": "Be brief."},
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}]},
        id="instructions-first",
    ),
    pytest.param(
        {"model": "m", "input": [
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Two "}, {"type": "input_text",
                                                                 "text": "parts"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Deux", "annotations": []}]},
            {"role": "user", "content": "Encore"},
        ]},
        {"model": "m", "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Two parts"},
            {"role": "assistant", "content": "Deux"},
            {"role": "user", "content": "Encore"},
        ]},
        id="message-list",
    ),
    pytest.param(
        {"model": "m", "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                 "detail": "low"}]}]},
        {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                "detail": "low"}}]}]},
        id="image-by-url",
    ),
    pytest.param(
        {"model": "m", "tools": [WEATHER], "tool_choice": {"type": "function",
                                                          "name": "get_weather"},
         "parallel_tool_calls": False, "input": [
             {"role": "user", "content": "Weather in Paris and Oslo?"},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
              "arguments": '{"city":"Paris"}', "status": "completed"},
             {"type": "function_call", "call_id": "call_b", "name": "get_weather",
              "arguments": '{"city":"Oslo"}'},
             {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
             {"type": "function_call_output", "call_id": "call_b",
              "output": [{"type": "input_text", "text": "4C"}]},
         ]},
        {"model": "m", "messages": [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "4C"},
         ], "tools": [CHAT_WEATHER],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "parallel_tool_calls": False},
        id="function-tool-round-trip",
    ),
    pytest.param(
        {"model": "m", "input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}]},
        {"model": "m", "messages": [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
        id="call-without-text-and-reasoning-dropped",
    ),
    pytest.param(
        {"model": "m", "tools": [WEATHER, APPLY_PATCH],
         "tool_choice": {"type": "custom", "name": "apply_patch"}, "input": [
             {"role": "user", "content": "Add a.txt"},
             {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_p",
              "name": "apply_patch", "input": PATCH, "status": "completed"},
             {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"}]},
        {"model": "m", "messages": [
            {"role": "user", "content": "Add a.txt"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_p", "type": "function", "function": {
                    "name": "apply_patch",
                    "arguments": msgspec.json.encode({"input": PATCH}).decode()}}]},
            {"role": "tool", "tool_call_id": "call_p", "content": "Done!"}],
         "tools": [CHAT_WEATHER, CHAT_APPLY_PATCH],
         "tool_choice": {"type": "function", "function": {"name": "apply_patch"}}},
        id="custom-tool-round-trip",
    ),
    pytest.param(
        {"model": "m", "input": "x", "max_output_tokens": 64, "temperature": 0.2, "top_p": 0.9,
         "user": "u-1", "metadata": {"k": "v"}, "store": False, "truncation": "disabled",
         "parallel_tool_calls": True, "include": ["reasoning.encrypted_content"],
         "prompt_cache_key": "pk", "service_tier": "auto", "safety_identifier": "s",
         "reasoning": {"effort": "low", "summary": "auto"},
         "text": {"format": {"type": "json_schema", "name": "out", "strict": True,
                             "schema": {"type": "object"}}, "verbosity": "low"}},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 64,
         "temperature": 0.2, "top_p": 0.9, "user": "u-1", "reasoning_effort": "low",
         "response_format": {"type": "json_schema", "json_schema": {
             "name": "out", "schema": {"type": "object"}, "strict": True}}},
        id="settings",
    ),
    pytest.param(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}, "stream": True},
        {"model": "m", "messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "json_object"}, "stream": True,
         "stream_options": {"include_usage": True}},
        id="json-object-streamed",
    ),
]


@pytest.mark.parametrize(("payload", "chat"), TRANSLATIONS)
def test_translate(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    before = copy.deepcopy(payload)
    translated = FE.to_chat(payload)
    assert translated.chat == chat
    assert translated.model == payload["model"]
    assert translated.stream is bool(payload.get("stream"))
    assert translated.max_output == payload.get("max_output_tokens")
    assert payload == before  # the client's request is left as sent (it is stored and echoed)


def test_previous_response_goes_between_instructions_and_input() -> None:
    """``earlier`` (the stored conversation) follows the new instructions and precedes the new
    input, so the history split counts it as history."""
    earlier = [{"role": "user", "content": "My name is Ada."},
               {"role": "assistant", "content": "Hello Ada."}]
    translated = FE.to_chat({"model": "m", "instructions": "Be brief.",
                               "previous_response_id": "resp_x", "input": "My name?"}, earlier)
    assert translated.chat["messages"] == [
        {"role": "system", "content": "Be brief."}, *earlier,
        {"role": "user", "content": "My name?"}]
    assert earlier[-1] == {"role": "assistant", "content": "Hello Ada."}


REFUSALS = [
    pytest.param({"input": "x"}, "model", id="no-model"),
    pytest.param({"model": "", "input": "x"}, "model", id="empty-model"),
    pytest.param({"model": "m"}, "input", id="no-input"),
    pytest.param({"model": "m", "input": 3}, "input", id="input-not-string-or-list"),
    pytest.param({"model": "m", "input": []}, "input", id="input-empty"),
    pytest.param({"model": "m", "input": ["hi"]}, "input[0]", id="item-not-object"),
    pytest.param({"model": "m", "input": [{"role": "tool", "content": "x"}]},
                 "input[0].role", id="role"),
    pytest.param({"model": "m", "input": [{"role": "user", "content": 5}]},
                 "input[0].content", id="content-type"),
    pytest.param({"model": "m", "input": [{"role": "assistant", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]},
                 "input[0].content[0].type", id="image-outside-user-message"),
    pytest.param({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png", "detail": "max"}]}]},
                 "input[0].content[0].detail", id="image-detail"),
    pytest.param({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
                 "input[0].content[0].text", id="text-part-without-text"),
    pytest.param({"model": "m", "input": [{"type": "function_call", "name": "f",
                                           "arguments": "{}"}]},
                 "input[0].call_id", id="call-without-call-id"),
    pytest.param({"model": "m", "input": [{"type": "function_call", "call_id": "c",
                                           "name": "f", "arguments": {"a": 1}}]},
                 "input[0].arguments", id="call-arguments-not-string"),
    pytest.param({"model": "m", "input": [{"type": "function_call_output", "call_id": "c",
                                           "output": 4}]},
                 "input[0].output", id="call-output-type"),
    pytest.param({"model": "m", "input": [{"type": "function_call_output", "call_id": "c",
                                           "output": [{"type": "input_image"}]}]},
                 "input[0].output[0].type", id="call-output-image"),
    pytest.param({"model": "m", "input": "x", "instructions": ["a"]}, "instructions",
                 id="instructions-type"),
    pytest.param({"model": "m", "input": "x", "tools": [{"type": "function"}]},
                 "tools[0].name", id="tool-without-name"),
    pytest.param({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f",
                                                         "parameters": "{}"}]},
                 "tools[0].parameters", id="tool-parameters-type"),
    pytest.param({"model": "m", "input": "x", "tools": {"type": "function"}}, "tools",
                 id="tools-not-array"),
    pytest.param({"model": "m", "input": "x", "tool_choice": "any"}, "tool_choice",
                 id="tool-choice-value"),
    pytest.param({"model": "m", "input": "x", "tools": [WEATHER],
                  "tool_choice": {"type": "function", "name": "other"}},
                 "tool_choice.name", id="tool-choice-unknown-function"),
    pytest.param({"model": "m", "input": "x", "parallel_tool_calls": "yes"},
                 "parallel_tool_calls", id="parallel-type"),
    pytest.param({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens",
                 id="max-output-zero"),
    pytest.param({"model": "m", "input": "x", "max_output_tokens": True}, "max_output_tokens",
                 id="max-output-bool"),
    pytest.param({"model": "m", "input": "x", "temperature": 2.5}, "temperature",
                 id="temperature-range"),
    pytest.param({"model": "m", "input": "x", "top_p": "1"}, "top_p", id="top-p-type"),
    pytest.param({"model": "m", "input": "x", "user": 7}, "user", id="user-type"),
    pytest.param({"model": "m", "input": "x", "metadata": {"k": 1}}, "metadata",
                 id="metadata-value"),
    pytest.param({"model": "m", "input": "x", "metadata": {str(i): "v" for i in range(17)}},
                 "metadata", id="metadata-too-many"),
    pytest.param({"model": "m", "input": "x", "stream": "true"}, "stream", id="stream-type"),
    pytest.param({"model": "m", "input": "x", "store": 1}, "store", id="store-type"),
    pytest.param({"model": "m", "input": "x", "store": 1, "metadata": {"k": "v"}}, "store",
                 id="store-type-with-metadata"),
    pytest.param({"model": "m", "input": "x", "store": False, "truncation": "middle"},
                 "truncation", id="truncation-with-store"),
    pytest.param({"model": "m", "input": "x", "previous_response_id": 5},
                 "previous_response_id", id="previous-id-type"),
    pytest.param({"model": "m", "input": "x", "truncation": "middle"}, "truncation",
                 id="truncation"),
    pytest.param({"model": "m", "input": "x", "text": {"format": {"type": "xml"}}},
                 "text.format.type", id="text-format-type"),
    pytest.param({"model": "m", "input": "x", "text": {"format": {
        "type": "json_schema", "schema": {}}}}, "text.format.name", id="json-schema-no-name"),
    pytest.param({"model": "m", "input": "x", "text": {"format": {
        "type": "json_schema", "name": "n"}}}, "text.format.schema", id="json-schema-no-schema"),
    pytest.param({"model": "m", "input": "x", "reasoning": {"effort": "extreme"}},
                 "reasoning.effort", id="reasoning-effort"),
    pytest.param({"model": "m", "input": "x", "include": [3]}, "include[0]",
                 id="include-not-strings"),
    pytest.param({"model": "m", "input": "x", "top_logprobs": "3"}, "top_logprobs",
                 id="top-logprobs-type"),
    pytest.param({"model": "m", "input": "x", "tools": [{"name": "f"}]}, "tools[0].type",
                 id="tool-without-type"),
]
# (what chat cannot carry is refused only when translated, and what it has no place for is
# dropped and named: tests/dialects/test_ignored.py)


@pytest.mark.parametrize(("payload", "param"), REFUSALS)
def test_refusal_names_the_field(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        FE.to_chat(payload)
    assert caught.value.param == param
    status, body = FE.error(caught.value)
    error = msgspec.json.decode(body)["error"]
    assert status == 400
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


def test_error_keeps_openai_shape_and_status() -> None:
    status, body = FE.error(UpstreamTimeout("the backend did not answer in time"))
    assert status == 504
    assert msgspec.json.decode(body) == {"error": {
        "message": "the backend did not answer in time", "type": "api_error", "param": None,
        "code": "upstream_timeout"}}


# -- answers -----------------------------------------------------------------------------------

USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
         "prompt_tokens_details": {"cached_tokens": 64},
         "completion_tokens_details": {"reasoning_tokens": 10}}
RESPONSES_USAGE = {"input_tokens": 120,
                   "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
                   "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 10},
                   "total_tokens": 150}


def chat_answer(message: dict[str, Any], finish: str = "stop",
                usage: dict[str, Any] | None = USAGE) -> dict[str, Any]:
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1730000000,
              "model": "backend-model", "choices": [
                  {"index": 0, "message": {"role": "assistant", **message},
                   "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        answer["usage"] = usage
    return answer


def msg(index: int, parts: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {"id": f"msg_{RID}_{index}", "type": "message", "status": status,
            "role": "assistant", "content": parts}


def text(value: str) -> dict[str, Any]:
    return {"type": "output_text", "text": value, "annotations": []}


def call(index: int, call_id: str, name: str, arguments: str,
         status: str = "completed") -> dict[str, Any]:
    return {"id": f"fc_{RID}_{index}", "type": "function_call", "status": status,
            "arguments": arguments, "call_id": call_id, "name": name}


ANSWERS = [
    pytest.param(chat_answer({"content": "Hello!"}), [msg(0, [text("Hello!")])], "completed",
                 None, id="text"),
    pytest.param(
        chat_answer({"content": None, "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
            "tool_calls"),
        [call(0, "call_a", "get_weather", '{"city":"Paris"}'),
         call(1, "call_b", "get_weather", '{"city":"Oslo"}')], "completed", None,
        id="tool-calls"),
    pytest.param(
        chat_answer({"content": "Let me check.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls"),
        [msg(0, [text("Let me check.")]), call(1, "call_a", "f", "{}")], "completed", None,
        id="text-and-tool-call"),
    pytest.param(chat_answer({"content": "Once upon a"}, "length"),
                 [msg(0, [text("Once upon a")], "incomplete")], "incomplete",
                 {"reason": "max_output_tokens"}, id="length"),
    pytest.param(
        chat_answer({"content": "42", "reasoning_content": "6 times 7"}),
        [{"id": f"rs_{RID}_0", "type": "reasoning", "summary": [],
          "content": [{"type": "reasoning_text", "text": "6 times 7"}], "status": "completed"},
         msg(1, [text("42")])], "completed", None, id="reasoning"),
    pytest.param(chat_answer({"content": None, "refusal": "I can't help with that."}),
                 [msg(0, [{"type": "refusal", "refusal": "I can't help with that."}])],
                 "completed", None, id="refusal"),
    pytest.param(chat_answer({"content": None}), [msg(0, [text("")])], "completed", None,
                 id="empty"),
]


@pytest.mark.parametrize(("chat", "output", "status", "incomplete"), ANSWERS)
def test_answer(chat: dict[str, Any], output: list[dict[str, Any]], status: str,
                incomplete: dict[str, Any] | None) -> None:
    response = FE.answer(chat, model="public-model", request_id=RID)
    Response.model_validate(response)
    assert response["id"] == f"resp_{RID}"
    assert response["object"] == "response"
    assert response["model"] == "public-model"
    assert response["created_at"] == 1730000000
    assert (response["status"], response["incomplete_details"]) == (status, incomplete)
    assert response["output"] == output
    assert response["output_text"] == Response.model_validate(response).output_text
    assert response["usage"] == RESPONSES_USAGE
    assert response["error"] is None


def patch_call(index: int, call_id: str, input_: str, status: str = "completed"
               ) -> dict[str, Any]:
    return {"id": f"ctc_{RID}_{index}", "type": "custom_tool_call", "status": status,
            "call_id": call_id, "input": input_, "name": "apply_patch"}


CUSTOM_REQUEST = {"model": "public-model", "input": "Add a.txt", "tools": [WEATHER, APPLY_PATCH]}


@pytest.mark.parametrize(("arguments", "input_"), [
    pytest.param(msgspec.json.encode({"input": PATCH}).decode(), PATCH, id="input"),
    pytest.param('{ "input" : "x", "other": 1 }', "x", id="input-and-more"),
    pytest.param("*** Begin Patch", "*** Begin Patch", id="bare-text"),
    pytest.param('{"input": 5}', '{"input": 5}', id="input-not-a-string"),
    pytest.param('["x"]', '["x"]', id="not-an-object"),
    pytest.param('{"input": "cut sho', '{"input": "cut sho', id="cut-short"),
])
def test_answer_custom_tool_call(arguments: str, input_: str) -> None:
    """A chat call of one of the request's custom tools is a ``custom_tool_call`` item whose
    input is the arguments' ``input`` string (the arguments as they are when they hold none);
    a function's call stays a ``function_call``."""
    chat = chat_answer({"content": None, "tool_calls": [
        {"id": "call_w", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_p", "type": "function",
         "function": {"name": "apply_patch", "arguments": arguments}}]}, "tool_calls")
    response = FE.answer(chat, model="public-model", request_id=RID, request=CUSTOM_REQUEST)
    parsed = Response.model_validate(response)
    assert response["output"] == [call(0, "call_w", "get_weather", '{"city":"Paris"}'),
                                  patch_call(1, "call_p", input_)]
    custom = parsed.output[1]
    assert custom.type == "custom_tool_call" and custom.input == input_
    assert custom.call_id == "call_p" and custom.name == "apply_patch"
    assert response["tools"] == [WEATHER, APPLY_PATCH] and response["status"] == "completed"
    # without the request (or a custom tool in it) the same call is a function's
    plain = FE.answer(chat, model="public-model", request_id=RID)
    assert [item["type"] for item in plain["output"]] == ["function_call", "function_call"]


def test_answer_custom_tool_call_cut_at_the_limit_is_incomplete() -> None:
    chat = chat_answer({"content": None, "tool_calls": [
        {"id": "call_p", "type": "function",
         "function": {"name": "apply_patch", "arguments": '{"input": "*** Be'}}]}, "length")
    response = FE.answer(chat, model="m", request_id=RID, request=CUSTOM_REQUEST)
    Response.model_validate(response)
    assert response["output"] == [patch_call(0, "call_p", '{"input": "*** Be', "incomplete")]
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_answer_echoes_the_request() -> None:
    request = {"model": "public-model", "input": "x", "instructions": "Be brief.",
               "tools": [WEATHER], "tool_choice": "required", "temperature": 0.3, "top_p": 0.5,
               "max_output_tokens": 99, "parallel_tool_calls": False, "store": False,
               "previous_response_id": "resp_prev", "metadata": {"k": "v"}, "user": "u",
               "truncation": "auto", "reasoning": {"effort": "high"},
               "text": {"format": {"type": "json_object"}, "verbosity": "high"}}
    response = FE.answer(chat_answer({"content": "{}"}), model="public-model", request_id=RID,
                         request=request)
    parsed = Response.model_validate(response)
    echoed = {key: response[key] for key in (
        "instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
        "parallel_tool_calls", "store", "previous_response_id", "metadata", "user",
        "truncation")}
    assert echoed == {key: request[key] for key in echoed}
    assert response["text"] == request["text"]
    assert response["reasoning"] == {"effort": "high", "summary": None}
    assert parsed.tools[0].name == "get_weather"


def test_answer_defaults_without_the_request() -> None:
    response = FE.answer(chat_answer({"content": "hi"}, usage=None), model="m", request_id=RID)
    Response.model_validate(response)
    assert response["usage"] is None  # the backend sent none: the gateway's count is elsewhere
    assert (response["tools"], response["tool_choice"], response["parallel_tool_calls"],
            response["store"], response["truncation"], response["text"]) == (
        [], "auto", True, True, "disabled", {"format": {"type": "text"}})


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 9, "completion_tokens": 64, "total_tokens": 73},
    {"prompt_tokens": 9, "completion_tokens": 64, "total_tokens": 0},  # total from the parts
    {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    {"prompt_tokens": 2**40, "completion_tokens": 1, "total_tokens": 2**40 + 1},
    {"prompt_tokens": -1, "completion_tokens": 64, "total_tokens": 63},
    {"prompt_tokens": True, "completion_tokens": 64, "total_tokens": 65},
    {"prompt_tokens": 9.0, "completion_tokens": 64, "total_tokens": 73},
    {"prompt_tokens": "9", "completion_tokens": 64, "total_tokens": 73},
    {"prompt_tokens": 9, "completion_tokens": None, "total_tokens": 73},
    {"prompt_tokens": 9, "completion_tokens": 64},
    {"prompt_tokens": 9, "completion_tokens": 64, "total_tokens": 73,
     "prompt_tokens_details": None},
    USAGE,
])
def test_answer_usage_is_the_accounting_reading(usage: dict[str, Any]) -> None:
    """The usage of a whole answer is ``gateway.accounting.usage``'s reading of the chat
    usage whatever its shape, the totals alone (written without it) included."""
    response = FE.answer(chat_answer({"content": "hi"}, usage=usage), model="m",
                         request_id=RID)
    assert response["usage"] == responses_usage(usage_from_mapping(usage, "openai"))


def test_answers_do_not_share_their_defaults() -> None:
    """Each response has its own nested defaults: changing one answer's leaves the next's."""
    first = FE.answer(chat_answer({"content": "hi"}), model="m", request_id=RID)
    first["tools"].append(WEATHER)
    first["metadata"]["k"] = "v"
    first["reasoning"]["effort"] = "high"
    first["text"]["format"]["type"] = "json_object"
    second = FE.answer(chat_answer({"content": "hi"}), model="m", request_id=RID)
    assert (second["tools"], second["metadata"], second["reasoning"], second["text"]) == (
        [], {}, {"effort": None, "summary": None}, {"format": {"type": "text"}})


@pytest.mark.parametrize(("setting", "echo"), [
    ({"instructions": "Be brief."}, {"instructions": "Be brief."}),
    ({"parallel_tool_calls": False}, {"parallel_tool_calls": False}),
    ({"previous_response_id": "resp_prev"}, {"previous_response_id": "resp_prev"}),
    ({"reasoning": {"effort": "low"}}, {"reasoning": {"effort": "low", "summary": None}}),
    ({"temperature": 0.3}, {"temperature": 0.3}),
    ({"text": {"format": {"type": "json_object"}}}, {"text": {"format": {"type": "json_object"}}}),
    ({"tool_choice": "none"}, {"tool_choice": "none"}),
    ({"tools": [WEATHER]}, {"tools": [WEATHER]}),
    ({"top_p": 0.5}, {"top_p": 0.5}),
    ({"truncation": "auto"}, {"truncation": "auto"}),
    ({"user": "u"}, {"user": "u"}),
    ({"metadata": {"k": "v"}}, {"metadata": {"k": "v"}}),
    ({"max_output_tokens": 7, "store": False}, {"max_output_tokens": 7, "store": False}),
], ids=lambda value: ",".join(value) if isinstance(value, dict) else None)
def test_answer_echoes_each_setting_alone(setting: dict[str, Any], echo: dict[str, Any]
                                          ) -> None:
    """A request with one setting gets it echoed and the defaults for the rest, in OpenAI's
    key order."""
    request = {"model": "m", "input": "x", **setting}
    response = FE.answer(chat_answer({"content": "hi"}), model="m", request_id=RID,
                         request=request)
    Response.model_validate(response)
    default = FE.answer(chat_answer({"content": "hi"}), model="m", request_id=RID)
    assert list(response) == list(default)
    assert {key: response[key] for key in echo} == echo
    assert {k: v for k, v in response.items() if k not in echo} == {
        k: v for k, v in default.items() if k not in echo}


def test_usage_of_a_native_answer() -> None:
    """A Responses answer passed through: the cache read and write are parts of input_tokens,
    reasoning a part of output_tokens (never counted twice)."""
    native = {"object": "response", "usage": {
        "input_tokens": 1000,
        "input_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 300},
        "output_tokens": 200, "output_tokens_details": {"reasoning_tokens": 50},
        "total_tokens": 1200}}
    assert FE.usage(native) == BackendUsage(
        prompt_tokens=1000, completion_tokens=200, total_tokens=1200, cached_tokens=600,
        cache_write_tokens=300, reasoning_tokens=50)
    assert FE.usage({"object": "response"}) is None
    assert FE.usage({"usage": {"input_tokens": -1}}) is None


# -- streams -----------------------------------------------------------------------------------

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1730000000,
        "model": "backend-model"}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, Any] | None = None, newline: bytes = b"\n") -> bytes:
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return b"data: " + msgspec.json.encode({**HEAD, "choices": choices, "usage": usage}) + (
        newline * 2)


def chat_stream(message: dict[str, Any], finish: str, usage: dict[str, Any] | None,
                pieces: int = 3, newline: bytes = b"\n", done: bool = True) -> bytes:
    """The chat SSE a backend sends for ``message`` (text and arguments cut in ``pieces``)."""

    def cut(value: str) -> list[str]:
        step = max(1, -(-len(value) // pieces))
        return [value[i:i + step] for i in range(0, len(value), step)]

    events = [chunk({"role": "assistant", "content": ""}, newline=newline)]
    for piece in cut(message.get("reasoning_content") or ""):
        events.append(chunk({"reasoning_content": piece}, newline=newline))
    for piece in cut(message.get("content") or ""):
        events.append(chunk({"content": piece}, newline=newline))
    for piece in cut(message.get("refusal") or ""):
        events.append(chunk({"refusal": piece}, newline=newline))
    for i, tool_call in enumerate(message.get("tool_calls") or ()):
        function = tool_call["function"]
        events.append(chunk({"tool_calls": [{"index": i, "id": tool_call["id"],
                                             "type": "function", "function": {
                                                 "name": function["name"], "arguments": ""}}]},
                            newline=newline))
        for piece in cut(function["arguments"]):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]},
                                newline=newline))
    events.append(chunk({}, finish, newline=newline))
    if usage is not None:
        events.append(chunk(None, usage=usage, newline=newline))
    if done:
        events.append(b"data: [DONE]" + newline * 2)
    return b"".join(events)


def events_of(raw: bytes) -> list[dict[str, Any]]:
    """Parse the translated SSE, checking its framing: ``event:`` names the data's type."""
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw[:-2].split(b"\n\n"):
        name, data = block.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: ")
        event = msgspec.json.decode(data[6:])
        assert event["type"] == name[7:].decode()
        events.append(event)
    return events


def translate_stream(chunks: list[bytes], request: dict[str, Any] | None = None) -> bytes:
    stream = FE.stream(model="public-model", request_id=RID, prompt_tokens=120, request=request)
    return b"".join(stream.feed(c) for c in chunks) + stream.finish()


def fold(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Rebuild the response from the events as a client does, checking each event against the
    state so far; returns the terminal event's response, whose output must equal the fold."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        EVENT.validate_python(event)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    output: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    for event in events[2:-1]:
        kind, index = event["type"], event.get("output_index")
        assert index not in done, f"{kind} after its item was done"
        if kind == "response.output_item.added":
            assert index == len(output) and event["item"]["status"] == "in_progress"
            output[index] = copy.deepcopy(event["item"])
            continue
        item = output[index]
        if kind != "response.output_item.done":
            assert event["item_id"] == item["id"]
        if kind == "response.content_part.added":
            assert event["content_index"] == len(item["content"])
            item["content"].append(copy.deepcopy(event["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            item["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.refusal.delta":
            item["content"][event["content_index"]]["refusal"] += event["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert item["content"][event["content_index"]]["text"] == event["text"]
        elif kind == "response.refusal.done":
            assert item["content"][event["content_index"]]["refusal"] == event["refusal"]
        elif kind == "response.content_part.done":
            assert item["content"][event["content_index"]] == event["part"]
        elif kind == "response.function_call_arguments.delta":
            item["arguments"] += event["delta"]
        elif kind == "response.function_call_arguments.done":
            assert item["arguments"] == event["arguments"]
        elif kind == "response.custom_tool_call_input.delta":
            item["input"] += event["delta"]
        elif kind == "response.custom_tool_call_input.done":
            assert item["input"] == event["input"]
        elif kind == "response.output_item.done":
            assert {**item, "status": event["item"]["status"]} == event["item"]
            output[index] = event["item"]
            done.add(index)
        else:
            raise AssertionError(f"unexpected event {kind}")
    assert done == set(output)
    last = events[-1]
    assert last["type"] in ("response.completed", "response.incomplete")
    response: dict[str, Any] = last["response"]
    assert response["output"] == [output[i] for i in range(len(output))]
    assert last["type"] == ("response.completed" if response["status"] == "completed"
                            else "response.incomplete")
    return response


def sdk_fold(events: list[dict[str, Any]], request: dict[str, Any] | None) -> Any:
    """The SDK's own stream helper state (``client.responses.stream``) over the events."""
    state: ResponseStreamState[Any] = ResponseStreamState(
        input_tools=(request or {}).get("tools") or [], text_format=omit)
    for event in events:
        state.handle_event(EVENT.validate_python(event))
    return state


STREAMED = [
    pytest.param({"content": "Hello there, friend!"}, "stop", id="text"),
    pytest.param({"content": "Let me check.", "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_b", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
                 "tool_calls", id="text-and-two-calls"),
    pytest.param({"content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 "tool_calls", id="call-only"),
    pytest.param({"content": "Once upon a"}, "length", id="length"),
    pytest.param({"content": "42", "reasoning_content": "six times seven"}, "stop",
                 id="reasoning"),
    pytest.param({"content": None, "refusal": "I can't help with that."}, "stop",
                 id="refusal"),
    pytest.param({"content": None}, "stop", id="empty"),
]


@pytest.mark.parametrize(("message", "finish"), STREAMED)
@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_stream_reassembles_to_the_answer(message: dict[str, Any], finish: str,
                                          newline: bytes) -> None:
    request = {"model": "public-model", "input": "x", "tools": [WEATHER],
               "instructions": "Be brief."}
    chat = chat_answer(message, finish)
    raw = chat_stream(message, finish, USAGE, newline=newline)
    events = events_of(translate_stream([raw], request))
    response = fold(events)
    assert response == FE.answer(chat, model="public-model", request_id=RID, request=request)
    Response.model_validate(response)
    state = sdk_fold(events, request)
    if finish != "length":  # the SDK helper wants response.completed (OpenAI's API sends
        # response.incomplete for a cut answer, as we do)
        final = state._completed_response
        assert final is not None
        assert final.output_text == response["output_text"]
        assert [item.id for item in final.output] == [item["id"] for item in response["output"]]


CUSTOM_STREAMED = [
    pytest.param({"content": None, "tool_calls": [
        {"id": "call_p", "type": "function", "function": {
            "name": "apply_patch", "arguments": msgspec.json.encode({"input": PATCH}).decode()}}]},
                 "tool_calls", id="custom-call"),
    pytest.param({"content": "Patching.", "tool_calls": [
        {"id": "call_w", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_p", "type": "function", "function": {
            "name": "apply_patch", "arguments": '{"input":"*** Begin Patch\\n"}'}},
        {"id": "call_q", "type": "function", "function": {
            "name": "apply_patch", "arguments": "bare text"}}]},
                 "tool_calls", id="text-function-and-custom-calls"),
    pytest.param({"content": None, "tool_calls": [
        {"id": "call_p", "type": "function", "function": {
            "name": "apply_patch", "arguments": '{"input":""}'}}]},
                 "tool_calls", id="empty-input"),
    pytest.param({"content": None, "tool_calls": [
        {"id": "call_p", "type": "function", "function": {
            "name": "apply_patch", "arguments": '{"input":"*** Begin Pa'}}]},
                 "length", id="cut-at-the-limit"),
]


@pytest.mark.parametrize(("message", "finish"), CUSTOM_STREAMED)
@pytest.mark.parametrize("pieces", [1, 3, 40])
def test_stream_custom_tool_call_reassembles_to_the_answer(
        message: dict[str, Any], finish: str, pieces: int) -> None:
    """A custom tool's call streamed: its arguments in any pieces (an escape cut anywhere),
    folded by our fold and the SDK's stream state into the whole answer's items."""
    chat = chat_answer(message, finish)
    events = events_of(translate_stream([chat_stream(message, finish, USAGE, pieces)],
                                        CUSTOM_REQUEST))
    response = fold(events)
    assert response == FE.answer(chat, model="public-model", request_id=RID,
                                 request=CUSTOM_REQUEST)
    Response.model_validate(response)
    calls = [item for item in response["output"] if item["type"].endswith("call")]
    assert [item["type"] for item in calls] == [
        "function_call" if c["function"]["name"] == "get_weather" else "custom_tool_call"
        for c in message["tool_calls"]]
    state = sdk_fold(events, CUSTOM_REQUEST)
    if finish != "length":
        final = state._completed_response
        assert final is not None
        assert [(item.type, getattr(item, "input", None)) for item in final.output] == [
            (item["type"], item.get("input")) for item in response["output"]]


def test_stream_custom_tool_call_event_order() -> None:
    """OpenAI's order for a custom call: output_item.added (input empty), the input's delta
    (the whole decoded input, once the chat arguments are whole) and done, output_item.done."""
    arguments = msgspec.json.encode({"input": PATCH}).decode()
    message = {"content": None, "tool_calls": [
        {"id": "call_p", "type": "function",
         "function": {"name": "apply_patch", "arguments": arguments}}]}
    events = events_of(translate_stream([chat_stream(message, "tool_calls", USAGE, pieces=7)],
                                        CUSTOM_REQUEST))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added, delta, done, item_done = events[2:6]
    item_id = f"ctc_{RID}_0"
    assert added["item"] == {"id": item_id, "type": "custom_tool_call", "status": "in_progress",
                             "call_id": "call_p", "input": "", "name": "apply_patch"}
    assert (delta["item_id"], delta["output_index"], delta["delta"]) == (item_id, 0, PATCH)
    assert (done["item_id"], done["output_index"], done["input"]) == (item_id, 0, PATCH)
    assert item_done["item"] == patch_call(0, "call_p", PATCH)
    assert events[-1]["response"]["output"] == [patch_call(0, "call_p", PATCH)]


def test_stream_custom_call_resumed_goes_to_the_final_object() -> None:
    """A backend that went back to a custom call already closed: its input is decoded again
    from the whole arguments, in the final object only (its events are out)."""
    stream = FE.stream(model="m", request_id=RID, prompt_tokens=1, request=CUSTOM_REQUEST)
    raw = b"".join([
        chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_p", "function": {
            "name": "apply_patch", "arguments": '{"input":"ab'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_w", "function": {
            "name": "get_weather", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'c"}'}}]}),
        chunk({}, "tool_calls"), b"data: [DONE]\n\n"])
    events = events_of(stream.feed(raw) + stream.finish())
    assert [(e["type"], e.get("delta", e.get("input"))) for e in events
            if e["type"].startswith("response.custom")] == [
        ("response.custom_tool_call_input.delta", '{"input":"ab'),
        ("response.custom_tool_call_input.done", '{"input":"ab')]
    final = events[-1]["response"]
    assert final["output"][0] == patch_call(0, "call_p", "abc")
    assert stream.final is not None and stream.final["output"] == final["output"]
    Response.model_validate(final)


def test_stream_event_order() -> None:
    message = {"content": "Hi", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}
    events = events_of(translate_stream([chat_stream(message, "tool_calls", USAGE,
                                                     pieces=2)]))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert events[-1]["response"]["usage"] == RESPONSES_USAGE


def test_each_feed_writes_what_it_can() -> None:
    """No event is held back: a whole chat event in gives its events out at once; half an
    event gives nothing until its end arrives."""
    stream = FE.stream(model="m", request_id=RID, prompt_tokens=1)
    first = chunk({"role": "assistant", "content": "Hel"})
    out = events_of(stream.feed(first))
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta"]
    second = chunk({"content": "lo"})
    assert stream.feed(second[:10]) == b""
    assert [e["delta"] for e in events_of(stream.feed(second[10:]))] == ["lo"]
    assert [e["type"] for e in events_of(stream.feed(chunk({}, "stop")))] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done"]
    completed = events_of(stream.feed(b"data: [DONE]\n\n"))
    assert [e["type"] for e in completed] == ["response.completed"]
    assert stream.finish() == b""


def test_stream_without_usage_or_done() -> None:
    """A backend that sends no usage chunk and no [DONE]: finish() completes the response,
    with usage null (the gateway counts the tokens itself)."""
    raw = chat_stream({"content": "Hi"}, "stop", None, done=False)
    events = events_of(translate_stream([raw[:-1]]))  # the last blank line missing too
    response = fold(events)
    assert response["usage"] is None and response["output_text"] == "Hi"


def test_fail_ends_with_one_error_event() -> None:
    stream = FE.stream(model="m", request_id=RID, prompt_tokens=1)
    started = events_of(stream.feed(chunk({"role": "assistant", "content": "Hel"})))
    error = events_of(stream.fail(UpstreamTimeout("the backend stopped sending")))
    assert error == [{"type": "error", "code": "upstream_timeout",
                      "message": "the backend stopped sending", "param": None,
                      "sequence_number": len(started)}]
    EVENT.validate_python(error[0])
    assert stream.feed(chunk({"content": "lo"})) == b""
    assert stream.finish() == b""
    assert stream.fail(UpstreamTimeout("again")) == b""


def test_backend_error_chunk_fails_the_stream() -> None:
    stream = FE.stream(model="m", request_id=RID, prompt_tokens=1)
    events_of(stream.feed(chunk({"role": "assistant", "content": "Hel"})))
    raw = stream.feed(b'data: {"error": {"message": "CUDA out of memory at 0x7f"}}\n\n')
    (error,) = events_of(raw)
    assert error["type"] == "error" and error["code"] == BackendFailure.code
    assert "CUDA" not in error["message"]  # the backend's internals stay inside
    assert stream.finish() == b""


def test_keepalives_and_junk_are_skipped() -> None:
    stream = FE.stream(model="m", request_id=RID, prompt_tokens=1)
    raw = (b": keep-alive\n\n" + chunk({"role": "assistant", "content": "Hi"})
           + b"data: {not json\n\n" + chunk({}, "stop") + b"data: [DONE]\n\n")
    assert fold(events_of(stream.feed(raw) + stream.finish()))["output_text"] == "Hi"
    assert stream.malformed == 1


# -- stored responses --------------------------------------------------------------------------


def test_earlier_messages_drop_instructions_keep_input_system() -> None:
    request = {"model": "m", "instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use metric units."},
        {"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    chat = FE.to_chat(request).chat["messages"]
    answer = FE.answer(chat_answer({"content": "Checking.", "reasoning_content": "hmm",
                                    "tool_calls": [{"id": "call_a", "type": "function",
                                                    "function": {"name": "get_weather",
                                                                 "arguments": "{}"}}]},
                                   "tool_calls"), model="m", request_id=RID, request=request)
    assert earlier_messages(chat, answer) == [
        {"role": "system", "content": "Use metric units."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]}]


def test_a_custom_call_is_continued_with_its_output() -> None:
    """A stored answer's ``custom_tool_call`` is the chat tool call it was made from; a request
    continuing it (``previous_response_id``) with a ``custom_tool_call_output`` answers it."""
    request = {**CUSTOM_REQUEST, "instructions": "Be brief."}
    own = FE.to_chat(request).chat["messages"][1:]
    arguments = msgspec.json.encode({"input": PATCH}).decode()
    answer = FE.answer(chat_answer({"content": None, "tool_calls": [
        {"id": "call_p", "type": "function",
         "function": {"name": "apply_patch", "arguments": arguments}}]}, "tool_calls"),
        model="m", request_id=RID, request=request)
    assert [item["type"] for item in answer["output"]] == ["custom_tool_call"]
    stored = turn_messages(own, answer)
    assert stored == [
        {"role": "user", "content": "Add a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_p", "type": "function",
             "function": {"name": "apply_patch", "arguments": arguments}}]}]
    assert earlier_messages(FE.to_chat(request).chat["messages"], answer) == stored
    follow = {"model": "m", "previous_response_id": answer["id"], "tools": [APPLY_PATCH],
              "input": [{"type": "custom_tool_call_output", "call_id": "call_p",
                         "output": "Done!"}]}
    translated = FE.to_chat(follow, stored)
    assert translated.refusal is None and translated.ignored == ()
    assert translated.chat["messages"] == [
        *stored, {"role": "tool", "tool_call_id": "call_p", "content": "Done!"}]
    assert translated.chat["tools"] == [CHAT_APPLY_PATCH]
    # the follow-up's input items, with ids of their kind
    page = input_items(follow, response_id=f"resp_{RID}")
    ResponseItemList.model_validate(page)
    assert [item["id"] for item in page["data"]] == [f"ctco_{RID}_in0"]


def test_three_turns_with_previous_response_id() -> None:
    """Each turn re-sends the whole conversation before the new input, without the earlier
    turns' instructions; the stored messages are not changed by later turns."""
    stored: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    replies = ["Hello Ada.", "You are Ada.", "Ada, again."]
    inputs = ["My name is Ada.", "What is my name?", "And now?"]
    for turn, (said, reply) in enumerate(zip(inputs, replies, strict=True)):
        earlier = earlier_messages(*stored[-1]) if stored else None
        request = {"model": "m", "instructions": f"turn {turn}", "input": said}
        if stored:
            request["previous_response_id"] = stored[-1][1]["id"]
        chat = FE.to_chat(request, earlier).chat["messages"]
        answer = FE.answer(chat_answer({"content": reply}), model="m",
                           request_id=f"{turn:032x}", request=request)
        stored.append((copy.deepcopy(chat), answer))
    assert stored[-1][0] == [
        {"role": "system", "content": "turn 2"},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
        {"role": "assistant", "content": "You are Ada."},
        {"role": "user", "content": "And now?"}]
    assert stored[0][0] == [{"role": "system", "content": "turn 0"},
                            {"role": "user", "content": "My name is Ada."}]


def test_input_items() -> None:
    payload = {"model": "m", "instructions": "not an item", "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "id": "msg_prev", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "18C"}]}
    page = input_items(payload, response_id=f"resp_{RID}", order="asc")
    ResponseItemList.model_validate(page)
    assert [item["id"] for item in page["data"]] == [
        f"msg_{RID}_in0", "msg_prev", f"fc_{RID}_in2", f"fco_{RID}_in3"]
    assert page["data"][0] == {"role": "user", "id": f"msg_{RID}_in0", "type": "message",
                               "content": [{"type": "input_text", "text": "Weather?"}],
                               "status": "completed"}
    assert (page["first_id"], page["last_id"], page["has_more"]) == (
        f"msg_{RID}_in0", f"fco_{RID}_in3", False)
    assert input_items(payload, response_id=f"resp_{RID}") == {
        **page, "data": page["data"][::-1], "first_id": page["last_id"],
        "last_id": page["first_id"]}  # newest first by default
    first = input_items(payload, response_id=f"resp_{RID}", order="asc", limit=2)
    assert [i["id"] for i in first["data"]] == [f"msg_{RID}_in0", "msg_prev"]
    assert first["has_more"] is True
    rest = input_items(payload, response_id=f"resp_{RID}", order="asc", after=first["last_id"])
    assert [i["id"] for i in rest["data"]] == [f"fc_{RID}_in2", f"fco_{RID}_in3"]
    assert rest["has_more"] is False
    before = input_items(payload, response_id=f"resp_{RID}", order="asc", before="msg_prev")
    assert [i["id"] for i in before["data"]] == [f"msg_{RID}_in0"]
    string = input_items({"model": "m", "input": "Hi"}, response_id=f"resp_{RID}")
    assert string["data"] == [{"type": "message", "role": "user", "id": f"msg_{RID}_in0",
                               "content": [{"type": "input_text", "text": "Hi"}],
                               "status": "completed"}]


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"order": "up"}, "order"), ({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
    ({"after": "msg_unknown"}, "after"), ({"before": "msg_unknown"}, "before")])
def test_input_items_refusals(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        input_items({"model": "m", "input": "Hi"}, response_id=f"resp_{RID}", **kwargs)
    assert caught.value.param == param


# -- properties --------------------------------------------------------------------------------

words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
names = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
ids = st.from_regex(r"call_[a-zA-Z0-9]{1,8}", fullmatch=True)
arguments = st.dictionaries(names, st.integers() | words, max_size=3).map(
    lambda d: msgspec.json.encode(d).decode())
tool_calls = st.lists(
    st.builds(lambda i, n, a: {"id": i, "type": "function",
                               "function": {"name": n, "arguments": a}}, ids, names, arguments),
    min_size=1, max_size=3)
image = st.builds(lambda url, detail: {"type": "image_url",
                                       "image_url": {"url": url, "detail": detail}},
                  st.sampled_from(["https://example.com/a.png", "data:image/png;base64,AAAA"]),
                  st.sampled_from(["low", "high", "auto"]))
user_parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, words) | image,
                      max_size=3).map(lambda parts: [*parts, {
                          "type": "image_url", "image_url": {"url": "https://e.com/b.png",
                                                             "detail": "auto"}}])
chat_message = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, words | user_parts),
    st.builds(lambda c: {"role": "system", "content": c}, words),
    st.builds(lambda c: {"role": "assistant", "content": c}, words),
    st.builds(lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls},
              st.none() | words, tool_calls),
    st.builds(lambda i, c: {"role": "tool", "tool_call_id": i, "content": c}, ids, words),
)


def conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as a client writes them: an assistant turn's calls ride on its text, so a
    text-less assistant message with calls does not directly follow another assistant."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if (out and out[-1]["role"] == "assistant" and message["role"] == "assistant"
                and message.get("content") is None):
            message = {**message, "content": ""}
        out.append(message)
    return out


chat_tool = st.builds(
    lambda n, d: {"type": "function", "function": {
        "name": n, "description": d, "parameters": {"type": "object", "properties": {}}}},
    names, words)
chat_requests = st.fixed_dictionaries(
    {"model": st.just("m"),
     "messages": st.lists(chat_message, min_size=1, max_size=8).map(conversation)},
    optional={"max_tokens": st.integers(1, 4096), "temperature": st.floats(0, 2),
              "top_p": st.floats(0, 1), "user": names, "stream": st.booleans()},
)


@settings(max_examples=150, deadline=None)
@given(chat=chat_requests, tools=st.lists(chat_tool, max_size=2, unique_by=lambda t: t[
    "function"]["name"]))
def test_chat_to_responses_to_chat_keeps_messages(chat: dict[str, Any],
                                                  tools: list[dict[str, Any]]) -> None:
    if tools:
        chat = {**chat, "tools": tools, "tool_choice": {
            "type": "function", "function": {"name": tools[-1]["function"]["name"]}}}
    payload = to_responses(chat)
    back = FE.to_chat(payload).chat
    expected = dict(chat)
    if not chat.get("stream"):
        expected.pop("stream", None)
    else:
        expected["stream_options"] = {"include_usage": True}
    assert back == expected


def chat_answers() -> st.SearchStrategy[tuple[dict[str, Any], str]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
        calls = draw(st.none() | tool_calls)
        content = draw((st.none() | words.filter(bool)) if calls else words)
        message: dict[str, Any] = {"content": content}
        if calls:
            message["tool_calls"] = calls
        reasoning = draw(st.none() | words.filter(bool))
        if reasoning:
            message["reasoning_content"] = reasoning
        finish = draw(st.sampled_from(["tool_calls"] if calls else ["stop", "length"]))
        prompt, completion = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**5))
        read = draw(st.integers(0, prompt))
        write = draw(st.integers(0, prompt - read))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": write},
                 "completion_tokens_details": {
                     "reasoning_tokens": draw(st.integers(0, completion))}}
        return chat_answer(message, finish, usage), finish
    return build()


@settings(max_examples=150, deadline=None)
@given(case=chat_answers())
def test_chat_answer_to_response_to_chat_keeps_calls_and_usage(
        case: tuple[dict[str, Any], str]) -> None:
    chat, finish = case
    response = FE.answer(chat, model="m", request_id=RID)
    Response.model_validate(response)
    back = chat_answer_from_response(response)
    assert back["choices"][0]["message"] == chat["choices"][0]["message"]
    assert back["choices"][0]["finish_reason"] == finish
    expected = usage_from_mapping(chat["usage"], "openai")
    assert usage_from_mapping(back["usage"], "openai") == expected
    assert FE.usage(response) == expected


@settings(max_examples=100, deadline=None)
@given(case=chat_answers(), pieces=st.integers(1, 5), cuts=st.lists(st.integers(0, 10**5),
                                                                     max_size=12),
       newline=st.sampled_from([b"\n", b"\r\n"]))
def test_stream_split_anywhere_reassembles_to_the_answer(
        case: tuple[dict[str, Any], str], pieces: int, cuts: list[int], newline: bytes) -> None:
    chat, finish = case
    raw = chat_stream(chat["choices"][0]["message"], finish, chat["usage"], pieces, newline)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    response = fold(events_of(translate_stream(chunks)))
    assert response == FE.answer(chat, model="public-model", request_id=RID)


def test_a_long_stream_numbers_every_event_past_the_precomputed_tails() -> None:
    """Delta events end with a sequence number taken from a table for the first 4,096: a
    stream of 5,000 text deltas still numbers its events 0, 1, 2, ... to the end and folds
    into the whole text."""
    text_value = "ab" * 5_000
    raw = translate_stream([chat_stream({"role": "assistant", "content": text_value}, "stop",
                                        {"prompt_tokens": 3, "completion_tokens": 5_000},
                                        pieces=5_000)])
    events = events_of(raw)
    assert len(events) > 5_000
    response = fold(events)
    assert response["output"][0]["content"][0]["text"] == text_value
