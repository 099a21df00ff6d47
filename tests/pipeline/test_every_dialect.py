"""Every client API through the in-process pipeline, whole and streamed, translated to chat and
passed through: the answer in the client's shape with the public model name, exactly one usage
record with the API, the tenant and the token buckets filled, and errors in the client's shape.

This pins what the pipeline does for each dialect, whatever the pipeline's own structure.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app.state import Gateway
from gateway.dialects.shape import ENDPOINTS
from gateway.pipeline import Inbound
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, policy
from tests.pipeline.common import Answer, records, running

SYSTEM = "You are terse."


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=50, jitter=0.0) as server:
        yield server


@pytest.fixture(params=["translated", "native"])
async def gateway(request: pytest.FixtureRequest, sim: SimServer,
                  tmp_path: Path) -> AsyncIterator[Gateway]:
    data = policy({"chat": [sim.url]})
    if request.param == "native":  # the backend speaks Messages and Responses: passed through
        data["pools"][0]["backends"][0]["api"] = ["messages", "responses"]
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 1000, "tpm": 1_000_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": "1", "output": "2"}}}
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    async with running(data) as gw:
        yield gw


def _inbound(path: str, body: dict[str, Any]) -> Inbound:
    raw = json.dumps(body).encode()

    async def read(limit: int) -> bytes:
        return raw

    headers = [(b"authorization", f"Bearer {TEST_KEY}".encode())]
    return Inbound(method="POST", endpoint=ENDPOINTS[path], headers=headers, read_body=read)






def _history() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"}]


#: path -> (api on the record, a request, streams, whether it splits system and history)
CASES: dict[str, tuple[str, dict[str, Any], bool, bool]] = {
    "/v1/chat/completions": ("chat", {
        "model": "chat-model", "max_tokens": 8,
        "messages": [{"role": "system", "content": SYSTEM}, *_history()]}, True, True),
    "/v1/completions": ("completions", {
        "model": "chat-model", "max_tokens": 8, "prompt": "Once upon a time"}, True, False),
    "/v1/embeddings": ("embeddings", {"model": "chat-model", "input": "embed me"}, False,
                       False),
    "/v1/messages": ("messages", {
        "model": "chat-model", "max_tokens": 8, "system": SYSTEM, "messages": _history()},
        True, True),
    "/v1/responses": ("responses", {
        "model": "chat-model", "max_output_tokens": 16, "instructions": SYSTEM,
        "input": _history(), "store": False}, True, True),
}


def _answer_model(path: str, answer: Answer, stream: bool) -> set[str]:
    """The model names the client saw."""
    if not stream:
        return {answer.json()["model"]}
    names = set()
    for event in answer.events():
        for holder in (event, event.get("message") or {}, event.get("response") or {}):
            if isinstance(holder, dict) and "model" in holder:
                names.add(holder["model"])
    return names


@pytest.mark.parametrize("path", list(CASES))
@pytest.mark.parametrize("stream", [False, True])
async def test_each_api_answers_in_its_shape_and_leaves_one_record(
        gateway: Gateway, path: str, stream: bool) -> None:
    api, body, streams, splits = CASES[path]
    if stream and not streams:
        pytest.skip("the API does not stream")
    answer = Answer()
    await gateway.pipeline.run(_inbound(path, {**body, "stream": stream}), answer)
    assert answer.status == 200, answer.body[:300]
    if api != "embeddings":
        assert _answer_model(path, answer, stream) == {"chat-model"}  # the public name
    assert answer.headers[b"x-gateway-pool"] == b"chat"
    written = await records(gateway)
    assert len(written) == 1
    record = written[0]
    assert (record.api, record.tenant, record.model) == (api, "acme", "chat-model")
    assert record.outcome == "completed" and record.status == 200 and record.delivered
    assert record.prompt_total > 0
    assert record.system + record.history + record.new + record.tools == record.prompt_total
    if splits:
        assert record.system > 0 and record.history > 0
    if api != "embeddings":
        assert record.output > 0
    assert record.cost_micros > 0


@pytest.mark.parametrize("path", list(CASES))
async def test_each_api_refuses_in_its_shape(gateway: Gateway, path: str) -> None:
    """An unknown model: 404 in the client's error shape, refused before admission (no
    record)."""
    api, body, _, _ = CASES[path]
    answer = Answer()
    await gateway.pipeline.run(_inbound(path, {**body, "model": "no-such-model"}), answer)
    assert answer.status == 404
    error = answer.json()
    if api == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
    else:
        assert error["error"]["code"] == "model_not_found"
    assert await records(gateway) == []


async def test_a_stored_response_is_continued_as_history(gateway: Gateway) -> None:
    """Responses' conversation state: a stored answer continued by ``previous_response_id``
    counts its turns as history on the second record."""
    first = Answer()
    await gateway.pipeline.run(_inbound("/v1/responses", {
        "model": "chat-model", "max_output_tokens": 16, "input": "remember the number 7"}),
        first)
    assert first.status == 200, first.body[:300]
    second = Answer()
    await gateway.pipeline.run(_inbound("/v1/responses", {
        "model": "chat-model", "max_output_tokens": 16, "input": "which number?",
        "previous_response_id": first.json()["id"]}), second)
    assert second.status == 200, second.body[:300]
    both = sorted(await records(gateway), key=lambda r: r.ts_ms)
    assert [r.api for r in both] == ["responses", "responses"]
    assert both[0].history == 0 and both[1].history > 0


@pytest.mark.parametrize(("path", "status"), [("/v1/messages", 200),
                                              ("/v1/chat/completions", 401)])
async def test_only_messages_takes_the_key_in_x_api_key(gateway: Gateway, path: str,
                                                         status: int) -> None:
    """Anthropic's clients send the key in ``x-api-key``: the Messages dialect reads it there;
    the other APIs read ``Authorization`` only."""
    _, body, _, _ = CASES[path]
    raw = json.dumps(body).encode()

    async def read(limit: int) -> bytes:
        return raw

    answer = Answer()
    await gateway.pipeline.run(Inbound(
        method="POST", endpoint=ENDPOINTS[path], read_body=read,
        headers=[(b"x-api-key", TEST_KEY.encode())]), answer)
    assert answer.status == status, answer.body[:300]
