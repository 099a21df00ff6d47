"""Coding agents' requests through a real gateway, with the official clients (issue 40).

A gateway process in front of the simulator, as a chat-only backend (the front-ends translate)
or declared as speaking Messages and Responses (requests pass through as sent):

* Claude Code 2.1's request (``tests/dialects/fixtures/claude_code_request.json``: a system-role
  message inside ``messages``, cache_control on the system array, the tools and a message,
  adaptive thinking, context_management, output_config, metadata.user_id, 12 tools, streamed,
  ``POST /v1/messages?beta=true`` with Claude Code's ``anthropic-beta`` header) is accepted and
  streams a well-formed answer, its events in Anthropic's order on the wire;
* Codex CLI's request (``codex_request.json``: client_metadata, include, reasoning,
  prompt_cache_key, text.verbosity, parallel_tool_calls, store false with encrypted reasoning
  included, a custom and a built-in tool) is accepted;
* Codex's custom tool (``apply_patch``) works translated: the openai client's stream of a call
  to it is a ``custom_tool_call`` with its events in OpenAI's order, and the call's output sent
  back (Codex re-sends the conversation, ``store`` false) is answered;
* a translated answer names what was dropped in ``x-gateway-ignored``; a passed-through one
  names nothing;
* ``stop_sequences`` that end an answer give ``stop_reason: "stop_sequence"`` and the string,
  plain and streamed;
* ``/v1/models`` shows each model's context window and output bound, in OpenAI's shape and
  in Anthropic's (the policy's figures, or the engine's ``max_model_len``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent

from gateway.sim.server import SimServer
from tests.echo_backend import EchoBackend
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

FIXTURES = Path(__file__).resolve().parent.parent / "dialects" / "fixtures"
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
#: what Claude Code sends beside its body
CLAUDE_CODE_BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
                     "context-management-2025-06-27", "fine-grained-tool-streaming-2025-05-14"]
CONTEXT, MAX_OUTPUT = 131_072, 32_000


@pytest.fixture(scope="module", params=["translated", "passthrough"])
def gw(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
       ) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("agents")
    with SimServer("interactive", speedup=50, jitter=0.0) as sim:
        data = policy({"chat": [sim.url]})
        if request.param == "passthrough":
            data["pools"][0]["backends"][0]["api"] = ["responses", "messages"]
        data["models"][0].update(context_length=CONTEXT, max_output_tokens=MAX_OUTPUT)
        # a model whose policy gives no context window: the engine's is shown
        data["models"].append({"name": "engine-model", "pool": "chat",
                               "backend_model": "sim-model"})
        with GatewayProcess(tmp, data) as gateway:
            gateway.mode = request.param  # type: ignore[attr-defined]
            yield gateway


def translated(gw: GatewayProcess) -> bool:
    return gw.mode == "translated"  # type: ignore[attr-defined,no-any-return]


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    body["model"] = "chat-model"
    return body


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of an SSE body."""
    out: list[tuple[str, dict[str, Any]]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "", ""
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
        if data and data != "[DONE]":
            out.append((name, json.loads(data)))
    return out


def ignored(response: httpx.Response) -> set[str]:
    header = response.headers.get("x-gateway-ignored")
    return set(header.split(",")) if header else set()


def test_claude_code_request_streams_a_well_formed_answer(gw: GatewayProcess) -> None:
    """On the wire: accepted, every event one of Anthropic's, in Anthropic's order, folding
    into a whole message; what a translation dropped is named."""
    body = fixture("claude_code_request.json")
    headers = {"x-api-key": TEST_KEY, "anthropic-version": "2023-06-01",
               "anthropic-beta": ",".join(CLAUDE_CODE_BETAS), "user-agent": "claude-cli/2.1.42"}
    with httpx.stream("POST", gw.url + "/v1/messages?beta=true", headers=headers, json=body,
                      timeout=60) as r:
        text = r.read().decode()
    assert r.status_code == 200, text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(text)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    message = None
    buffers: dict[int, bytes] = {}
    for name, data in events:
        if name == "ping":
            assert data == {"type": "ping"}
            continue
        event = EVENTS.validate_python(data)  # each one of Anthropic's event types
        message = accumulate_event(event=event, current_snapshot=message, json_bufs=buffers)
    assert message is not None and message.model == "chat-model"
    # the simulator answers an offer of tools with a call to the first (Task)
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "Task" and block.input
    assert message.stop_reason == "tool_use" and message.usage.output_tokens > 0
    if translated(gw):
        assert ignored(r) == {"cache_control", "context_management"}
    else:
        assert "x-gateway-ignored" not in r.headers
    # Claude Code counts its requests' tokens the same way (the gateway answers it itself)
    counted = httpx.post(gw.url + "/v1/messages/count_tokens?beta=true", headers=headers,
                         json={k: v for k, v in body.items() if k not in ("stream", "max_tokens")},
                         timeout=30)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > message.usage.output_tokens  # tools included


def test_stream_events_in_anthropic_order_on_the_wire(gw: GatewayProcess) -> None:
    """message_start, content_block_start, ping, ...: the ping after the first block's start,
    as Anthropic sends it (a plain text answer)."""
    with httpx.stream("POST", gw.url + "/v1/messages", timeout=60,
                      headers={"x-api-key": TEST_KEY, "anthropic-version": "2023-06-01"},
                      json={"model": "chat-model", "max_tokens": 4, "stream": True,
                            "messages": [{"role": "user", "content": "Hi"}]}) as r:
        names = [name for name, _ in sse(r.read().decode())]
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * 4,
                     "content_block_stop", "message_delta", "message_stop"]


