"""Request and response bodies shared by the backend, the load generator and the checks.

They live in one place so that the sanity checks validate exactly what nginx serves and
what wrk sends: a mismatch (e.g. a 401 from the gateway) would otherwise look like a very
fast request in the numbers.

The backend always speaks chat completions. A client may speak another API (``API_PATHS``):
the same request ("Say hello", 64 output tokens) as an Anthropic Messages or an OpenAI
Responses request, which the gateway translates to chat and back; ``check_response`` then
validates the answer in that API's shape.
"""

from __future__ import annotations

import json
from typing import Any

MODEL = "bench-model"
STREAM_CHUNKS = 64
CREATED = 1_700_000_000


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


#: the client APIs a benchmark request can be sent in, and the gateway route of each
API_PATHS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
PROMPT = "Say hello"


def request_body(*, stream: bool, api: str = "chat", store: bool = True) -> str:
    """The client request: small, so the measured cost is the hop, not body parsing. The same
    content in every API: one user turn, at most 64 output tokens. ``store=False`` sends a
    Responses request with ``store: false`` (translation without the stored response)."""
    body: dict[str, Any]
    if api == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": STREAM_CHUNKS}
    elif api == "messages":
        body = {"model": MODEL, "max_tokens": STREAM_CHUNKS,
                "messages": [{"role": "user", "content": PROMPT}]}
    elif api == "responses":
        body = {"model": MODEL, "input": PROMPT, "max_output_tokens": STREAM_CHUNKS}
        if not store:
            body["store"] = False
    else:
        raise ValueError(f"unknown API {api!r}; expected one of {sorted(API_PATHS)}")
    if stream:
        body["stream"] = True
    return _dumps(body)


def request_headers(api_key: str, api: str = "chat") -> dict[str, str]:
    """The headers a client of ``api`` sends: Anthropic's SDK sends its key as ``x-api-key``
    with an ``anthropic-version``; the OpenAI APIs use ``Authorization: Bearer``."""
    if api == "messages":
        return {"Content-Type": "application/json", "x-api-key": api_key,
                "anthropic-version": "2023-06-01"}
    return {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}


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


def check_response(body: bytes, content_type: str, *, stream: bool,
                   api: str = "chat") -> str | None:
    """Return a problem description, or None if the response is the fixture's answer in
    ``api``'s shape (a whole answer, or a stream of 64 text deltas that ends properly)."""
    text = body.decode("utf-8", "replace")
    if not stream:
        if "json" not in content_type:
            return f"content-type {content_type!r} is not JSON"
        try:
            obj = json.loads(text)
        except ValueError:
            return f"body is not JSON: {text[:200]!r}"
        if not isinstance(obj, dict) or _answer_text(obj, api) != " hello" * STREAM_CHUNKS:
            return f"unexpected {api} body: {text[:200]!r}"
        return None
    if not content_type.startswith("text/event-stream"):
        return f"content-type {content_type!r} is not text/event-stream"
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    events = []
    for event in data:
        if event == "[DONE]":
            continue
        try:
            events.append(json.loads(event))
        except ValueError:
            return f"event is not JSON: {event[:200]!r}"
    content = sum(1 for obj in events if isinstance(obj, dict) and _delta_text(obj, api))
    if api == "chat":
        ended = bool(data) and data[-1] == "[DONE]"
        end = "[DONE]"
    else:
        end = " or ".join(_STREAM_END[api])
        ended = bool(events) and isinstance(events[-1], dict) and \
            events[-1].get("type") in _STREAM_END[api]
    if content != STREAM_CHUNKS or not ended:
        return (
            f"expected {STREAM_CHUNKS} {api} content events + {end}, got {content} content "
            f"events in {len(data)} events: {text[:200]!r}"
        )
    return None


#: the last event of a stream that ended cleanly, per API (chat: ``data: [DONE]``); the
#: fixture's answer stops at its 64-token limit, which Responses reports as incomplete
_STREAM_END = {"messages": ("message_stop",),
               "responses": ("response.completed", "response.incomplete")}


#: a Responses answer that ended well: whole, or cut at max_output_tokens (the fixture's)
_DONE_STATUS = ("completed", "incomplete")


def _answer_text(obj: dict[str, Any], api: str) -> str | None:
    """The answer's text, read the way a client of ``api`` reads it (None: not that shape)."""
    try:
        if api == "chat":
            if obj.get("object") != "chat.completion":
                return None
            return str(obj["choices"][0]["message"]["content"])
        if api == "messages":
            if obj.get("type") != "message":
                return None
            return "".join(b["text"] for b in obj["content"] if b.get("type") == "text")
        if obj.get("object") != "response" or obj.get("status") not in _DONE_STATUS:
            return None
        return "".join(part["text"] for item in obj["output"] if item.get("type") == "message"
                       for part in item["content"] if part.get("type") == "output_text")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def _delta_text(obj: dict[str, Any], api: str) -> bool:
    """The event carries answer text (one chunk of the fixture's 64)."""
    if api == "chat":
        choices = obj.get("choices") or []
        return any((c.get("delta") or {}).get("content") for c in choices)
    if api == "messages":
        delta = obj.get("delta")
        return (obj.get("type") == "content_block_delta" and isinstance(delta, dict)
                and delta.get("type") == "text_delta" and bool(delta.get("text")))
    return obj.get("type") == "response.output_text.delta" and bool(obj.get("delta"))
