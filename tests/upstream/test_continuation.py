"""The continuation's pure parts: the request that continues a stream, and the splice of its
answer into the client's stream (``gateway/upstream/continuation.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upstream.continuation import MARKER, Splice, continuation_body
from gateway.upstream.rename import AnswerRewriter

BODY = {"model": "engine-model", "stream": True, "max_tokens": 10, "cache_salt": "s",
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]}


def _body(**changes: Any) -> bytes:
    return json.dumps({**BODY, **changes}).encode()


def test_the_continuation_asks_for_the_rest_of_the_text() -> None:
    """The first request as sent (model, salt, usage), the text as a final assistant message
    to continue, and the output limit reduced by the tokens sent."""
    out = continuation_body(_body(n=1), " one two", 2)
    assert out is not None
    body = json.loads(out)
    assert body["messages"][-1] == {"role": "assistant", "content": " one two"}
    assert body["messages"][:-1] == BODY["messages"]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8 and "n" not in body
    assert body["cache_salt"] == "s" and body["model"] == "engine-model"
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_nothing_is_asked_past_the_limit(field: str) -> None:
    body = {**BODY, field: 3}
    body.pop("max_tokens") if field != "max_tokens" else None
    assert continuation_body(json.dumps(body).encode(), " a b c", 3) is None
    assert json.loads(continuation_body(json.dumps(body).encode(), " a", 1) or b"")[field] == 2


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-backend2", "model": "engine-model", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


CONTINUATION = [
    _event(_chunk({"role": "assistant", "content": ""})),
    _event(_chunk({"content": " three"})),
    _event(_chunk({"content": " four"})),
    _event(_chunk({}, "stop")),
    _event({"id": "chatcmpl-backend2", "model": "engine-model", "choices": [],
            "usage": {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16},
            "timings": {"cache_n": 12}}),
    b"data: [DONE]\n\n",
]


def _spliced(pieces: list[bytes]) -> list[dict[str, Any] | str]:
    splice = Splice(AnswerRewriter("public", "chatcmpl-gw"), prompt=9, sent=2)
    out = b"".join(splice.feed(p) for p in pieces) + splice.flush()
    events: list[dict[str, Any] | str] = []
    for event in out.split(b"\n\n"):
        if event:
            data = event.removeprefix(b"data: ")
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("split", [None, 1, 7, 40], ids=["events", "bytes", "7", "40"])
def test_the_splice_continues_the_clients_stream(split: int | None) -> None:
    """The role-only first chunk dropped, the client's id and model, the whole answer's usage
    (the original prompt; the tokens sent plus the continuation's), no engine cache figures,
    the marker on the finish and usage chunks; however the bytes are cut."""
    raw = b"".join(CONTINUATION)
    pieces = CONTINUATION if split is None else [raw[i:i + split]
                                                 for i in range(0, len(raw), split)]
    events = _spliced(list(pieces))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:3]] == [
        " three", " four", None]
    assert {c["id"] for c in chunks} == {"chatcmpl-gw"}
    assert {c["model"] for c in chunks} == {"public"}
    assert chunks[2]["metadata"] == MARKER and chunks[3]["metadata"] == MARKER
    assert "metadata" not in chunks[0]
    assert chunks[3]["usage"] == {"prompt_tokens": 9, "completion_tokens": 4,
                                  "total_tokens": 13}
    assert "timings" not in chunks[3]


def test_a_first_chunk_with_text_is_kept() -> None:
    """An engine whose first chunk already carries text loses none of it."""
    events = _spliced([_event(_chunk({"role": "assistant", "content": " three"})),
                       b"data: [DONE]\n\n"])
    assert isinstance(events[0], dict)
    assert events[0]["choices"][0]["delta"]["content"] == " three"


def test_the_splice_reads_the_continuations_usage() -> None:
    splice = Splice(AnswerRewriter(None), prompt=9, sent=2)
    for piece in CONTINUATION:
        splice.feed(piece)
    assert splice.usage is not None and splice.usage["prompt_tokens"] == 14
