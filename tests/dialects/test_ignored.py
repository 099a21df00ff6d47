"""One rule for the fields a front-end's translation does not need (``gateway.dialects.ignored``).

Passed through to a backend that speaks the API, a request goes as sent; translated to chat
completions, a field with no equivalent is dropped and named in ``x-gateway-ignored``, never a
400, unless dropping it would change what is billed, what is safe or what the model is asked
(then a 400 naming it, raised only when the request is translated).

Every top-level field of the official SDKs' request types (``anthropic`` Messages, stable and
beta; ``openai`` Responses) has a row here saying what becomes of it, and a test fails when an
SDK gains a field without one. Request shapes of today's coding agents (Claude Code 2.1,
Codex CLI) are fixtures: ``fixtures/claude_code_request.json``, ``fixtures/codex_request.json``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import msgspec
import pytest
from anthropic.types import message_create_params as messages_params
from anthropic.types.beta import message_create_params as beta_params
from openai.types.responses import response_create_params as responses_params

from gateway.config import Backend, Pool
from gateway.dialects.ignored import HEADER, MAX_NAMES, NAME_CHARS, Ignored, ignored_headers
from gateway.dialects.plan import plan_upstream, refuse_untranslatable
from gateway.dialects.registry import FRONTENDS, translate_native
from gateway.errors import InvalidRequest
from gateway.routing.pool import PoolState

FIXTURES = Path(__file__).with_name("fixtures")
MESSAGES = FRONTENDS["messages"]
RESPONSES = FRONTENDS["responses"]
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


def message(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}],
            **fields}


def response(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", **fields}


# --- the collector ----------------------------------------------------------------------------


def test_names_are_kept_once_in_order() -> None:
    left = Ignored()
    for name in ("b", "a", "b", "cache_control", "a"):
        left.drop(name)
    assert left.dropped() == ("b", "a", "cache_control")
    assert ignored_headers(left.dropped()) == [(HEADER, b"b,a,cache_control")]
    assert ignored_headers(()) == []


def test_names_are_bounded_and_header_safe() -> None:
    """A client's keys can be anything: at most MAX_NAMES names of NAME_CHARS characters,
    nothing that could break the header line or the list."""
    left = Ignored()
    left.drop("x" * 10_000)
    left.drop("evil\r\nset-cookie: a=b,c")
    left.drop("caf\u00e9")
    for i in range(MAX_NAMES * 3):
        left.drop(f"f{i}")
    names = left.dropped()
    assert len(names) == MAX_NAMES + 1 and names[-1] == "..."
    assert names[0] == "x" * NAME_CHARS
    assert names[1] == "evil??set-cookie:?a=b?c" and names[2] == "caf?"
    ((_, value),) = ignored_headers(names)
    assert value.isascii() and b"\r" not in value and b"\n" not in value


def test_the_first_refusal_is_kept() -> None:
    left = Ignored()
    first, second = InvalidRequest("a", param="a"), InvalidRequest("b", param="b")
    left.refuse(first)
    left.refuse(second)
    assert left.refusal is first
    assert "refused: a" in repr(left)


# --- every field of the Messages API ----------------------------------------------------------

#: field -> (a value, what becomes of it when translated: "chat" (translated: the chat payload
#: holds ``expect``), "dropped" (named), "refused" (a 400 naming it, when translated) or
#: "header" (the SDK sends it as a header, not in the body))
MESSAGES_FIELDS: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "model": ("claude-x", "chat", {"model": "claude-x"}),
    "max_tokens": (32, "chat", {"max_tokens": 32}),
    "messages": ([{"role": "user", "content": "Yo"}], "chat",
                 {"messages": [{"role": "user", "content": "Yo"}]}),
    "system": ("Be brief.", "chat", {"messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}]}),
    "stream": (True, "chat", {"stream": True, "stream_options": {"include_usage": True}}),
    "stop_sequences": (["END"], "chat", {"stop": ["END"]}),
    "metadata": ({"user_id": "u-1"}, "chat", {"user": "u-1"}),
    "tools": ([TOOL], "chat", {"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]}),
    "tool_choice": ({"type": "none"}, "chat", {}),  # without tools: nothing to choose
    "thinking": ({"type": "enabled", "budget_tokens": 2048}, "chat",
                 {"reasoning_effort": "low"}),
    "output_config": ({"effort": "medium"}, "chat", {"reasoning_effort": "medium"}),
    "temperature": (0.5, "chat", {"temperature": 0.5}),  # older SDKs
    "top_p": (0.9, "chat", {"top_p": 0.9}),  # older SDKs
    "top_k": (40, "dropped", {}),  # older SDKs
    "cache_control": ({"type": "ephemeral"}, "dropped", {}),
    "container": ("container_1", "dropped", {}),
    "diagnostics": ({"previous_message_id": "msg_1"}, "dropped", {}),
    "inference_geo": ("us", "dropped", {}),
    "service_tier": ("auto", "dropped", {}),
    "speed": ("fast", "dropped", {}),
    "context_management": ({"edits": [{"type": "clear_tool_uses_20250919"}]}, "dropped", {}),
    "fallbacks": (["default"], "dropped", {}),
    "mcp_servers": ([{"type": "url", "url": "https://mcp.example", "name": "m"}], "dropped",
                    {}),
    "thread": ({"type": "create"}, "dropped", {}),
    "billing_policy": ({"type": "billing_policy", "bill_to": "user_profile"}, "refused", {}),
    "fallback_credit_token": ("fct_1", "refused", {}),
    "compaction": ({"type": "compaction"}, "refused", {}),
    "betas": (None, "header", {}),
    "user_profile_id": (None, "header", {}),
    "workspace_id": (None, "header", {}),
}


def _sdk_fields(*types: Any) -> set[str]:
    fields: set[str] = set()
    for kind in types:
        for cls in kind.__mro__:
            fields |= set(getattr(cls, "__annotations__", {}))
    return fields


def test_every_messages_field_of_the_sdk_has_a_row() -> None:
    """The installed ``anthropic`` SDK's request fields (stable and beta), each decided."""
    sdk = _sdk_fields(messages_params.MessageCreateParamsNonStreaming,
                      messages_params.MessageCreateParamsStreaming,
                      beta_params.MessageCreateParamsNonStreaming,
                      beta_params.MessageCreateParamsStreaming)
    assert sdk - MESSAGES_FIELDS.keys() == set()


