"""Request and response bodies shared by the backend, the load generator and the checks.

They live in one place so that the sanity checks validate exactly what nginx serves and
what wrk sends: a mismatch (e.g. a 401 from the gateway) would otherwise look like a very
fast request in the numbers.
"""

from __future__ import annotations

import json
from typing import Any

MODEL = "bench-model"
STREAM_CHUNKS = 64
CREATED = 1_700_000_000


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def request_body(*, stream: bool) -> str:
    """The client request: small, so the measured cost is the hop, not body parsing."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": STREAM_CHUNKS,
    }
    if stream:
        body["stream"] = True
    return _dumps(body)


def completion_body() -> str:
    """A fixed non-streaming ``chat.completion`` with 64 completion tokens."""
    return _dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " hello" * STREAM_CHUNKS},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": STREAM_CHUNKS,
                "total_tokens": 9 + STREAM_CHUNKS,
            },
        }
    )


def sse_body() -> str:
    """64 ``chat.completion.chunk`` events of one token each, then ``data: [DONE]``."""
    events = []
    for i in range(STREAM_CHUNKS):
        chunk = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": " hello"},
                    "finish_reason": "length" if i == STREAM_CHUNKS - 1 else None,
                }
            ],
        }
        events.append(f"data: {_dumps(chunk)}\n\n")
    events.append("data: [DONE]\n\n")
    return "".join(events)


def check_response(body: bytes, content_type: str, *, stream: bool) -> str | None:
    """Return a problem description, or None if the response looks like the fixture's."""
    text = body.decode("utf-8", "replace")
    if not stream:
        if "json" not in content_type:
            return f"content-type {content_type!r} is not JSON"
        try:
            obj = json.loads(text)
        except ValueError:
            return f"body is not JSON: {text[:200]!r}"
        if obj.get("object") != "chat.completion":
            return f"unexpected body: {text[:200]!r}"
        return None
    if not content_type.startswith("text/event-stream"):
        return f"content-type {content_type!r} is not text/event-stream"
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    content = 0
    for event in data:
        if event == "[DONE]":
            continue
        try:
            obj = json.loads(event)
        except ValueError:
            return f"event is not JSON: {event[:200]!r}"
        choices = obj.get("choices") or []
        if any((c.get("delta") or {}).get("content") for c in choices):
            content += 1
    if content != STREAM_CHUNKS or not data or data[-1] != "[DONE]":
        return (
            f"expected {STREAM_CHUNKS} content chunks + [DONE], got {content} content "
            f"chunks in {len(data)} events: {text[:200]!r}"
        )
    return None
