"""The gateway (a real process) in front of two real llama-servers, driven by the official
``openai`` and ``anthropic`` clients: every client API served by the engine's chat (Messages
and Responses translated), the engine's usage on the record, a closed stream freeing the
engine's slot, and the engine's context error in each client's shape.

The public model ``tiny-chat`` is served by engines that call it ``tiny-llama``: every answer
must name the public model. The tiny model's text is noise, so only shapes and counts are
checked, never content. The engines count with GPT-2's tokenizer and the gateway with
o200k_base, so a count equal to the engine's own is the engine's, not the gateway's estimate.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from loadtest.engines.llama_server import LlamaServer
from tests.engines.conftest import (
    CHAT_MODEL,
    EMBED_MODEL,
    ENGINE_MODEL,
    anthropic_client,
    busy_slots,
    engine_metrics,
    openai_client,
    record_of,
    wait_for,
)
from tests.helpers import GatewayProcess

pytestmark = [pytest.mark.engine, pytest.mark.process]

Engines = tuple[LlamaServer, LlamaServer]

HELLO: Any = [{"role": "user", "content": "Hello there, how are you?"}]
CONVERSATION: Any = [
    {"role": "system", "content": "You are a terse assistant for a small bookshop."},
    {"role": "user", "content": "Do you have books about the history of Rome?"},
    {"role": "assistant", "content": "Yes: three, on the shelf by the window."},
    {"role": "user", "content": "Which one is the shortest?"},
]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
#: ~3,000 GPT-2 tokens: over a slot's 2,048
TOO_LONG = "hello " * 3000


def engine_prompt_tokens(server: LlamaServer, messages: list[dict[str, Any]]) -> int:
    """The engine's own prompt count for these chat messages (asked directly)."""
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text
    count: int = r.json()["usage"]["prompt_tokens"]
    return count


def assert_record_matches(record: dict[str, Any], prompt: int, output: int, *,
                          api: str) -> None:
    """The record bills the engine's counts (not an estimate) and its input buckets sum to
    the engine's prompt count."""
    assert record["model"] == CHAT_MODEL or record["model"] == EMBED_MODEL
    assert record["upstream_model"] in (ENGINE_MODEL, None)
    assert record["api"] == api
    assert record["outcome"] == "completed", record
    assert not record["estimated"], record
    assert record["prompt_total"] == prompt
    assert record["output"] == output
    assert record["system"] + record["history"] + record["new"] + record["tools"] == prompt
    assert record["pool"] in ("chat", "embed") and record["backend"] in ("a", "b")


# --- 1. chat, tools, completions, embeddings ---------------------------------------------------

def test_chat_plain(gateway: GatewayProcess, llama_servers: Engines) -> None:
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=8)
    answer = raw.parse()
    assert raw.headers["x-gateway-pool"] == "chat"
    assert answer.model == CHAT_MODEL  # the engine said tiny-llama
    assert answer.object == "chat.completion"
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop")
    usage = answer.usage
    assert usage is not None and 0 < usage.completion_tokens <= 8
    assert usage.prompt_tokens == engine_prompt_tokens(llama_servers[0], HELLO)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, usage.prompt_tokens, usage.completion_tokens, api="chat")
    assert record["new"] == usage.prompt_tokens  # one user message: all of it is new input


def test_chat_stream(gateway: GatewayProcess, llama_servers: Engines) -> None:
    stream = openai_client(gateway).chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=8, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    request_id = stream.response.headers["x-request-id"]
    assert chunks and {c.model for c in chunks} == {CHAT_MODEL}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop")
    usage = chunks[-1].usage  # the usage chunk comes last, with no choices
    assert usage is not None and chunks[-1].choices == []
    assert 0 < usage.completion_tokens <= 8 and isinstance(text, str)
    assert usage.prompt_tokens == engine_prompt_tokens(llama_servers[0], HELLO)
    record = record_of(gateway, request_id)
    assert_record_matches(record, usage.prompt_tokens, usage.completion_tokens, api="chat")
    assert record["ttft_ms"] is not None and record["ttft_ms"] > 0