@pytest.mark.parametrize("field", sorted(MESSAGES_FIELDS))
def test_messages_field(field: str) -> None:
    value, fate, expect = MESSAGES_FIELDS[field]
    if fate == "header":
        return  # not a body field (the SDK sends anthropic-beta, anthropic-*-id headers)
    payload = message(**{field: value})
    before = copy.deepcopy(payload)
    translated = MESSAGES.to_chat(payload)
    assert payload == before  # the client's request is untouched (a pass-through sends it)
    if fate == "chat":
        assert translated.chat.items() >= expect.items()
        assert field not in translated.ignored and translated.refusal is None
    elif fate == "dropped":
        assert translated.ignored == (field,) and translated.refusal is None
        assert field not in translated.chat
    else:
        assert translated.refusal is not None and translated.refusal.param == field
        assert translated.ignored == ()


def test_an_unknown_messages_field_is_dropped_and_named() -> None:
    translated = MESSAGES.to_chat(message(frequency_penalty=0.5, client_hint={"x": 1}))
    assert translated.ignored == ("frequency_penalty", "client_hint")
    assert "frequency_penalty" not in translated.chat


def test_fields_that_set_nothing_are_not_named() -> None:
    translated = MESSAGES.to_chat(message(container=None, mcp_servers=[],
                                            context_management={}))
    assert translated.ignored == ()
    assert MESSAGES.to_chat(message(billing_policy={"type": "billing_policy",
                                                      "bill_to": "self"})).refusal is None


# --- Messages: what the agents send -----------------------------------------------------------