def test_claude_code_request_with_the_anthropic_sdk(gw: GatewayProcess) -> None:
    """The same request made by the SDK's beta client (``?beta=true``, ``anthropic-beta``)."""
    body = fixture("claude_code_request.json")
    body.pop("stream")
    extra = {"temperature": body.pop("temperature")}  # no longer one of the SDK's parameters
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    with client.beta.messages.stream(**body, betas=CLAUDE_CODE_BETAS,
                                     extra_body=extra) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    # its answer to the tool's result is text
    call = final.content[0]
    turns = [*body["messages"], {"role": "assistant", "content": [call.to_dict()]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                           "content": "hello"}]}]
    with client.beta.messages.stream(**{**body, "messages": turns, "max_tokens": 12},
                                     betas=CLAUDE_CODE_BETAS) as stream:
        text = "".join(stream.text_stream)
        reply = stream.get_final_message()
    assert text and reply.content[0].type == "text" and reply.content[0].text == text


def test_codex_request_is_accepted(gw: GatewayProcess) -> None:
    body = fixture("codex_request.json")
    r = httpx.post(gw.url + "/v1/responses", json=body, timeout=60,
                   headers={"Authorization": f"Bearer {TEST_KEY}", "originator": "codex_cli_rs"})
    assert r.status_code == 200, r.text
    events = sse(r.text)
    kinds = [data["type"] for _, data in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    # the simulator answers an offer of function tools with a call to the first
    assert final["model"] == "chat-model"
    assert [item["type"] for item in final["output"]] == ["function_call"]
    if translated(gw):
        assert ignored(r) == {"client_metadata", "prompt_cache_key", "tools[2].format",
                              "tools[3]", "include", "text.verbosity", "reasoning.summary"}
    else:
        assert "x-gateway-ignored" not in r.headers
    # and with the openai SDK (client_metadata is none of its parameters: extra_body)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    extra = {"client_metadata": body.pop("client_metadata")}
    body.pop("stream")
    with client.responses.stream(**body, extra_body=extra) as stream:
        done = stream.get_final_response()
    assert done.output[0].type == "function_call" and done.output[0].name == "shell_command"
    assert [t.type for t in done.tools][2:4] == ["custom", "web_search"]


def test_codex_custom_tool_call_streamed_with_the_openai_client(gw: GatewayProcess) -> None:
    """Codex's ``apply_patch`` (a custom tool with a Lark grammar), chosen: translated, the
    simulator calls the chat function it became, with ``{"input": "sim"}`` (its schema's one
    required string), and the openai client reads a ``custom_tool_call`` whose input is the
    string, streamed as OpenAI streams one. Passed through, the simulator never calls custom
    tools (its own Responses API): nothing to check there."""
    if not translated(gw):
        pytest.skip("the simulator's own Responses API never calls custom tools")
    body = fixture("codex_request.json")
    apply_patch = body["tools"][2]
    assert apply_patch["type"] == "custom" and apply_patch["format"]["type"] == "grammar"
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    user = {"role": "user", "content": "Add a file."}
    raw = client.responses.with_raw_response.create(
        model="chat-model", input=[user], tools=[apply_patch], store=False, stream=True,
        tool_choice={"type": "custom", "name": "apply_patch"})
    assert set(raw.headers["x-gateway-ignored"].split(",")) == {"tools[0].format"}
    events = list(raw.parse())
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done, item_done = events[2:6]
    assert added.type == "response.output_item.added"
    assert added.item.type == "custom_tool_call" and added.item.input == ""
    assert delta.type == "response.custom_tool_call_input.delta" and delta.delta == "sim"
    assert done.type == "response.custom_tool_call_input.done" and done.input == "sim"
    assert delta.item_id == done.item_id == added.item.id and delta.output_index == 0
    assert item_done.type == "response.output_item.done"
    call = item_done.item
    assert call.type == "custom_tool_call"
    assert (call.name, call.input, call.id) == ("apply_patch", "sim", added.item.id)
    assert call.call_id
    assert events[-1].type == "response.completed"
    assert events[-1].response.output == [call]
    # the call's output, with the conversation re-sent (Codex's way, store false): text
    reply = client.responses.create(
        model="chat-model", tools=[apply_patch], store=False, max_output_tokens=8, input=[
            user, call.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}])
    assert [item.type for item in reply.output] == ["message"] and reply.output_text


