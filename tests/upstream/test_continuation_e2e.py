"""A stream that survives its engine, through a real gateway process and two simulators.

Backend ``faulty`` (weight 1, never ejected) breaks every stream after N tokens
(``disconnect_after``, set per case); ``good`` (weight 0.01) is picked only when ``faulty`` is
excluded. The simulator continues a final assistant message from the same seed, so a
continued answer must be exactly the answer of an unbroken stream: for every break point the
official client gets one whole answer (no error, no duplicated or missing text at the seam,
one id, the public model), and one usage record with the output the client received and
``continued`` true. With ``continuation`` off the same break ends with today's error event.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.sim.faults import FaultConfig
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

ADMIN = "admin-continuation-e2e"
TOKENS = 8
MESSAGES = [{"role": "user", "content": "tell me something"}]


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimServer, SimServer]]:
    with (SimServer("interactive", speedup=20, jitter=0.0) as faulty,
          SimServer("interactive", speedup=20, jitter=0.0) as good):
        yield faulty, good


def _policy(faulty: SimServer, good: SimServer, *, enabled: bool) -> dict[str, Any]:
    data = policy({"chat": [faulty.url, good.url]})
    pool = data["pools"][0]
    pool["backends"][0]["name"], pool["backends"][1]["name"] = "faulty", "good"
    pool["backends"][1]["weight"] = 0.01
    pool["health"] = {"eject_after": 1000}
    pool["continuation"] = {"enabled": enabled, "max_attempts": 1, "max_output_tokens": 4096}
    return data


@pytest.fixture(scope="module", params=["native", "aiohttp"])
def gateway(sims: tuple[SimServer, SimServer], request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = _policy(*sims, enabled=True)
    data["server"]["upstream_client"] = request.param
    yield from _started(tmp_path_factory.mktemp("continuation"), data)


def _started(tmp: Path, data: dict[str, Any]) -> Iterator[GatewayProcess]:
    os.environ["GATEWAY_ADMIN_TOKEN"] = ADMIN
    try:
        gw = GatewayProcess(tmp, data).start()
    finally:
        os.environ.pop("GATEWAY_ADMIN_TOKEN", None)
    try:
        yield gw
    finally:
        gw.stop()


def _break_after(sim: SimServer, tokens: int | None) -> None:
    """The simulator's streams break after ``tokens`` tokens (None: they do not)."""
    sim.app.config = dataclasses.replace(sim.app.config,
                                         faults=FaultConfig(disconnect_after=tokens))


def _fail_after(sim: SimServer, tokens: int | None) -> None:
    """The simulator's streams end after ``tokens`` tokens with an error event of the engine
    (None: they do not)."""
    sim.app.config = dataclasses.replace(sim.app.config,
                                         faults=FaultConfig(error_event_after=tokens))


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0, timeout=30)


