"""Real-shaped OpenAI SSE streams for the scanner tests."""

from __future__ import annotations

from typing import Any

import msgspec

HEAD = {
    "id": "chatcmpl-AbC",
    "object": "chat.completion.chunk",
    "created": 1730000000,
    "model": "gpt-4o-2024-08-06",
    "system_fingerprint": "fp_1",
}
USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 7,
    "total_tokens": 127,
    "prompt_tokens_details": {"cached_tokens": 64},
    "completion_tokens_details": {"reasoning_tokens": 0},
}


def event(obj: Any, newline: bytes = b"\n") -> bytes:
    return b"data: " + msgspec.json.encode(obj) + newline * 2


def chat_events(
    words: list[str], *, usage: str = "separate", newline: bytes = b"\n"
) -> tuple[list[bytes], int | None]:
    """Events of a chat stream with ``include_usage``: every chunk has ``"usage": null`` except
    the usage one. usage: "separate" (its own event, empty choices), "on-last" (on the finish
    chunk), or "none". Returns the events and the index of the usage-bearing event."""
    events = [
        event(
            {
                **HEAD,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                "usage": None,
            },
            newline,
        )
    ]
    for w in words:
        choice = {"index": 0, "delta": {"content": w}, "logprobs": None, "finish_reason": None}
        events.append(event({**HEAD, "choices": [choice], "usage": None}, newline))
    finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    at = None
    if usage == "on-last":
        events.append(event({**HEAD, "choices": [finish], "usage": USAGE}, newline))
        at = len(events) - 1
    else:
        events.append(event({**HEAD, "choices": [finish], "usage": None}, newline))
    if usage == "separate":
        events.append(event({**HEAD, "choices": [], "usage": USAGE}, newline))
        at = len(events) - 1
    events.append(b"data: [DONE]" + newline * 2)
    return events, at


def completion_events(words: list[str]) -> tuple[list[bytes], int]:
    head = {**HEAD, "object": "text_completion"}
    events = [
        event({**head, "choices": [{"text": w, "index": 0, "finish_reason": None}]}) for w in words
    ]
    events.append(event({**head, "choices": [], "usage": USAGE}))
    events.append(b"data: [DONE]\n\n")
    return events, len(events) - 2