def test_system_role_messages_are_folded_into_the_system_prompt_in_order() -> None:
    translated = MESSAGES.to_chat(message(system="S0", messages=[
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "S1"},
        {"role": "assistant", "content": "Hello"},
        {"role": "system", "content": [{"type": "text", "text": "S2"},
                                       {"type": "text", "text": "S3",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "Go on"},
    ]))
    assert translated.chat["messages"] == [
        {"role": "system", "content": "S0"}, {"role": "system", "content": "S1"},
        {"role": "system", "content": "S2"}, {"role": "system", "content": "S3"},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Go on"}]
    assert translated.ignored == ("cache_control",)


def test_a_system_role_message_still_needs_text() -> None:
    with pytest.raises(InvalidRequest) as caught:
        MESSAGES.to_chat(message(messages=[{"role": "system",
                                              "content": [{"type": "image"}]}]))
    assert caught.value.param == "messages[0].content[0].type"


@pytest.mark.parametrize(("where", "payload"), [
    pytest.param("system", message(system=[{"type": "text", "text": "S",
                                            "cache_control": {"type": "ephemeral"}}]),
                 id="system"),
    pytest.param("tools", message(tools=[{**TOOL, "cache_control": {"type": "ephemeral"}}]),
                 id="tools"),
    pytest.param("messages", message(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]),
                 id="messages"),
    pytest.param("tool_result", message(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "cache_control": {"type": "ephemeral"},
                                      "content": [{"type": "text", "text": "ok"}]}]}]),
                 id="tool-result"),
])
def test_cache_control_anywhere_is_dropped_and_named_once(where: str,
                                                          payload: dict[str, Any]) -> None:
    translated = MESSAGES.to_chat(payload)
    assert translated.ignored == ("cache_control",) and translated.refusal is None
    assert "cache_control" not in json.dumps(translated.chat)


def test_metadata_user_id_is_chat_user_and_other_keys_are_named() -> None:
    translated = MESSAGES.to_chat(message(metadata={"user_id": "u", "session": "s"}))
    assert translated.chat["user"] == "u" and translated.ignored == ("metadata.session",)


@pytest.mark.parametrize("tool", [
    pytest.param({"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                 id="server-web-search"),
    pytest.param({"type": "web_fetch_20250910", "name": "web_fetch"}, id="server-web-fetch"),
    pytest.param({"type": "code_execution_20250825", "name": "code_execution"},
                 id="server-code-execution"),
    pytest.param({"type": "bash_20250124", "name": "bash"}, id="anthropic-defined-bash"),
    pytest.param({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                 id="anthropic-defined-editor"),
    pytest.param({"type": "memory_20250818", "name": "memory"}, id="memory"),
])
def test_server_and_anthropic_defined_tools_are_dropped_and_named(tool: dict[str, Any]) -> None:
    translated = MESSAGES.to_chat(message(tools=[TOOL, tool]))
    assert translated.chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]
    assert translated.ignored == ("tools[1]",)


def test_custom_tool_types_are_chat_functions() -> None:
    translated = MESSAGES.to_chat(message(tools=[
        {**TOOL, "type": "custom", "strict": True, "defer_loading": False,
         "input_examples": [{"city": "Paris"}], "eager_input_streaming": True}]))
    assert translated.chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}, "strict": True}}]
    assert translated.ignored == ()


def test_a_deferred_tool_is_not_offered_to_chat() -> None:
    """A ``defer_loading`` tool is loaded only by Anthropic's tool search, which chat has not:
    offered as a function, a chat model would call it (Claude Code's placeholder)."""
    translated = MESSAGES.to_chat(message(tools=[
        {"name": "DeferredToolPlaceholder", "defer_loading": True,
         "input_schema": {"type": "object"}}, TOOL]))
    assert translated.chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]
    assert translated.ignored == ("tools[0]",)


def test_a_tool_choice_naming_a_dropped_tool_is_dropped_too() -> None:
    translated = MESSAGES.to_chat(message(
        tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "tool", "name": "web_search"}))
    assert "tool_choice" not in translated.chat
    assert translated.ignored == ("tools[1]", "tool_choice")
    only_dropped = MESSAGES.to_chat(message(
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "any"}))
    assert "tools" not in only_dropped.chat and "tool_choice" not in only_dropped.chat
    assert only_dropped.ignored == ("tools[0]", "tool_choice")