def test_chat_stream_without_usage_asked_still_bills_the_engines_count(
        gateway: GatewayProcess) -> None:
    """The gateway asks the engine for usage and drops the usage chunk the client did not ask
    for; the record still carries the engine's count (not an estimate)."""
    stream = openai_client(gateway).chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=6, stream=True)
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    record = record_of(gateway, stream.response.headers["x-request-id"])
    assert record["outcome"] == "completed" and not record["estimated"], record
    assert 0 < record["output"] <= 6


def test_chat_with_tools(gateway: GatewayProcess) -> None:
    """Tools are accepted and the answer is well-formed (the noise model calls no tool)."""
    client = openai_client(gateway)
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT_MODEL, max_tokens=8, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    answer = raw.parse()
    assert answer.model == CHAT_MODEL
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("length", "stop", "tool_calls")
    if choice.message.tool_calls:  # well-formed if the noise happens to be a call
        assert all(call.type == "function" and call.function.name
                   for call in choice.message.tool_calls)
    assert answer.usage is not None
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, answer.usage.prompt_tokens, answer.usage.completion_tokens,
                          api="chat")
    # streamed, with a tool result in the history
    stream = client.chat.completions.create(
        model=CHAT_MODEL, max_tokens=6, tools=[WEATHER_TOOL], stream=True,
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
        ])
    chunks = list(stream)
    assert chunks and {c.model for c in chunks} == {CHAT_MODEL}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in (
        "length", "stop", "tool_calls")
    record = record_of(gateway, stream.response.headers["x-request-id"])
    assert record["outcome"] == "completed" and record["output"] > 0


def test_completions_plain_and_stream(gateway: GatewayProcess) -> None:
    client = openai_client(gateway)
    raw = client.completions.with_raw_response.create(
        model=CHAT_MODEL, prompt="Once upon a time", max_tokens=6)
    answer = raw.parse()
    assert answer.model == CHAT_MODEL and answer.object == "text_completion"
    assert isinstance(answer.choices[0].text, str)
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 6
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, answer.usage.prompt_tokens, answer.usage.completion_tokens,
                          api="completions")
    stream = client.completions.create(model=CHAT_MODEL, prompt="Once upon a time",
                                       max_tokens=5, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks and {c.model for c in chunks} == {CHAT_MODEL}
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= 5
    record = record_of(gateway, stream.response.headers["x-request-id"])
    assert_record_matches(record, usage.prompt_tokens, usage.completion_tokens,
                          api="completions")


def test_embeddings_go_to_the_embeddings_engine(gateway: GatewayProcess,
                                                llama_servers: Engines) -> None:
    raw = openai_client(gateway).embeddings.with_raw_response.create(
        model=EMBED_MODEL, input=["hello", "world, again"])
    answer = raw.parse()
    assert raw.headers["x-gateway-pool"] == "embed"
    assert answer.model == EMBED_MODEL
    assert [len(d.embedding) for d in answer.data] == [256, 256]
    assert [d.index for d in answer.data] == [0, 1]
    assert answer.data[0].embedding != answer.data[1].embedding
    direct = httpx.post(f"{llama_servers[1].url}/v1/embeddings", timeout=30,
                        json={"input": ["hello", "world, again"]}).json()
    assert answer.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    assert answer.data[0].embedding == pytest.approx(direct["data"][0]["embedding"], abs=1e-4)
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, answer.usage.prompt_tokens, 0, api="embeddings")
    assert record["pool"] == "embed" and record["backend"] == "b"


# --- 2. Messages and Responses, translated to the engine's chat -----------------------------

