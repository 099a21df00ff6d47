"""A Messages stream passed through (the pool's backends speak Anthropic's API) survives its
engine: through a real gateway process, the official ``anthropic`` client, and two scripted
backends (``scripted_backend.py``) that honour a final assistant turn as a prefill.

``faulty`` breaks its streams after N events (its connection closed, or Anthropic's ``error``
event): for N from just after ``message_start`` (no text yet) through the text block (a
prefix ending in a line break among them) to just after its ``content_block_stop`` (the
continuation's block then takes the next index) the client gets one message holding the
whole text, one ``message_start``, one ``message_stop``, content block indexes 0, 1, ... in
order, the continuation's ``stop_reason``, and a usage whose output is what it received; one
usage record says ``continued``. A Responses stream passed through is not continued (that
API has no prefill): its break ends with the error event, as without continuation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from gateway.sim.faults import FaultConfig
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.upstream.scripted_backend import WORDS, ScriptedBackend, whole
from tests.upstream.test_continuation_e2e import _record, _started

pytestmark = pytest.mark.process

#: the faulty stream's events: message_start, content_block_start, ping, a delta a word,
#: content_block_stop, message_delta, message_stop
STOP = 3 + len(WORDS)  # the events up to the last delta; +1: the block's stop
#: the text up to and including ".\n" (a prefix that ends in whitespace)
NEWLINE = 3 + WORDS.index(".\n") + 1


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[ScriptedBackend, ScriptedBackend]]:
    with ScriptedBackend() as faulty, ScriptedBackend() as good:
        yield faulty, good


def _policy(urls: list[str], apis: list[str], *, enabled: bool = True) -> dict[str, Any]:
    data = policy({"chat": urls})
    pool = data["pools"][0]
    pool["backends"][0]["name"], pool["backends"][1]["name"] = "faulty", "good"
    pool["backends"][1]["weight"] = 0.01
    for backend in pool["backends"]:
        backend["api"] = apis
    pool["health"] = {"eject_after": 1000}
    pool["continuation"] = {"enabled": enabled, "max_attempts": 1}
    return data


@pytest.fixture(scope="module", params=["native", "aiohttp"])
def gateway(backends: tuple[ScriptedBackend, ScriptedBackend], request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = _policy([b.url for b in backends], ["messages"])
    data["server"]["upstream_client"] = request.param
    yield from _started(tmp_path_factory.mktemp("messages"), data)


def _client(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0, timeout=30)


def _stream(gw: GatewayProcess, **extra: Any) -> tuple[list[Any], Any, str]:
    """(the events, the message the SDK accumulated, the request id) of one stream."""
    with _client(gw).messages.stream(
            model="chat-model", max_tokens=64,
            messages=[{"role": "user", "content": "say it"}], **extra) as stream:
        events = list(stream)
        message = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    return events, message, request_id


def _check(events: list[Any], message: Any) -> None:
    """One message: one start and one stop, block indexes from 0 in order (each started once,
    stopped once), the whole text, the continuation's stop reason."""
    kinds = [e.type for e in events]
    assert "error" not in kinds
    assert kinds.count("message_start") == 1 and kinds[0] == "message_start"
    assert kinds.count("message_stop") == 1 and kinds[-1] == "message_stop"
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(starts))) and starts
    current = -1
    for event in events:  # every delta in the block opened last, never a closed one
        if event.type == "content_block_start":
            current = event.index
        elif event.type == "content_block_delta":
            assert event.index == current
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text == whole()
    assert message.stop_reason == "end_turn"
    assert [e.type for e in events].count("message_delta") == 1


