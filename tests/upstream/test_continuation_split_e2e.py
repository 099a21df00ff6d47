"""An engine's error event split across two reads is still the break it is: through a real
gateway process and two scripted backends (``scripted_backend.py``), the event's first bytes
ride in the read of the last good event, the rest in the next; wherever the cut falls (inside
``data:``, inside ``"error"``, after the key, inside the message) the client gets the whole
answer (no error, nothing of the event, nothing repeated) and one record says ``continued``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.upstream.scripted_backend import CHAT_ERROR, WORDS, ScriptedBackend, whole
from tests.upstream.test_continuation_e2e import _record, _started

pytestmark = pytest.mark.process

#: the events before the error: the role chunk and three words
BEFORE = 4
#: where the error event is cut: none (all in the next read), inside ``data:``, after it,
#: inside ``"error"``, after the key, after its colon, inside the message, before its end
SPLITS = [0, 1, 3, 5, 6, 7, 9, 12, 14, 15, 16, 40, len(CHAT_ERROR) - 1]


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[ScriptedBackend, ScriptedBackend]]:
    with ScriptedBackend() as faulty, ScriptedBackend() as good:
        yield faulty, good


def _policy(faulty: ScriptedBackend, good: ScriptedBackend) -> dict[str, Any]:
    data = policy({"chat": [faulty.url, good.url]})
    pool = data["pools"][0]
    pool["backends"][0]["name"], pool["backends"][1]["name"] = "faulty", "good"
    pool["backends"][1]["weight"] = 0.01
    pool["health"] = {"eject_after": 1000}
    pool["continuation"] = {"enabled": True, "max_attempts": 1}
    return data


@pytest.fixture(scope="module", params=["native", "aiohttp"])
def gateway(backends: tuple[ScriptedBackend, ScriptedBackend], request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = _policy(*backends)
    data["server"]["upstream_client"] = request.param
    yield from _started(tmp_path_factory.mktemp("split"), data)


@pytest.mark.parametrize("usage", [False, True], ids=["no-usage", "include-usage"])
@pytest.mark.parametrize("split", SPLITS)
def test_an_error_event_split_across_reads_is_continued(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend],
        split: int, usage: bool) -> None:
    faulty, _ = backends
    faulty.fault = ("error", BEFORE, split)
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TEST_KEY,
                               max_retries=0, timeout=30)
        stream = client.chat.completions.create(
            model="chat-model", max_tokens=64, stream=True,
            messages=[{"role": "user", "content": "say it"}], **extra)
        chunks = list(stream)
        request_id = stream.response.headers["x-request-id"]
    finally:
        faulty.fault = None
    assert not any("error" in (c.model_extra or {}) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole()
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(roles) == 1 and len(finishes) == 1
    if usage:
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == len(WORDS)
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["outcome"] == "completed", record
    assert record["backend"] == "good" and record["attempts"] == 2
    assert record["output"] == record["sent_output"] == len(WORDS)


@pytest.mark.parametrize("split", [7, 14])
def test_a_translated_stream_is_continued_past_a_split_error_event(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend],
        split: int) -> None:
    """A Messages client, translated to chat: the engine's error event is found in the chat
    bytes, before the translator reads them, so the translator never ends the message with
    an error: one message, the whole text, one record ``continued``."""
    faulty, _ = backends
    faulty.fault = ("error", BEFORE, split)
    try:
        client = anthropic.Anthropic(base_url=gateway.url, api_key=TEST_KEY, max_retries=0,
                                     timeout=30)
        with client.messages.stream(model="chat-model", max_tokens=64,
                                    messages=[{"role": "user", "content": "say it"}]) as stream:
            kinds = [event.type for event in stream]
            message = stream.get_final_message()
            request_id = stream.response.headers["x-request-id"]
    finally:
        faulty.fault = None
    assert "error" not in kinds and kinds.count("message_stop") == 1
    assert "".join(b.text for b in message.content if b.type == "text") == whole()
    assert message.usage.output_tokens == len(WORDS)
    record = _record(gateway, request_id)
    assert record["continued"] is True and record["api"] == "messages"


def test_a_translated_responses_stream_is_continued_past_a_split_error_event(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend]) -> None:
    faulty, _ = backends
    faulty.fault = ("error", BEFORE, 12)
    try:
        headers = {"Authorization": f"Bearer {TEST_KEY}"}
        with httpx.stream("POST", gateway.url + "/v1/responses", headers=headers, timeout=30,
                          json={"model": "chat-model", "max_output_tokens": 64,
                                "stream": True, "input": "say it", "store": False}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ")]
            request_id = r.headers["x-request-id"]
    finally:
        faulty.fault = None
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole()
    assert _record(gateway, request_id)["continued"] is True


def test_without_continuation_the_split_error_event_reaches_the_client(
        backends: tuple[ScriptedBackend, ScriptedBackend], tmp_path: Path) -> None:
    """The same stream on a pool without continuation: relayed as the engine wrote it (the
    error event whole at the client, after the three words), not continued."""
    faulty, good = backends
    data = _policy(faulty, good)
    data["pools"][0]["continuation"] = {"enabled": False}
    for gw in _started(tmp_path, data):
        faulty.fault = ("error", BEFORE, 9)
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0,
                                   timeout=30)
            stream = client.chat.completions.create(
                model="chat-model", max_tokens=64, stream=True,
                messages=[{"role": "user", "content": "say it"}])
            text = ""
            with pytest.raises(openai.APIError):
                for chunk in stream:
                    text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            request_id = stream.response.headers["x-request-id"]
        finally:
            faulty.fault = None
        assert text == "".join(WORDS[:BEFORE - 1])
        assert _record(gw, request_id)["continued"] is False


def _chat_stream(gw: GatewayProcess, **extra: Any) -> tuple[str, str]:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0,
                           timeout=30)
    stream = client.chat.completions.create(
        model="chat-model", max_tokens=64, stream=True,
        messages=[{"role": "user", "content": "say it"}], **extra)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    return text, stream.response.headers["x-request-id"]


def test_a_break_inside_an_event_the_client_never_got_is_continued(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend]) -> None:
    """The stream breaks 30 bytes into an event. A chat client that did not ask for usage
    gets whole events only (the gateway strips the usage it asked for), so it got nothing of
    that event: continued, and the start the gateway held is not read as part of the
    continuation's first event (no text lost at the seam). So for a translated client."""
    faulty, _ = backends
    faulty.fault = ("cut", BEFORE, 30)
    try:
        text, request_id = _chat_stream(gateway)
        with anthropic.Anthropic(base_url=gateway.url, api_key=TEST_KEY, max_retries=0,
                                 timeout=30).messages.stream(
                model="chat-model", max_tokens=64,
                messages=[{"role": "user", "content": "say it"}]) as stream:
            translated = "".join(stream.text_stream)
            translated_id = stream.response.headers["x-request-id"]
    finally:
        faulty.fault = None
    assert text == translated == whole()
    assert _record(gateway, request_id)["continued"] is True
    assert _record(gateway, translated_id)["continued"] is True


def test_a_break_inside_an_event_the_client_holds_part_of_is_not_continued(
        gateway: GatewayProcess, backends: tuple[ScriptedBackend, ScriptedBackend]) -> None:
    """With ``include_usage`` the chunks go out as received: the client holds the start of
    the broken event, which no continuation can finish: not continued, as before."""
    faulty, _ = backends
    faulty.fault = ("cut", BEFORE, 30)
    try:
        headers = {"Authorization": f"Bearer {TEST_KEY}"}
        with httpx.stream("POST", gateway.url + "/v1/chat/completions", headers=headers,
                          timeout=30, json={
                              "model": "chat-model", "max_tokens": 64, "stream": True,
                              "stream_options": {"include_usage": True},
                              "messages": [{"role": "user", "content": "say it"}]}) as r:
            body = r.read()
            request_id = r.headers["x-request-id"]
    finally:
        faulty.fault = None
    assert b'"error"' in body and b"[DONE]" not in body
    record = _record(gateway, request_id)
    assert record["continued"] is False and record["outcome"] == "failed"