def test_anthropic_messages_plain_and_stream(gateway: GatewayProcess,
                                             llama_servers: Engines) -> None:
    client = anthropic_client(gateway)
    system, turns = CONVERSATION[0]["content"], CONVERSATION[1:]
    raw = client.messages.with_raw_response.create(
        model=CHAT_MODEL, max_tokens=8, system=system, messages=turns)
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.model == CHAT_MODEL
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert message.content and message.content[0].type == "text"
    assert 0 < message.usage.output_tokens <= 8
    # the engine counted the translated chat: the same messages as a chat request
    engine_count = engine_prompt_tokens(llama_servers[0], CONVERSATION)
    assert message.usage.input_tokens == engine_count
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, engine_count, message.usage.output_tokens, api="messages")
    assert record["system"] > 0 and record["history"] > 0 and record["new"] > 0

    with client.messages.stream(model=CHAT_MODEL, max_tokens=6, system=system,
                                messages=turns) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert final.model == CHAT_MODEL and final.stop_reason in ("max_tokens", "end_turn")
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert 0 < final.usage.output_tokens <= 6
    assert final.usage.input_tokens == engine_count
    record = record_of(gateway, request_id)
    assert_record_matches(record, engine_count, final.usage.output_tokens, api="messages")


def test_openai_responses_plain_and_stream(gateway: GatewayProcess,
                                           llama_servers: Engines) -> None:
    client = openai_client(gateway)
    raw = client.responses.with_raw_response.create(
        model=CHAT_MODEL, instructions="Be brief.", input="Hello there, how are you?",
        max_output_tokens=8, store=False)
    response = raw.parse()
    assert response.object == "response" and response.model == CHAT_MODEL
    assert response.status in ("completed", "incomplete")
    assert isinstance(response.output_text, str)
    assert response.usage is not None and 0 < response.usage.output_tokens <= 8
    engine_count = engine_prompt_tokens(llama_servers[0], [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there, how are you?"}])
    assert response.usage.input_tokens == engine_count
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, engine_count, response.usage.output_tokens, api="responses")
    assert record["system"] > 0

    stream = client.responses.create(model=CHAT_MODEL, input=CONVERSATION[1:],
                                     instructions=CONVERSATION[0]["content"],
                                     max_output_tokens=6, stream=True, store=False)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    final = last.response
    assert final.model == CHAT_MODEL
    assert final.usage is not None and 0 < final.usage.output_tokens <= 6
    assert final.usage.input_tokens == engine_prompt_tokens(llama_servers[0], CONVERSATION)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    record = record_of(gateway, stream.response.headers["x-request-id"])
    assert_record_matches(record, final.usage.input_tokens, final.usage.output_tokens,
                          api="responses")
    assert record["history"] > 0 and record["new"] > 0


# --- 3. the history split, apportioned to the engine's count ---------------------------------

def test_history_split_sums_to_the_engines_prompt(gateway: GatewayProcess,
                                                  llama_servers: Engines) -> None:
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=CONVERSATION, max_tokens=4)
    answer = raw.parse()
    assert answer.usage is not None
    engine_count = engine_prompt_tokens(llama_servers[0], CONVERSATION)
    assert answer.usage.prompt_tokens == engine_count
    record = record_of(gateway, raw.headers["x-request-id"])
    assert_record_matches(record, engine_count, answer.usage.completion_tokens, api="chat")
    assert record["system"] > 0 and record["history"] > 0 and record["new"] > 0
    assert record["tools"] == 0
    # the re-sent turns (a question and its answer) outweigh the system line and the new one
    assert record["history"] > record["new"]
    # a conversation one turn longer: history grows, system stays about the same
    longer = [*CONVERSATION, {"role": "assistant", "content": "The second, at 180 pages."},
              {"role": "user", "content": "Order it, please."}]
    raw2 = openai_client(gateway).chat.completions.with_raw_response.create(
        model=CHAT_MODEL, messages=longer, max_tokens=4)
    usage2 = raw2.parse().usage
    assert usage2 is not None
    assert usage2.prompt_tokens == engine_prompt_tokens(llama_servers[0], longer)
    second = record_of(gateway, raw2.headers["x-request-id"])
    assert_record_matches(second, usage2.prompt_tokens, usage2.completion_tokens, api="chat")
    assert second["history"] > record["history"]
    assert abs(second["system"] - record["system"]) <= 2