@pytest.mark.parametrize(("thinking", "effort", "ignored"), [
    pytest.param({"type": "enabled", "budget_tokens": 1024}, "low", (), id="budget-1024"),
    pytest.param({"type": "enabled", "budget_tokens": 8000}, "medium", (), id="budget-8000"),
    pytest.param({"type": "enabled", "budget_tokens": 32000, "display": "summarized"}, "high",
                 (), id="budget-32000"),
    pytest.param({"type": "adaptive"}, None, (), id="adaptive"),
    pytest.param({"type": "adaptive", "display": "omitted"}, None, (), id="adaptive-omitted"),
    pytest.param({"type": "between_tools"}, None, (), id="between-tools"),
    pytest.param({"type": "disabled"}, None, ("thinking",), id="disabled"),
])
def test_thinking_maps_to_reasoning_effort(thinking: dict[str, Any], effort: str | None,
                                           ignored: tuple[str, ...]) -> None:
    translated = MESSAGES.to_chat(message(thinking=thinking))
    assert translated.chat.get("reasoning_effort") == effort
    assert translated.effort == ("thinking" if effort else None)
    assert translated.ignored == ignored


@pytest.mark.parametrize(("level", "effort"), [
    ("low", "low"), ("medium", "medium"), ("high", "high"), ("xhigh", "high"), ("max", "high")])
def test_output_config_effort_maps_to_reasoning_effort_before_thinking(level: str,
                                                                       effort: str) -> None:
    translated = MESSAGES.to_chat(message(
        output_config={"effort": level},
        thinking={"type": "enabled", "budget_tokens": 50_000}))
    assert translated.chat["reasoning_effort"] == effort
    assert translated.effort == "output_config.effort"


def test_output_config_format_is_chat_json_schema() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    translated = MESSAGES.to_chat(message(output_config={
        "format": {"type": "json_schema", "schema": schema}, "task_budget": {"total": 5}}))
    assert translated.chat["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert translated.ignored == ("output_config.task_budget",)


#: what chat cannot carry: refused when translated (the param named), passed through otherwise
MESSAGES_REFUSED = [
    pytest.param(message(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Read:"},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "x"}}]}]),
                 "messages[0].content[1].type", id="document"),
    pytest.param(message(messages=[{"role": "user", "content": [
        {"type": "search_result", "source": "s", "title": "t", "content": []}]}]),
                 "messages[0].content[0].type", id="search-result"),
    pytest.param(message(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]),
                 "messages[0].content[0].source.type", id="image-file"),
    pytest.param(message(messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "x"}}]}]),
                 "messages[1].content[0].type", id="server-tool-use-block"),
    pytest.param(message(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}}]}]}]),
                 "messages[0].content[0].content[0].type", id="image-in-tool-result"),
    pytest.param(message(thread={"type": "continue", "previous_message_id": "msg_1"}),
                 "thread", id="thread-continue"),
]


@pytest.mark.parametrize(("payload", "param"), MESSAGES_REFUSED)
def test_what_chat_cannot_carry_is_refused_only_when_translated(payload: dict[str, Any],
                                                                param: str) -> None:
    translated = MESSAGES.to_chat(payload)
    assert translated.refusal is not None and translated.refusal.param == param
    with pytest.raises(InvalidRequest) as caught:
        plan(MESSAGES, payload, native=False)
    assert caught.value.param == param
    passed = plan(MESSAGES, payload, native=True)  # a backend that speaks Messages
    assert passed.native and msgspec.json.decode(passed.body) == {**payload, "model": "backend-m"}


def test_claude_code_request_is_accepted() -> None:
    """Claude Code 2.1's request (fixture): a system-role message inside messages, a system
    array and tools with cache_control, adaptive thinking, context_management,
    output_config, metadata.user_id, 12 tools, streamed."""
    body = fixture("claude_code_request.json")
    translated = MESSAGES.to_chat(body)
    assert translated.refusal is None and translated.stream
    assert set(translated.ignored) == {"cache_control", "context_management"}
    chat = translated.chat
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system"] * 4 + ["user"]  # the system-role message folded in
    assert chat["messages"][3]["content"].startswith("<system-reminder>The current date")
    assert len(chat["tools"]) == 12 and chat["reasoning_effort"] == "high"
    assert chat["user"] == body["metadata"]["user_id"] and chat["max_tokens"] == 32000
    assert translated.effort == "output_config.effort"


# --- every field of the Responses API ---------------------------------------------------------

