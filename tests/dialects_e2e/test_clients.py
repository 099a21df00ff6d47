"""The front-ends through a real gateway with the official clients: Anthropic's Messages and
OpenAI's Responses, translated to a chat-completions backend (the simulator); every request
admitted, routed, metered with the history split and recorded once, like a chat request."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-apis-e2e"


@pytest.fixture(scope="module", params=["translated", "passthrough"])
def gw(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
       ) -> Iterator[GatewayProcess]:
    """A gateway in front of the simulator: as a chat-only backend (the front-ends translate),
    or declared as speaking Responses and Messages too (requests pass through unchanged)."""
    tmp = tmp_path_factory.mktemp("apis")
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        with SimServer("interactive", speedup=20, jitter=0.0) as sim:
            data = policy({"chat": [sim.url]})
            if request.param == "passthrough":
                data["pools"][0]["backends"][0]["api"] = ["responses", "messages"]
            data["auth"]["keys"][0]["tenant"] = "acme"
            data["plans"] = [{"name": "p", "limits": {"rpm": 10_000}}]
            data["tenants"] = [{"name": "acme", "plan": "p"}]
            data["prices"] = {"models": {"chat-model": {"input": "1", "output": "2"}}}
            with GatewayProcess(tmp, data) as gateway:
                gateway.sim = sim  # type: ignore[attr-defined]
                gateway.mode = request.param  # type: ignore[attr-defined]
                yield gateway
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def records(gw: GatewayProcess, n: int) -> list[dict[str, Any]]:
    """The last ``n`` usage records (the ledger is durable before each answer ends)."""
    return sorted(usage_records(gw.url, ADMIN), key=lambda x: x["ts_ms"])[-n:]


def test_anthropic_messages_plain_and_streamed(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    first = client.messages.create(
        model="chat-model", max_tokens=6, system="Be brief.",
        messages=[{"role": "user", "content": "Hello there"}])
    assert first.type == "message" and first.role == "assistant"
    assert first.model == "chat-model" and first.stop_reason == "max_tokens"
    assert first.usage.output_tokens == 6 and first.usage.input_tokens > 0
    reply = first.content[0].text  # type: ignore[union-attr]
    turns = [{"role": "user", "content": "Hello there"},
             {"role": "assistant", "content": reply},
             {"role": "user", "content": "And then?"}]
    with client.messages.stream(model="chat-model", max_tokens=5, system="Be brief.",
                                messages=turns) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens == 5 and text == final.content[0].text  # type: ignore[union-attr]
    plain, streamed = records(gw, 2)
    assert plain["output"] == 6 and streamed["output"] == 5
    assert plain["history"] == 0 and streamed["history"] > 0  # the re-sent turn, its own line
    assert streamed["prompt_total"] == final.usage.input_tokens
    for r in (plain, streamed):
        assert r["outcome"] == "completed" and r["tenant"] == "acme" and not r["estimated"]
        assert r["api"] == "messages"  # the record names the client API
        assert r["system"] + r["history"] + r["new"] + r["tools"] == r["prompt_total"]


def test_anthropic_count_tokens_and_errors(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    body = {"model": "chat-model", "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there"}]}
    counted = client.messages.count_tokens(**body)  # type: ignore[arg-type]
    made = client.messages.create(max_tokens=1, **body)  # type: ignore[arg-type]
    assert counted.input_tokens == made.usage.input_tokens
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4,
                               messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key="sk-not-a-key-0123456789abcdef",
                            max_retries=0).messages.create(
            model="chat-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    bad = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": TEST_KEY},
                     json={"model": "chat-model", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in bad.json()["error"]["message"]
    # x-api-key works as well as a bearer token
    r = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": TEST_KEY,
                                                     "anthropic-version": "2023-06-01"},
                   json={"model": "chat-model", "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["type"] == "message"
    assert r.headers["x-request-id"]


def test_openai_responses_plain_and_streamed(gw: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    plain = client.responses.create(model="chat-model", input="Hello", instructions="Be brief.",
                                    max_output_tokens=7)
    assert plain.object == "response" and plain.model == "chat-model"
    assert plain.usage is not None and plain.usage.output_tokens == 7
    assert plain.output_text and plain.status == "incomplete"  # cut at max_output_tokens
    events = list(client.responses.create(model="chat-model", stream=True,
                                          input=[{"role": "user", "content": "Hi"}],
                                          max_output_tokens=4))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.usage is not None and last.response.usage.output_tokens == 4  # type: ignore[union-attr]
    one, two = records(gw, 2)
    assert one["output"] == 7 and two["output"] == 4
    assert one["api"] == two["api"] == "responses"
    assert one["system"] > 0  # the instructions are the system part
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-wrong-0123456789abcdef",
                      max_retries=0).responses.create(model="chat-model", input="x")
    # an item chat cannot carry: refused by the gateway (before admission) when translated,
    # by the backend when passed through as sent
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="chat-model", input=[{"type": "nonsense"}])  # type: ignore[list-item]


WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def test_anthropic_tool_use_round_trip(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"],
              "input_schema": WEATHER["parameters"]}]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(model="chat-model", max_tokens=64, tools=tools,  # type: ignore[arg-type]
                                   messages=ask)  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "sim"}
    turns = [*ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                           "content": "Sunny, 21C"}]}]
    with client.messages.stream(model="chat-model", max_tokens=6, tools=tools,  # type: ignore[arg-type]
                                messages=turns) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.usage.output_tokens == 6
    _, second = records(gw, 2)
    assert second["history"] > 0 and second["tools"] > 0


def test_openai_responses_function_call_round_trip_and_stream_helper(gw: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    tools = [{"type": "function", **WEATHER}]
    first = client.responses.create(model="chat-model", input="Weather in Paris?",
                                    tools=tools)  # type: ignore[arg-type]
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "sim"}
    follow = [{"role": "user", "content": "Weather in Paris?"},
              {"type": "function_call", "call_id": call.call_id, "name": call.name,
               "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}]
    with client.responses.stream(model="chat-model", input=follow,  # type: ignore[arg-type]
                                 tools=tools) as stream:  # type: ignore[arg-type]
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == text and text
    assert final.usage is not None and final.usage.output_tokens > 0
    _, second = records(gw, 2)
    assert second["history"] > 0 and second["output"] == final.usage.output_tokens


def test_openai_agents_sdk_runs_a_tool_agent_to_completion(gw: GatewayProcess) -> None:
    """The openai-agents SDK's default model (Responses) through the gateway: the agent calls
    its function tool, gets the result, and answers."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    model = OpenAIResponsesModel(model="chat-model", openai_client=openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0))
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                  model=model)
    result = asyncio.run(Runner.run(agent, "Weather in Paris?"))
    assert calls == ["sim"]
    assert isinstance(result.final_output, str) and result.final_output


def test_the_backend_saw_its_own_api_or_chat(gw: GatewayProcess) -> None:
    """Passed through, the simulator served /v1/messages and /v1/responses itself; translated,
    it saw chat completions only (run after the tests above, on the same gateway)."""
    apis = httpx.get(gw.sim.url + "/sim/stats").json()["apis"]  # type: ignore[attr-defined]
    native = sum(apis.get(name, {}).get("requests", 0) for name in ("messages", "responses"))
    if gw.mode == "passthrough":  # type: ignore[attr-defined]
        assert native > 0
    else:
        assert native == 0 and apis["chat"]["requests"] > 0