@pytest.mark.parametrize("fault", ["abort", "error"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, NEWLINE, STOP, STOP + 1])
def test_a_passed_through_messages_stream_is_continued(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend],
        n: int, fault: str) -> None:
    faulty, good = backends
    faulty.fault = (fault, n) if fault == "abort" else (fault, n, 0)
    seen = len(good.requests)
    try:
        events, message, request_id = _stream(gateway)
    finally:
        faulty.fault = None
    _check(events, message)
    assert message.id == f"msg_{request_id}" and message.model == "chat-model"
    # the continuation was asked with the text sent as a prefill, and the limit left
    [asked] = good.requests[seen:]
    sent = "".join(WORDS[:max(0, min(n, STOP) - 3)])
    if sent:
        assert asked["messages"][-1] == {"role": "assistant", "content": sent.rstrip()}
    else:
        assert asked["messages"] == [{"role": "user", "content": "say it"}]
    tokens_sent = max(0, min(n, STOP) - 3)
    assert asked["max_tokens"] == 64 - tokens_sent
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["outcome"] == "completed", record
    assert record["backend"] == "good" and record["attempts"] == 2
    assert record["api"] == "messages"
    # the output billed is the client's: the tokens sent before plus the continuation's (the
    # line break that ended the prefix is written again by it)
    assert record["output"] == record["sent_output"] == message.usage.output_tokens
    assert message.usage.output_tokens == len(WORDS) + (n == NEWLINE)
    assert message.usage.input_tokens == 12  # the original prompt's, not the continuation's
    assert record["continuation_prompt"] == 12 + len(sent.split())


def test_an_unbroken_messages_stream_is_not_marked(gateway: GatewayProcess) -> None:
    events, message, request_id = _stream(gateway)
    _check(events, message)
    assert message.usage.output_tokens == len(WORDS)
    record = _record(gateway, request_id)
    assert record["continued"] is False and record["backend"] == "faulty"


def test_a_break_after_the_message_delta_is_not_continued(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend]) -> None:
    """The answer had ended (its stop reason sent): nothing to continue, the error event."""
    faulty, _ = backends
    faulty.fault = ("abort", STOP + 2)
    try:
        with pytest.raises(anthropic.APIError), _client(gateway).messages.stream(
                model="chat-model", max_tokens=64,
                messages=[{"role": "user", "content": "say it"}]) as stream:
            request_id = stream.response.headers["x-request-id"]
            for _ in stream:
                pass
    finally:
        faulty.fault = None
    assert _record(gateway, request_id)["continued"] is False


def test_a_request_with_its_own_prefill_is_continued_after_it(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend]) -> None:
    """The client's own final assistant turn: the continuation's prefill is it plus the text
    streamed after it."""
    faulty, good = backends
    faulty.fault = ("abort", 6)
    seen = len(good.requests)
    try:
        with _client(gateway).messages.stream(
                model="chat-model", max_tokens=64,
                messages=[{"role": "user", "content": "say it"},
                          {"role": "assistant", "content": "Hello"}]) as stream:
            text = "".join(stream.text_stream)
    finally:
        faulty.fault = None
    assert "Hello" + text == whole()
    [asked] = good.requests[seen:]
    assert asked["messages"][-1] == {"role": "assistant", "content": "".join(WORDS[:4])}


def _sse(gw: GatewayProcess, path: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                       str]:
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    with httpx.stream("POST", gw.url + path, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
        return data, r.headers["x-request-id"]


def test_a_passed_through_responses_stream_is_not_continued(tmp_path: Path) -> None:
    """Backends that speak Responses (the simulator): a stream broken after its first byte
    ends with the error event even with continuation on, one record, not continued."""
    with (SimServer("interactive", speedup=20, jitter=0.0) as faulty,
          SimServer("interactive", speedup=20, jitter=0.0) as good):
        faulty.app.config = dataclasses.replace(faulty.app.config,
                                                faults=FaultConfig(disconnect_after=3))
        data = _policy([faulty.url, good.url], ["responses"])
        for gw in _started(tmp_path, data):
            events, request_id = _sse(gw, "/v1/responses", {
                "model": "chat-model", "max_output_tokens": 8, "stream": True,
                "input": "tell me something", "store": False})
            kinds = [e["type"] for e in events]
            assert kinds[-1] == "error" and "response.completed" not in kinds
            assert any(k == "response.output_text.delta" for k in kinds)
            record = _record(gw, request_id)
            assert record["continued"] is False and record["outcome"] == "failed"
            assert record["backend"] == "faulty" and record["api"] == "responses"
            assert record["attempts"] == 1
