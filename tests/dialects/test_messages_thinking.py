"""An engine's reasoning reaches a Messages client as thinking when the request asks for it:
a ``thinking`` block before the text (whole), ``thinking_delta`` events (streamed); hidden
otherwise (and with ``display: omitted``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.dialects.messages import MessagesFrontend
from gateway.dialects.messages.answer import shows_thinking

FRONT = MessagesFrontend()
CHAT = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
    "role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France."}}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 7,
              "completion_tokens_details": {"reasoning_tokens": 5}}}


@pytest.mark.parametrize(("thinking", "shown"), [
    ({"type": "enabled", "budget_tokens": 2048}, True),
    ({"type": "adaptive"}, True),
    ({"type": "adaptive", "display": "omitted"}, False),
    ({"type": "disabled"}, False),
    (None, False),
])
def test_whole_answer_thinking_block(thinking: dict[str, Any] | None, shown: bool) -> None:
    request = {"model": "m", "max_tokens": 64, "messages": []}
    if thinking is not None:
        request["thinking"] = thinking
    assert shows_thinking(request) is shown
    message = FRONT.answer(CHAT, model="m", request_id="r1", request=request)
    kinds = [b["type"] for b in message["content"]]
    assert kinds == (["thinking", "text"] if shown else ["text"])
    if shown:
        assert message["content"][0]["thinking"] == "The capital of France."
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] == 7


def _events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in data.decode().splitlines()
            if line.startswith("data: ")]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_streamed_reasoning_is_thinking_deltas_before_the_text(field: str) -> None:
    stream = FRONT.stream(model="m", request_id="r2", prompt_tokens=9,
                          request={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {field: "Think"}}]},
        {"choices": [{"index": 0, "delta": {field: "ing."}}]},
        {"choices": [{"index": 0, "delta": {"content": "Paris."}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    out = stream.feed(raw + b"data: [DONE]\n\n")
    events = _events(out)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert events[1]["content_block"]["type"] == "thinking"
    assert kinds[2] == "ping"
    thinking = [e["delta"]["thinking"] for e in events
                if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta"]
    assert "".join(thinking) == "Thinking."
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert kinds[-2:] == ["message_delta", "message_stop"]


def test_streamed_reasoning_is_hidden_without_thinking() -> None:
    stream = FRONT.stream(model="m", request_id="r3", prompt_tokens=9, request={})
    raw = (b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"secret"}}]}\n\n'
           b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}'
           b"\n\ndata: [DONE]\n\n")
    events = _events(stream.feed(raw))
    assert [e["content_block"]["type"] for e in events
            if e["type"] == "content_block_start"] == ["text"]
    assert b"secret" not in json.dumps(events).encode()