# --- 4. a closed stream frees the engine's slot -----------------------------------------------

def test_closed_stream_frees_the_engine_slot(gateway: GatewayProcess,
                                             llama_servers: Engines) -> None:
    """The client closes a stream that asked for ~1,900 tokens after a few chunks: the engine
    stops generating (its slot free again, far fewer tokens predicted than asked) and the
    request is recorded as cancelled, billed for what was relayed."""
    max_tokens = 1900  # a slot holds 2,048 tokens
    before = [engine_metrics(s)["llamacpp:tokens_predicted_total"] for s in llama_servers]
    stream = openai_client(gateway).chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=max_tokens, stream=True,
        extra_body={"ignore_eos": True})
    request_id = stream.response.headers["x-request-id"]
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got == 3:
                break
    assert got == 3
    assert sum(busy_slots(s) for s in llama_servers) == 1  # still generating
    closed = time.monotonic()
    stream.close()
    wait_for("the engines' slots free after the client closed its stream",
             lambda: all(busy_slots(s) == 0 for s in llama_servers), timeout=10)
    # reported, not asserted (a loaded box stretches it): the README's figure
    print(f"slot free {time.monotonic() - closed:.3f} s after the client closed its stream")
    after = [engine_metrics(s)["llamacpp:tokens_predicted_total"] for s in llama_servers]
    predicted = sum(after) - sum(before)
    assert 3 <= predicted < max_tokens // 2, predicted  # stopped, not run to the end
    record = record_of(gateway, request_id)
    assert record["outcome"] == "cancelled", record
    # billed for what was relayed: the engine sent no usage, so the gateway counted the
    # relayed text with its own tokenizer (not the engine's: the figures need not match)
    assert record["output"] > 0 and record["estimated"], record
    assert record["estimate_reason"] == "no_usage"


# --- 5. a prompt over the engine's context ------------------------------------------------------

def _assert_context_message(message: str) -> None:
    assert "exceeds the available context size" in message  # the engine's own words
    assert "2048" in message


def test_context_exceeded_chat(gateway: GatewayProcess) -> None:
    """llama.cpp's ``exceed_context_size_error`` becomes OpenAI's ``invalid_request_error`` /
    ``context_length_exceeded`` (streamed or not), the engine's message kept."""
    client = openai_client(gateway)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            answer = client.chat.completions.create(
                model=CHAT_MODEL, max_tokens=4, stream=stream,
                messages=[{"role": "user", "content": TOO_LONG}])
            if stream:
                list(answer)
        exc = err.value
        assert exc.status_code == 400
        assert exc.code == "context_length_exceeded", exc.body
        assert exc.type == "invalid_request_error"
        _assert_context_message(exc.message)
        body = exc.response.json()
        assert set(body) == {"error"}
        assert body["error"]["code"] == "context_length_exceeded"
        record = record_of(gateway, exc.response.headers["x-request-id"])
        assert record["status"] == 400 and record["output"] == 0


def test_context_exceeded_responses(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(gateway).responses.create(model=CHAT_MODEL, input=TOO_LONG,
                                                max_output_tokens=4, store=False)
    assert err.value.code == "context_length_exceeded", err.value.body
    assert err.value.type == "invalid_request_error"
    _assert_context_message(err.value.message)


def test_context_exceeded_messages(gateway: GatewayProcess) -> None:
    """On /v1/messages the same error comes in Anthropic's shape."""
    client = anthropic_client(gateway)
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as err:
            if stream:
                with client.messages.stream(model=CHAT_MODEL, max_tokens=4,
                                            messages=[{"role": "user", "content": TOO_LONG}]) as s:
                    list(s.text_stream)
            else:
                client.messages.create(model=CHAT_MODEL, max_tokens=4,
                                       messages=[{"role": "user", "content": TOO_LONG}])
        body = err.value.response.json()
        assert body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error", body
        _assert_context_message(body["error"]["message"])
        assert err.value.status_code == 400
        assert json.dumps(body).count("exceed_context_size_error") == 0  # no engine shape left
