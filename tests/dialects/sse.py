"""Test helpers for the front-ends' streams: a chat SSE stream built from a chat answer, and an
SSE reader for what a translator wrote.

``chat_stream`` writes what an OpenAI-compatible backend sends for an answer with
``stream_options.include_usage``: a role chunk, the content in the pieces given, each tool call
as a first fragment (id, name, the first piece of its arguments) and further argument pieces,
the finish chunk, the usage chunk (separate, on the finish chunk, or none) and ``[DONE]``.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

__all__ = ["HEAD", "chat_stream", "read_events", "split_at"]

HEAD = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1730000000,
    "model": "backend-model",
}


def _data(obj: Any, newline: bytes) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + newline * 2


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return {**HEAD, "choices": [choice], "usage": None}


def chat_stream(
    answer: dict[str, Any],
    *,
    content_pieces: list[str] | None = None,
    argument_pieces: list[list[str]] | None = None,
    usage: str = "separate",
    done: bool = True,
    newline: bytes = b"\n",
) -> bytes:
    """The chat SSE bytes for a chat ``answer`` (one choice). ``content_pieces`` /
    ``argument_pieces`` (one list per tool call) must join to the answer's texts; by default
    each is one piece. ``usage``: "separate", "on-finish" or "none"."""
    choice = answer["choices"][0]
    message = choice["message"]
    events = [_data(_chunk({"role": "assistant", "content": ""}), newline)]
    content = message.get("content") or ""
    pieces = content_pieces if content_pieces is not None else ([content] if content else [])
    assert "".join(pieces) == content
    for piece in pieces:
        events.append(_data(_chunk({"content": piece}), newline))
    for i, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        parts = argument_pieces[i] if argument_pieces is not None else [arguments]
        assert "".join(parts) == arguments
        first = {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"],
                              "arguments": parts[0] if parts else ""}}
        events.append(_data(_chunk({"tool_calls": [first]}), newline))
        for part in parts[1:]:
            more = {"index": i, "function": {"arguments": part}}
            events.append(_data(_chunk({"tool_calls": [more]}), newline))
    extra = {"stop_reason": choice["stop_reason"]} if "stop_reason" in choice else {}
    finish = _chunk({}, choice["finish_reason"], **extra)
    if usage == "on-finish":
        finish["usage"] = answer["usage"]
    events.append(_data(finish, newline))
    if usage == "separate":
        events.append(_data({**HEAD, "choices": [], "usage": answer["usage"]}, newline))
    if done:
        events.append(b"data: [DONE]" + newline * 2)
    return b"".join(events)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given byte positions (any order, repeats and ends allowed)."""
    points = sorted({max(0, min(len(data), c)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def read_events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, parsed data) of every event of an Anthropic-style SSE stream, checking
    the framing: each event is ``event: <name>`` and one ``data:`` line, and the data's
    ``type`` is the event's name."""
    assert stream.endswith(b"\n\n") or not stream, stream[-80:]
    out: list[tuple[str, dict[str, Any]]] = []
    for block in stream.split(b"\n\n")[:-1]:
        lines = block.split(b"\n")
        assert len(lines) == 2, block
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), block
        name = lines[0][7:].decode()
        data = msgspec.json.decode(lines[1][6:])
        assert data["type"] == name, block
        out.append((name, data))
    return out