#: field -> (a value, its fate when translated, what the chat payload holds): "chat",
#: "dropped", "refused" as for Messages, "gateway" (honoured by the gateway itself: nothing in
#: chat, nothing named)
RESPONSES_FIELDS: dict[str, tuple[Any, str, dict[str, Any]]] = {
    "model": ("gpt-x", "chat", {"model": "gpt-x"}),
    "input": ("Yo", "chat", {"messages": [{"role": "user", "content": "Yo"}]}),
    "instructions": ("Be brief.", "chat", {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
    "max_output_tokens": (32, "chat", {"max_tokens": 32}),
    "temperature": (0.5, "chat", {"temperature": 0.5}),
    "top_p": (0.9, "chat", {"top_p": 0.9}),
    "user": ("u-1", "chat", {"user": "u-1"}),
    "safety_identifier": ("s-1", "chat", {"user": "s-1"}),
    "stream": (True, "chat", {"stream": True, "stream_options": {"include_usage": True}}),
    "text": ({"format": {"type": "json_object"}}, "chat",
             {"response_format": {"type": "json_object"}}),
    "reasoning": ({"effort": "high"}, "chat", {"reasoning_effort": "high"}),
    "tools": ([FUNCTION], "chat", {"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]}),
    "tool_choice": ("auto", "chat", {"tool_choice": "auto"}),
    "parallel_tool_calls": (False, "chat", {}),  # sent only with tools
    "metadata": ({"k": "v"}, "gateway", {}),
    "store": (False, "gateway", {}),
    "previous_response_id": ("resp_1", "gateway", {}),
    "include": (["reasoning.encrypted_content"], "dropped", {}),
    "prompt_cache_key": ("k-1", "dropped", {}),
    "prompt_cache_retention": ("24h", "dropped", {}),
    "prompt_cache_options": ({"mode": "implicit"}, "dropped", {}),
    "service_tier": ("flex", "dropped", {}),
    "max_tool_calls": (3, "dropped", {}),
    "top_logprobs": (2, "dropped", {}),
    "truncation": ("auto", "dropped", {}),
    "stream_options": ({"include_obfuscation": False}, "dropped", {}),
    "context_management": ([{"type": "compaction", "compact_threshold": 1000}], "dropped", {}),
    "image": ({"detail": "low"}, "dropped", {}),
    "access_programs": ([{"type": "programmatic_tool_calling"}], "dropped", {}),
    "background_options": ({"completion_window": "2h"}, "dropped", {}),
    "background": (True, "refused", {}),
    "conversation": ("conv_1", "refused", {}),
    "prompt": ({"id": "pmpt_1"}, "refused", {}),
    "moderation": ({"model": "omni-moderation-latest"}, "refused", {}),
}


def test_every_responses_field_of_the_sdk_has_a_row() -> None:
    sdk = _sdk_fields(responses_params.ResponseCreateParamsNonStreaming,
                      responses_params.ResponseCreateParamsStreaming)
    assert sdk - RESPONSES_FIELDS.keys() == set()


@pytest.mark.parametrize("field", sorted(RESPONSES_FIELDS))
def test_responses_field(field: str) -> None:
    value, fate, expect = RESPONSES_FIELDS[field]
    payload = response(**{field: value})
    before = copy.deepcopy(payload)
    translated = RESPONSES.to_chat(payload)
    assert payload == before
    if fate in ("chat", "gateway"):
        assert translated.chat.items() >= expect.items()
        assert translated.ignored == () and translated.refusal is None
    elif fate == "dropped":
        assert translated.ignored == (field,) and translated.refusal is None
        assert field not in translated.chat
    else:
        assert translated.refusal is not None and translated.refusal.param == field


def test_an_unknown_responses_field_is_dropped_and_named_not_refused() -> None:
    """Codex sends ``client_metadata``; OpenAI's API answers it 400 ``unknown_parameter``,
    the gateway drops it when translating and names it."""
    translated = RESPONSES.to_chat(response(client_metadata={"k": "v"}, n=2))
    assert translated.ignored == ("client_metadata", "n") and translated.refusal is None


def test_reasoning_summary_and_verbosity_are_named() -> None:
    translated = RESPONSES.to_chat(response(reasoning={"effort": "low", "summary": "auto"},
                                              text={"verbosity": "low"}))
    assert translated.chat["reasoning_effort"] == "low"
    assert translated.effort == "reasoning.effort"
    assert translated.ignored == ("text.verbosity", "reasoning.summary")


def test_store_false_with_encrypted_reasoning_included_is_accepted() -> None:
    translated = RESPONSES.to_chat(response(store=False,
                                              include=["reasoning.encrypted_content"]))
    assert translated.refusal is None and translated.ignored == ("include",)


@pytest.mark.parametrize("tool", [
    pytest.param({"type": "web_search"}, id="web-search"),
    pytest.param({"type": "web_search_preview"}, id="web-search-preview"),
    pytest.param({"type": "local_shell"}, id="local-shell"),
    pytest.param({"type": "shell"}, id="shell"),
    pytest.param({"type": "apply_patch"}, id="apply-patch"),
    pytest.param({"type": "file_search", "vector_store_ids": ["vs_1"]}, id="file-search"),
    pytest.param({"type": "code_interpreter", "container": {"type": "auto"}},
                 id="code-interpreter"),
    pytest.param({"type": "mcp", "server_label": "m", "server_url": "https://mcp.example"},
                 id="mcp"),
    pytest.param({"type": "image_generation"}, id="image-generation"),
])
def test_built_in_tools_are_dropped_and_named(tool: dict[str, Any]) -> None:
    translated = RESPONSES.to_chat(response(tools=[FUNCTION, tool], tool_choice="required",
                                              parallel_tool_calls=True))
    assert [t["function"]["name"] for t in translated.chat["tools"]] == ["get_weather"]
    assert translated.chat["tool_choice"] == "required"
    assert translated.chat["parallel_tool_calls"] is True
    assert translated.ignored == ("tools[1]",) and translated.refusal is None


def test_a_tool_choice_of_a_dropped_tool_is_dropped() -> None:
    hosted = {"type": "web_search"}
    for choice in ({"type": "web_search"},
                   {"type": "allowed_tools", "mode": "auto", "tools": [FUNCTION]}):
        translated = RESPONSES.to_chat(response(tools=[FUNCTION, hosted], tool_choice=choice))
        assert "tool_choice" not in translated.chat
        assert translated.ignored == ("tools[1]", "tool_choice")
    only = RESPONSES.to_chat(response(tools=[hosted], tool_choice="auto",
                                        parallel_tool_calls=False))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & only.chat.keys()
    assert only.ignored == ("tools[0]",)


APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}
CHAT_APPLY_PATCH = {"type": "function", "function": {
    "name": "apply_patch", "description": "Edit files.", "parameters": {
        "type": "object",
        "properties": {"input": {"type": "string", "description": ANY}},
        "required": ["input"], "additionalProperties": False}}}


def test_a_custom_tool_is_a_chat_function_of_its_input() -> None:
    """Codex's ``apply_patch``: offered as a function of one string, ``input``; its Lark
    grammar, which chat cannot constrain the arguments to, is named; the tool_choice naming
    it is chat's named function."""
    translated = RESPONSES.to_chat(response(
        tools=[FUNCTION, APPLY_PATCH], tool_choice={"type": "custom", "name": "apply_patch"},
        parallel_tool_calls=False))
    assert translated.chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather",
                                          "parameters": {"type": "object"}}},
        CHAT_APPLY_PATCH]
    assert translated.chat["tool_choice"] == {"type": "function",
                                              "function": {"name": "apply_patch"}}
    assert translated.chat["parallel_tool_calls"] is False
    assert translated.ignored == ("tools[1].format",) and translated.refusal is None