def test_an_unknown_field_is_dropped_and_named_never_refused(gw: GatewayProcess) -> None:
    r = httpx.post(gw.url + "/v1/responses", timeout=30,
                   headers={"Authorization": f"Bearer {TEST_KEY}"},
                   json={"model": "chat-model", "input": "Hi", "max_output_tokens": 3,
                         "client_metadata": {"k": "v"}, "context_management": [
                             {"type": "compaction", "compact_threshold": 1000}]})
    assert r.status_code == 200, r.text
    if translated(gw):
        assert r.headers["x-gateway-ignored"] == "client_metadata,context_management"


def test_what_chat_cannot_carry_is_refused_only_when_translated(gw: GatewayProcess) -> None:
    """A ``document`` block: a 400 naming it when the request is translated to chat (before
    admission: no pool here speaks Messages), the backend's answer when passed through."""
    r = httpx.post(gw.url + "/v1/messages", timeout=30,
                   headers={"x-api-key": TEST_KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "chat-model", "max_tokens": 3, "messages": [
                       {"role": "user", "content": [
                           {"type": "text", "text": "Read this."},
                           {"type": "document", "source": {"type": "text",
                                                           "media_type": "text/plain",
                                                           "data": "A short text."}}]}]})
    if translated(gw):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert r.json()["error"]["message"].startswith("messages[0].content[1].type: ")
    else:
        assert r.status_code == 200, r.text


def _stop_for(client: anthropic.Anthropic, messages: list[Any]) -> str:
    """A stop string the answer will meet: a word from the middle of the unstopped answer."""
    first = client.messages.create(model="chat-model", max_tokens=30, messages=messages)
    return " " + first.content[0].text.split(" ")[8]  # type: ignore[union-attr]