def _record(gw: GatewayProcess, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        now = int(time.time() * 1000)
        r = httpx.get(gw.url + "/admin/usage/export", timeout=10,
                      headers={"Authorization": f"Bearer {ADMIN}"},
                      params={"start_ms": now - 3_600_000, "end_ms": now + 60_000})
        rows = [json.loads(line) for line in r.text.splitlines() if request_id in line]
        if rows:
            assert len(rows) == 1, rows  # one record, whatever the attempts
            row: dict[str, Any] = rows[0]
            return row
        assert time.monotonic() < deadline, f"no usage record for {request_id}"
        time.sleep(0.1)


def _stream(gw: GatewayProcess, **extra: Any) -> tuple[str, list[Any], str]:
    """(the text, the chunks, the request id) of one streamed answer."""
    stream = _client(gw).chat.completions.create(
        model="chat-model", max_tokens=TOKENS, stream=True, messages=MESSAGES, **extra)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks, stream.response.headers["x-request-id"]


def _whole(sims: tuple[SimServer, SimServer]) -> str:
    """The unbroken answer, from the simulator itself."""
    r = httpx.post(sims[1].url + "/v1/chat/completions", timeout=10, json={
        "model": "sim-model", "max_tokens": TOKENS, "messages": MESSAGES})
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


@pytest.mark.parametrize("usage", [False, True], ids=["no-usage", "include-usage"])
def test_a_stream_broken_at_every_token_is_continued_whole(
        gateway: GatewayProcess, sims: tuple[SimServer, SimServer], usage: bool) -> None:
    """Broken after each of its tokens, the stream goes on on the other backend: the client's
    text is the unbroken answer, its chunks one id and the public model, one role and one
    finish; the one record bills the output received and says ``continued``."""
    faulty, _ = sims
    whole = _whole(sims)
    assert len(whole.split()) == TOKENS
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
    try:
        for n in range(1, TOKENS):
            _break_after(faulty, n)
            text, chunks, request_id = _stream(gateway, **extra)
            assert text == whole, n
            assert {c.id for c in chunks} == {f"chatcmpl-{request_id}"}
            assert {c.model for c in chunks} == {"chat-model"}
            roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
            finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
            assert len(roles) == 1 and len(finishes) == 1, n
            assert finishes[0].choices[0].finish_reason == "length"
            assert (finishes[0].model_extra or {}).get("metadata") == \
                {"x-gateway-continued": "1"}
            if usage:
                assert chunks[-1].usage is not None
                assert chunks[-1].usage.completion_tokens == TOKENS
            record = _record(gateway, request_id)
            assert record["outcome"] == "completed" and record["continued"] is True, record
            assert record["backend"] == "good" and record["attempts"] == 2
            assert record["output"] == record["sent_output"] == TOKENS
            assert record["delivered"] is True
            # the continuation's prompt: the prompt again, plus the n tokens sent before
            assert record["continuation_prompt"] > record["prompt_total"] + n - 1
    finally:
        _break_after(faulty, None)


def test_an_unbroken_stream_is_not_marked(gateway: GatewayProcess,
                                          sims: tuple[SimServer, SimServer]) -> None:
    text, chunks, request_id = _stream(gateway)
    assert text == _whole(sims)
    assert all(not (c.model_extra or {}).get("metadata") for c in chunks)
    record = _record(gateway, request_id)
    assert record["continued"] is False and record["continuation_prompt"] == 0
    assert record["backend"] == "faulty" and record["attempts"] == 1


def test_without_continuation_the_break_ends_with_the_error_event(
        sims: tuple[SimServer, SimServer], tmp_path: Path) -> None:
    """Continuation off (the default): the same break ends the stream with an error event;
    the record bills what was sent, not continued."""
    faulty, good = sims
    for gw in _started(tmp_path, _policy(faulty, good, enabled=False)):
        _break_after(faulty, 3)
        try:
            stream = _client(gw).chat.completions.create(
                model="chat-model", max_tokens=TOKENS, stream=True, messages=MESSAGES)
            request_id = stream.response.headers["x-request-id"]
            text = ""
            with pytest.raises(openai.APIError) as err:
                for chunk in stream:
                    text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        finally:
            _break_after(faulty, None)
        assert isinstance(err.value.body, dict) and err.value.body["code"] == "backend_error"
        assert len(text.split()) == 3
        record = _record(gw, request_id)
        assert record["outcome"] == "failed" and record["continued"] is False
        assert record["backend"] == "faulty"


@pytest.mark.parametrize(("pool_on", "model_on"), [(False, True), (True, False)],
                         ids=["model-on-pool-off", "model-off-pool-on"])
def test_the_models_setting_takes_the_place_of_the_pools(
        sims: tuple[SimServer, SimServer], tmp_path: Path, pool_on: bool,
        model_on: bool) -> None:
    """``models[].continuation`` decides for its model, whatever its pool says: on, the break
    is continued whole; off, it ends with the error event."""
    faulty, good = sims
    data = _policy(faulty, good, enabled=pool_on)
    data["models"][0]["continuation"] = {"enabled": model_on, "max_attempts": 1}
    whole = _whole(sims)
    for gw in _started(tmp_path, data):
        _break_after(faulty, 3)
        try:
            if model_on:
                text, _, request_id = _stream(gw)
                assert text == whole
            else:
                stream = _client(gw).chat.completions.create(
                    model="chat-model", max_tokens=TOKENS, stream=True, messages=MESSAGES)
                request_id = stream.response.headers["x-request-id"]
                with pytest.raises(openai.APIError):
                    for _ in stream:
                        pass
        finally:
            _break_after(faulty, None)
        assert _record(gw, request_id)["continued"] is model_on


def test_an_engines_error_event_mid_stream_is_continued(
        gateway: GatewayProcess, sims: tuple[SimServer, SimServer]) -> None:
    """An engine that fails mid-generation ends its stream with an error event of its own: the
    client never sees it; the stream goes on on the other backend, whole, one record."""
    faulty, _ = sims
    whole = _whole(sims)
    _fail_after(faulty, 3)
    try:
        text, chunks, request_id = _stream(gateway)
    finally:
        _fail_after(faulty, None)
    assert text == whole
    assert not any("error" in (c.model_extra or {}) for c in chunks)
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["outcome"] == "completed", record
    assert record["backend"] == "good" and record["output"] == TOKENS


def _events(gw: GatewayProcess, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                          str]:
    """The data of each SSE event of a streamed answer in another API, and the request id."""
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    with httpx.stream("POST", gw.url + path, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        data = [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]
        return data, r.headers["x-request-id"]


def test_a_translated_messages_stream_is_continued(
        gateway: GatewayProcess, sims: tuple[SimServer, SimServer]) -> None:
    """A Messages stream (translated to chat): the continued chat chunks are re-encoded in
    order, one message with the whole text and one ``message_stop``."""
    faulty, _ = sims
    whole = _whole(sims)
    _break_after(faulty, 3)
    try:
        events, request_id = _events(gateway, "/v1/messages", {
            "model": "chat-model", "max_tokens": TOKENS, "stream": True, "messages": MESSAGES})
    finally:
        _break_after(faulty, None)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and kinds.count("message_start") == 1
    assert kinds.count("message_stop") == 1 and kinds[-1] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events
                   if e["type"] == "content_block_delta")
    assert text == whole
    [stop] = [e for e in events if e["type"] == "message_delta"]
    assert stop["usage"]["output_tokens"] == TOKENS
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["output"] == TOKENS
    assert record["api"] == "messages"


def test_a_translated_responses_stream_is_continued(
        gateway: GatewayProcess, sims: tuple[SimServer, SimServer]) -> None:
    """A Responses stream: the whole text, ``sequence_number`` strictly increasing across
    the seam, one terminal event."""
    faulty, _ = sims
    whole = _whole(sims)
    _break_after(faulty, 4)
    try:
        events, request_id = _events(gateway, "/v1/responses", {
            "model": "chat-model", "max_output_tokens": TOKENS, "stream": True,
            "input": MESSAGES[0]["content"], "store": False})
    finally:
        _break_after(faulty, None)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and "response.failed" not in kinds
    # one terminal event: ``incomplete``, as the answer stopped at its output limit
    assert kinds.count("response.incomplete") == 1 and kinds[-1] == "response.incomplete"
    assert events[-1]["response"]["usage"]["output_tokens"] == TOKENS
    numbers = [e["sequence_number"] for e in events]
    assert numbers == sorted(set(numbers))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["output"] == TOKENS


def test_a_broken_tool_call_is_not_continued(gateway: GatewayProcess,
                                             sims: tuple[SimServer, SimServer]) -> None:
    """A stream carrying a tool call is not continued (its arguments cannot be): the error
    event ends it, as without continuation."""
    faulty, _ = sims
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    _break_after(faulty, 1)  # the call's name is out, its arguments are not
    try:
        stream = _client(gateway).chat.completions.create(
            model="chat-model", max_tokens=64, stream=True, messages=MESSAGES,
            tools=tools)  # type: ignore[arg-type]
        request_id = stream.response.headers["x-request-id"]
        with pytest.raises(openai.APIError) as err:
            list(stream)
    finally:
        _break_after(faulty, None)
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "backend_error"
    record = _record(gateway, request_id)
    assert record["outcome"] == "failed" and record["continued"] is False