@pytest.mark.parametrize("fmt", [None, {"type": "text"}], ids=["no-format", "text"])
def test_a_custom_tool_of_free_text_drops_nothing(fmt: dict[str, Any] | None) -> None:
    tool = {"type": "custom", "name": "run"}
    if fmt is not None:
        tool["format"] = fmt
    translated = RESPONSES.to_chat(response(tools=[tool], tool_choice="required"))
    (chat_tool,) = translated.chat["tools"]
    assert chat_tool["function"]["name"] == "run" and "description" not in chat_tool["function"]
    assert chat_tool["function"]["parameters"]["required"] == ["input"]
    assert translated.chat["tool_choice"] == "required"
    assert translated.ignored == ()


def custom(**fields: Any) -> dict[str, Any]:
    return {"type": "custom", **fields}


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([custom()], None, "tools[0].name"),
    ([custom(name="")], None, "tools[0].name"),
    ([custom(name=7)], None, "tools[0].name"),
    ([custom(name="p", description=3)], None, "tools[0].description"),
    ([custom(name="p", format="grammar")], None, "tools[0].format"),
    ([custom(name="p", format={})], None, "tools[0].format.type"),
    ([custom(name="p", format={"type": "grammar", "syntax": "lark"})], None,
     "tools[0].format.definition"),
    ([custom(name="p", format={"type": "grammar", "definition": "x"})], None,
     "tools[0].format.syntax"),
    ([FUNCTION, custom(name="get_weather")], None, "tools[1].name"),
    ([custom(name="get_weather"), FUNCTION], None, "tools[1].name"),
    ([custom(name="p")], {"type": "custom", "name": "q"}, "tool_choice.name"),
    ([custom(name="p")], {"type": "custom"}, "tool_choice.name"),
], ids=["no-name", "empty-name", "name-type", "description-type", "format-type",
        "format-without-type", "grammar-without-definition", "grammar-without-syntax",
        "name-of-a-function", "function-named-as-custom", "choice-unknown",
        "choice-without-name"])
