"""Stored responses through a real gateway with the official openai client: three turns chained
by ``previous_response_id`` (the re-sent turns counted as history on their own line),
``responses.retrieve`` / ``.delete`` / ``.input_items.list``, another tenant's 404 on all of
them, ``store=False``, and expiry. Against the simulator as a chat backend (translated) and as
one that speaks Responses (the first turn passes through; a continued turn is translated, since
only the gateway knows its stored conversation)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, usage_records

pytestmark = pytest.mark.process

ADMIN = "admin-stored-e2e"
OTHER_KEY = "sk-gw-other-0123456789abcdef0123456789abcdef01"


def _policy(sim_url: str, tmp: Path, *, passthrough: bool = False, **store: Any
            ) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    if passthrough:
        data["pools"][0]["backends"][0]["api"] = ["responses"]
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                 "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
    data["plans"] = [{"name": "p", "limits": {"rpm": 10_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}, {"name": "globex", "plan": "p"}]
    data["store"] = {"data_dir": str(tmp / "data"), "spool_dir": str(tmp / "spool"), **store}
    return data


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=20, jitter=0.0) as server:
        yield server


@pytest.fixture(scope="module", params=["translated", "passthrough"])
def gw(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
       sim: SimServer) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("stored")
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        data = _policy(sim.url, tmp, passthrough=request.param == "passthrough")
        with GatewayProcess(tmp, data) as gateway:
            yield gateway
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)


def client(gw: GatewayProcess, key: str = TEST_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def records(gw: GatewayProcess, n: int) -> list[dict[str, Any]]:
    """The last ``n`` usage records (durable before each answer ends)."""
    return sorted(usage_records(gw.url, ADMIN), key=lambda x: x["ts_ms"])[-n:]


def test_three_turns_grow_history_on_its_own_line(gw: GatewayProcess) -> None:
    c = client(gw)
    first = c.responses.create(model="chat-model", input="My name is Ada.",
                               instructions="Be brief.", max_output_tokens=8)
    second = c.responses.create(model="chat-model", input="What is my name?",
                                previous_response_id=first.id, max_output_tokens=8)
    events = list(c.responses.create(model="chat-model", input="And again?", stream=True,
                                     previous_response_id=second.id, max_output_tokens=8))
    assert events[-1].type in ("response.completed", "response.incomplete")
    third = events[-1].response  # type: ignore[union-attr]
    assert third.previous_response_id == second.id and second.previous_response_id == first.id
    one, two, three = records(gw, 3)
    assert one["history"] == 0
    assert 0 < two["history"] < three["history"]  # the re-sent turns, growing
    # the new input is only what each turn sent: one short user message
    assert two["new"] == pytest.approx(three["new"], abs=3)
    for r in (one, two, three):
        assert r["outcome"] == "completed" and r["tenant"] == "acme"
        assert r["system"] + r["history"] + r["new"] + r["tools"] == r["prompt_total"]
    assert one["system"] > 0 and two["system"] == 0  # instructions are not carried over
    # the streamed third turn was stored too, from its final event
    assert c.responses.retrieve(third.id).output_text == third.output_text
    # and /v1/usage shows the history line
    usage = httpx.get(gw.url + "/v1/usage", params={"group_by": ""},
                      headers={"Authorization": f"Bearer {TEST_KEY}"})
    assert usage.status_code == 200, usage.text
    assert usage.json()["data"][0]["history"] >= two["history"] + three["history"]


def test_retrieve_input_items_delete(gw: GatewayProcess) -> None:
    c = client(gw)
    made = c.responses.create(
        model="chat-model", max_output_tokens=5, metadata={"k": "v"},
        input=[{"role": "developer", "content": "Answer in French."},
               {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
               {"role": "user", "content": "Again"}])
    got = c.responses.retrieve(made.id)
    assert isinstance(got, Response)
    assert got.id == made.id and got.output_text == made.output_text
    assert got.model_dump() == made.model_dump()  # the whole object, as the client got it
    assert got.model == "chat-model" and got.metadata == {"k": "v"}
    items = c.responses.input_items.list(made.id, order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["Answer in French.", "Hello", "Again"]
    assert [i.role for i in items.data] == ["developer", "user", "user"]  # type: ignore[union-attr]
    page = c.responses.input_items.list(made.id, limit=1)  # newest first by default
    assert [i.content[0].text for i in page.data] == ["Again"]  # type: ignore[union-attr]
    assert page.has_more
    rest = c.responses.input_items.list(made.id, limit=5, after=page.data[0].id)
    assert [i.content[0].text for i in rest.data] == ["Hello", "Answer in French."]  # type: ignore[union-attr]
    assert not rest.has_more
    deleted = c.responses.delete(made.id)
    assert deleted is None  # the SDK returns nothing; the raw answer is checked below
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(made.id)
    again = c.responses.create(model="chat-model", input="x", max_output_tokens=2)
    raw = httpx.delete(f"{gw.url}/v1/responses/{again.id}",
                       headers={"Authorization": f"Bearer {TEST_KEY}"})
    assert raw.status_code == 200
    assert raw.json() == {"id": again.id, "object": "response", "deleted": True}


def test_another_tenant_gets_not_found_everywhere(gw: GatewayProcess) -> None:
    made = client(gw).responses.create(model="chat-model", input="Secret", max_output_tokens=3)
    other = client(gw, OTHER_KEY)
    for call in (lambda: other.responses.retrieve(made.id),
                 lambda: other.responses.input_items.list(made.id),
                 lambda: other.responses.delete(made.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert made.id in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # OpenAI's 400, not a 404
        other.responses.create(model="chat-model", input="What was it?",
                               previous_response_id=made.id)
    assert err.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert err.value.code == "previous_response_not_found"  # type: ignore[attr-defined]
    # the owner still has it: the other tenant's delete did nothing
    assert client(gw).responses.retrieve(made.id).id == made.id
    # unauthenticated: 401, not a 404 that would say whether the id exists
    with pytest.raises(openai.AuthenticationError):
        client(gw, "sk-wrong-0123456789abcdef").responses.retrieve(made.id)


def test_store_false_is_not_kept_and_unknown_ids_are_not_found(gw: GatewayProcess) -> None:
    c = client(gw)
    made = c.responses.create(model="chat-model", input="Forget me", store=False,
                              max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="chat-model", input="x", previous_response_id=made.id)
    assert err.value.param == "previous_response_id"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_does_not_exist")
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    bad = httpx.get(f"{gw.url}/v1/responses/resp_x/input_items", params={"limit": "many"},
                    headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    wrong = httpx.post(f"{gw.url}/v1/responses/resp_x/input_items", headers=headers)
    assert wrong.status_code == 405


def test_expired_responses_are_gone(tmp_path: Path, sim: SimServer) -> None:
    """A TTL of about a second: retrievable right after, a 404 (retrieve and continue) once
    it has passed."""
    data = _policy(sim.url, tmp_path, responses_ttl_hours=1 / 3600)
    with GatewayProcess(tmp_path, data) as gateway:
        c = client(gateway)
        made = c.responses.create(model="chat-model", input="Soon gone", max_output_tokens=2)
        assert c.responses.retrieve(made.id).id == made.id
        deadline = time.monotonic() + 30
        while True:  # wait out the TTL on the gateway's clock
            try:
                c.responses.retrieve(made.id)
            except openai.NotFoundError:
                break
            assert time.monotonic() < deadline, "the response never expired"
            time.sleep(0.2)
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model="chat-model", input="x", previous_response_id=made.id)


def test_a_stream_is_stored_from_its_final_event(gw: GatewayProcess) -> None:
    """Translated or passed through, a streamed response is kept as its terminal event
    carried it (with the public model name), and continues like a whole one."""
    c = client(gw)
    events = list(c.responses.create(model="chat-model", input="Hi", stream=True,
                                     max_output_tokens=6))
    final = events[-1].response  # type: ignore[union-attr]
    got = c.responses.retrieve(final.id)
    assert got.output_text == final.output_text and got.model == "chat-model"
    assert got.usage is not None and got.usage.output_tokens == 6
    follow = c.responses.create(model="chat-model", input="More", previous_response_id=got.id,
                                max_output_tokens=3)
    assert follow.previous_response_id == got.id
    (record,) = records(gw, 1)
    assert record["history"] > 0


APPLY_PATCH: Any = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                    "format": {"type": "grammar", "syntax": "lark",
                               "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_custom_tool_call_is_continued_with_its_output(
        gw: GatewayProcess, request: pytest.FixtureRequest, stream: bool) -> None:
    """Codex's ``apply_patch`` translated: the stored response holds a ``custom_tool_call``
    (the simulator calls the chat function it became with ``{"input": "sim"}``), and a request
    continuing it with a ``custom_tool_call_output`` gets the call and its output to the
    backend and a text answer back. Passed through, the simulator never calls custom tools."""
    if request.node.callspec.params["gw"] == "passthrough":
        pytest.skip("the simulator's own Responses API never calls custom tools")
    c = client(gw)
    choice: Any = {"type": "custom", "name": "apply_patch"}
    if stream:
        events = list(c.responses.create(model="chat-model", input="Add a file.", stream=True,
                                         tools=[APPLY_PATCH], tool_choice=choice))
        assert events[-1].type == "response.completed"
        first = events[-1].response
    else:
        first = c.responses.create(model="chat-model", input="Add a file.",
                                   tools=[APPLY_PATCH], tool_choice=choice)
    (call,) = first.output
    assert call.type == "custom_tool_call" and (call.name, call.input) == ("apply_patch", "sim")
    stored = c.responses.retrieve(first.id)
    assert stored.output == first.output
    follow = c.responses.create(
        model="chat-model", previous_response_id=first.id, tools=[APPLY_PATCH],
        max_output_tokens=8, input=[{"type": "custom_tool_call_output",
                                     "call_id": call.call_id, "output": "Done!"}])
    # the simulator answers text after a tool result
    assert [item.type for item in follow.output] == ["message"] and follow.output_text
    assert follow.previous_response_id == first.id
    (record,) = records(gw, 1)
    assert record["history"] > 0  # the stored turn, with its call, re-sent
    items = c.responses.input_items.list(follow.id)
    assert [i.type for i in items.data] == ["custom_tool_call_output"]
    assert items.data[0].id.startswith("ctco_")  # type: ignore[union-attr]