def test_stop_sequence_plain_and_streamed(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Count for me."}]
    stop = _stop_for(client, messages)
    stops = ["@@never@@", stop]
    plain = client.messages.create(model="chat-model", max_tokens=30, messages=messages,
                                   stop_sequences=stops)
    assert (plain.stop_reason, plain.stop_sequence) == ("stop_sequence", stop)
    assert stop not in plain.content[0].text  # type: ignore[union-attr]
    with client.messages.stream(model="chat-model", max_tokens=30, messages=messages,
                                stop_sequences=stops) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == plain.content[0].text  # type: ignore[union-attr]


def test_models_show_context_window_and_max_output_openai_shape(gw: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    cards = {m.id: m.model_dump() for m in client.models.list()}
    assert cards["chat-model"]["context_length"] == CONTEXT
    assert cards["chat-model"]["max_model_len"] == CONTEXT
    assert cards["chat-model"]["max_output_tokens"] == MAX_OUTPUT
    engine = cards["engine-model"]  # none in the policy: the simulator's max_model_len
    assert engine["context_length"] == engine["max_model_len"] == 450_000
    assert engine["max_output_tokens"] == 32768  # the gateway's default bound
    one = client.models.retrieve("chat-model").model_dump()
    assert one["context_length"] == CONTEXT and one["object"] == "model"


def test_models_show_context_window_and_max_output_anthropic_shape(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    page = client.models.list()
    cards = {m.id: m for m in page.data}
    chat = cards["chat-model"]
    assert chat.type == "model" and chat.display_name == "chat-model"
    assert (chat.max_input_tokens, chat.max_tokens) == (CONTEXT, MAX_OUTPUT)
    assert chat.created_at.year >= 2024
    assert cards["engine-model"].max_input_tokens == 450_000
    assert page.has_more is False
    one = client.models.retrieve("chat-model")
    assert one.max_input_tokens == CONTEXT
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no-such-model")


def test_models_refuse_a_wrong_key_in_the_clients_shape(gw: GatewayProcess) -> None:
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic.Anthropic(base_url=gw.url, api_key="sk-not-a-key-0123456789abcdef",
                            max_retries=0).models.list()
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-not-a-key-0123456789abcdef",
                      max_retries=0).models.list()


# --- what crosses the hop: as sent when passed through, translated otherwise ------------------


@pytest.fixture(scope="module")
def echo_gw(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[GatewayProcess, EchoBackend]]:
    """One echo backend behind two pools: ``native`` declares it speaks Messages and
    Responses (requests pass through), ``chat`` does not (requests are translated)."""
    tmp = tmp_path_factory.mktemp("agents-echo")
    with EchoBackend() as echo:
        data = policy({"native": [echo.url], "chat": [echo.url]})
        data["pools"][0]["backends"][0]["api"] = ["responses", "messages"]
        with GatewayProcess(tmp, data) as gateway:
            yield gateway, echo


@pytest.mark.parametrize(("path", "name"), [("/v1/messages?beta=true", "claude_code"),
                                            ("/v1/responses", "codex")])
def test_a_passed_through_request_crosses_the_hop_as_sent(
        echo_gw: tuple[GatewayProcess, EchoBackend], path: str, name: str) -> None:
    """Every field the client sent, untouched (but the model name, the backend's, and the
    tenant's prompt-cache salt the gateway adds), and Claude Code's ``anthropic-beta``
    header, reach a backend that speaks the API."""
    gw, echo = echo_gw
    body = {**fixture(f"{name}_request.json"), "model": "native-model", "stream": False}
    headers = {"authorization": f"Bearer {TEST_KEY}", "anthropic-version": "2023-06-01",
               "anthropic-beta": ",".join(CLAUDE_CODE_BETAS)}
    r = httpx.post(gw.url + path, json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert "x-gateway-ignored" not in r.headers
    seen = echo.requests[-1]
    sent: dict[str, Any] = dict(seen["body"])  # type: ignore[call-overload]
    sent.pop("cache_salt", None)  # the gateway's own (isolation), never the client's
    assert seen["path"] == path.split("?")[0]
    assert sent == {**body, "model": "sim-model"}
    assert seen["headers"]["anthropic-beta"] == ",".join(CLAUDE_CODE_BETAS)  # type: ignore[index]
    assert TEST_KEY not in json.dumps(seen["headers"])


def test_a_translated_request_leaves_out_what_it_names(
        echo_gw: tuple[GatewayProcess, EchoBackend]) -> None:
    gw, echo = echo_gw
    body = {**fixture("claude_code_request.json"), "model": "chat-model", "stream": False}
    r = httpx.post(gw.url + "/v1/messages?beta=true", json=body, timeout=30,
                   headers={"x-api-key": TEST_KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    assert set(r.headers["x-gateway-ignored"].split(",")) == {"cache_control",
                                                              "context_management"}
    seen = echo.requests[-1]
    sent: dict[str, Any] = seen["body"]  # type: ignore[assignment]
    assert seen["path"] == "/v1/chat/completions"
    assert "context_management" not in sent and "cache_control" not in json.dumps(sent)
    assert sent["reasoning_effort"] == "high" and len(sent["tools"]) == 12
    assert [m["role"] for m in sent["messages"]] == ["system"] * 4 + ["user"]