def test_a_bad_custom_tool_is_a_400_naming_the_field(
        tools: list[dict[str, Any]], choice: dict[str, Any] | None, param: str) -> None:
    """Checked as function tools are: a 400 in OpenAI's shape naming the field (and a name
    shared with another tool: the answer tells a custom call from a function's by its name)."""
    payload = response(tools=tools)
    if choice is not None:
        payload["tool_choice"] = choice
    with pytest.raises(InvalidRequest) as caught:
        RESPONSES.to_chat(payload)
    assert caught.value.param == param
    status, body = RESPONSES.error(caught.value)
    error = msgspec.json.decode(body)["error"]
    assert status == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"]


def test_custom_tool_calls_in_the_input_are_chat_tool_calls() -> None:
    translated = RESPONSES.to_chat(response(input=[
        {"type": "message", "role": "user", "content": "Patch it"},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done"},
    ]))
    assert translated.chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {
                "name": "apply_patch",
                "arguments": '{"input":"*** Begin Patch\\n*** End Patch\\n"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Done"}]


RESPONSES_REFUSED = [
    pytest.param(response(input=[{"type": "web_search_call", "id": "ws_1"}]), "input[0].type",
                 id="hosted-tool-item"),
    pytest.param(response(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type",
                 id="item-reference"),
    pytest.param(response(input=[{"role": "user", "content": [
        {"type": "input_file", "file_id": "file-1"}]}]), "input[0].content[0].type",
                 id="file-part"),
    pytest.param(response(input=[{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]), "input[0].content[0].image_url",
                 id="image-by-file-id"),
    pytest.param(response(background=True), "background", id="background"),
    pytest.param(response(moderation={"model": "omni"}), "moderation", id="moderation"),
]


@pytest.mark.parametrize(("payload", "param"), RESPONSES_REFUSED)
def test_responses_refusals_only_when_translated(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        plan(RESPONSES, payload, native=False)
    assert caught.value.param == param
    passed = plan(RESPONSES, payload, native=True)
    assert passed.native and msgspec.json.decode(passed.body) == {**payload, "model": "backend-m"}


def test_codex_request_is_accepted() -> None:
    """Codex CLI's request (fixture, ``wire_api = "responses"``): client_metadata, include,
    reasoning, prompt_cache_key, text.verbosity, parallel_tool_calls, store false, a custom
    and a built-in tool beside function tools."""
    body = fixture("codex_request.json")
    translated = RESPONSES.to_chat(body)
    assert translated.refusal is None and translated.stream
    assert set(translated.ignored) == {"client_metadata", "prompt_cache_key", "tools[2].format",
                                       "tools[3]", "include", "text.verbosity",
                                       "reasoning.summary"}
    chat = translated.chat
    assert [t["function"]["name"] for t in chat["tools"]] == ["shell_command", "update_plan",
                                                              "apply_patch", "view_image"]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "medium"
    assert [m["role"] for m in chat["messages"]] == ["system", "system", "user", "user", "user"]


# --- the plan: named on a translated answer, untouched on a passed-through one ----------------


def plan(frontend: Any, payload: dict[str, Any], *, native: bool, engine: str | None = None
         ) -> Any:
    """``plan_upstream`` for ``payload`` on a pool that speaks the API (``native``) or not."""
    parsed, _ = translate_native(copy.deepcopy(payload), frontend)
    backend = Backend(url="http://127.0.0.1:9", api=[frontend.name] if native else "chat")
    pool = PoolState(Pool(name="p", backends=[backend], engine=engine))  # type: ignore[arg-type]
    return plan_upstream(frontend, parsed, pool, "backend-m", "req-1", lambda: 5)


def test_a_translated_answer_names_what_was_dropped() -> None:
    upstream = plan(RESPONSES, fixture("codex_request.json"), native=False)
    ((name, value),) = upstream.headers
    assert name == b"x-gateway-ignored"
    assert set(value.decode().split(",")) == {
        "client_metadata", "prompt_cache_key", "tools[2].format", "tools[3]", "include",
        "text.verbosity", "reasoning.summary"}
    sent = msgspec.json.decode(upstream.body)
    assert "client_metadata" not in sent and sent["model"] == "backend-m"


@pytest.mark.parametrize("frontend", [MESSAGES, RESPONSES], ids=["messages", "responses"])
def test_a_passed_through_request_goes_as_sent_and_names_nothing(frontend: Any) -> None:
    payload = fixture("claude_code_request.json" if frontend is MESSAGES
                      else "codex_request.json")
    upstream = plan(frontend, payload, native=True)
    assert upstream.native and upstream.headers == []
    assert msgspec.json.decode(upstream.body) == {**payload, "model": "backend-m"}


@pytest.mark.parametrize(("engine", "sent"), [
    (None, True), ("vllm", True), ("sglang", True), ("llamacpp", True), ("tgi", False)])
def test_reasoning_effort_goes_to_engines_that_take_it(engine: str | None, sent: bool) -> None:
    """A backend whose chat completions take no ``reasoning_effort`` does not get it, and the
    client's field that set it is named instead."""
    for frontend, payload, source in (
            (MESSAGES, message(thinking={"type": "enabled", "budget_tokens": 2000}), "thinking"),
            (MESSAGES, message(output_config={"effort": "max"}), "output_config.effort"),
            (RESPONSES, response(reasoning={"effort": "low"}), "reasoning.effort")):
        upstream = plan(frontend, payload, native=False, engine=engine)
        body = msgspec.json.decode(upstream.body)
        assert ("reasoning_effort" in body) is sent
        named = upstream.headers[0][1].decode().split(",") if upstream.headers else []
        assert (source in named) is not sent


def test_a_refusal_is_raised_before_admission_when_no_pool_could_pass_it_through() -> None:
    """The pipeline asks before admission: when no pool speaks the API (or the request
    continues a stored response), the request will be translated, so its 400 comes at once,
    nothing reserved or recorded; otherwise the route decides."""
    payload = response(background=True)
    parsed, _ = translate_native(copy.deepcopy(payload), RESPONSES)
    chat_only = {"p": PoolState(Pool(name="p", backends=[Backend(url="http://127.0.0.1:9")]))}
    speaking = {**chat_only, "q": PoolState(Pool(name="q", backends=[
        Backend(url="http://127.0.0.1:8", api=["responses"])]))}
    with pytest.raises(InvalidRequest) as caught:
        refuse_untranslatable(parsed, RESPONSES, chat_only)
    assert caught.value.param == "background"
    refuse_untranslatable(parsed, RESPONSES, speaking)  # a pool may take it as sent
    continued, _ = translate_native(response(background=True, previous_response_id="resp_1"),
                                    RESPONSES)
    with pytest.raises(InvalidRequest):
        refuse_untranslatable(continued, RESPONSES, speaking)  # always translated
    fine, _ = translate_native(response(), RESPONSES)
    refuse_untranslatable(fine, RESPONSES, chat_only)
    refuse_untranslatable(fine, None, chat_only)
