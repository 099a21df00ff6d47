"""The continuation's pure parts: the request that continues a stream, and the splice of its
answer into the client's stream (``gateway/upstream/continuation.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.accounting.sse import StreamScanner
from gateway.dialects.native import NativeStreamScanner
from gateway.upstream.continuation import (
    MARKER,
    MessageSoFar,
    MessagesSplice,
    Splice,
    continuation_body,
    messages_continuation_body,
)
from gateway.upstream.relay import _ErrorEvents
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
    assert splice.reported_prompt == 14


# --- an engine's error event, wherever the reads cut it (``relay._ErrorEvents``) -------------

BEFORE = _event(_chunk({"content": " one"})) + _event(_chunk({"content": " two"}))
CHAT_ERROR = b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
MESSAGES_ERROR = (b'event: error\ndata: {"type": "error", "error": {"type": '
                  b'"overloaded_error", "message": "Overloaded"}}\n\n')


def _watched(reads: list[bytes]) -> tuple[bytes, bool]:
    """(what the watch passed on, whether it found the error event), read by read."""
    watch, out = _ErrorEvents(), b""
    for read in reads:
        passed, broke = watch.take(read)
        out += passed
        if broke:
            return out, True
    return out + watch.rest(), False


@pytest.mark.parametrize("error", [CHAT_ERROR, MESSAGES_ERROR,
                                   CHAT_ERROR.replace(b"\n", b"\r\n"),
                                   MESSAGES_ERROR.replace(b"\n", b"\r\n"),
                                   b'data:{ "error" : {"message": "x"}}\n\n'],
                         ids=["chat", "messages", "chat-crlf", "messages-crlf", "spaced"])
def test_an_error_event_is_found_wherever_the_reads_cut_it(error: bytes) -> None:
    """Two reads cut anywhere in the stream, and three cut anywhere in the event: the bytes
    before the event pass, none of it nor after it."""
    stream = BEFORE + error + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        assert _watched([stream[:cut], stream[cut:]]) == (BEFORE, True), cut
    start = len(BEFORE)
    for first in range(start, start + len(error)):
        for second in range(first + 1, start + len(error)):
            reads = [stream[:first], stream[first:second], stream[second:]]
            assert _watched(reads) == (BEFORE, True), (first, second)


def test_a_stream_without_an_error_event_passes_whole() -> None:
    """Text that speaks of errors, cut anywhere: everything passes, in order, nothing
    found; a held line is short and waits one read at most."""
    stream = (BEFORE + _event(_chunk({"content": '"error": event: error\ndata: {"error":'}))
              + b'event: content_block_delta\ndata: {"type": "content_block_delta", '
              b'"delta": {"text": "error"}}\n\n' + b"data: [DONE]\n\n")
    for cut in range(1, len(stream)):
        assert _watched([stream[:cut], stream[cut:]]) == (stream, False), cut
    assert _watched([stream[i:i + 1] for i in range(len(stream))]) == (stream, False)
    watch = _ErrorEvents()
    assert watch.take(b"data: {\"choices\": [") == (b"data: {\"choices\": [", False)
    assert watch.take(b"x" * 100) == (b"x" * 100, False)  # a long line is never held
    assert watch.take(b"\n\ndata: {  ") == (b"\n\n", False)
    assert watch.rest() == b"data: {  "


# --- a Messages stream passed through ---------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}]
MESSAGES_BODY = {"model": "engine-model", "stream": True, "max_tokens": 10,
                 "system": "be brief", "messages": MESSAGES}


def _messages_body(**changes: Any) -> bytes:
    return json.dumps({**MESSAGES_BODY, **changes}).encode()


def test_the_messages_continuation_prefills_the_text_sent() -> None:
    out = messages_continuation_body(_messages_body(), "Hello there", 2)
    assert out is not None
    body = json.loads(out)
    assert body["messages"] == [*MESSAGES, {"role": "assistant", "content": "Hello there"}]
    assert body["max_tokens"] == 8 and body["system"] == "be brief"
    assert "continue_final_message" not in body  # Anthropic's prefill needs no flag
    # nothing sent yet: the request again, its limit as it was
    assert json.loads(messages_continuation_body(_messages_body(), "", 0) or b"") == \
        MESSAGES_BODY
    assert messages_continuation_body(_messages_body(), "a b c", 10) is None


@pytest.mark.parametrize(("content", "after"), [
    ("Hi", "Hi there"),
    ([{"type": "text", "text": "Hi"}], [{"type": "text", "text": "Hi there"}]),
    ([{"type": "image", "source": {}}],
     [{"type": "image", "source": {}}, {"type": "text", "text": " there"}]),
])
def test_the_clients_own_prefill_is_continued(content: Any, after: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    out = messages_continuation_body(_messages_body(messages=messages), " there", 1)
    body = json.loads(out or b"")
    assert body["messages"] == [messages[0], {"role": "assistant", "content": after}]


def _named(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **fields}).encode() \
        + b"\n\n"


def _messages_continuation(*texts: str, start_text: str = "", first: str = "text"
                           ) -> list[bytes]:
    block: dict[str, Any] = {"type": first, "text": start_text} if first == "text" else \
        {"type": first, "id": "toolu_1", "name": "f", "input": {}}
    return [
        _named("message_start", message={"id": "msg_engine2", "model": "engine-model",
                                         "usage": {"input_tokens": 30, "output_tokens": 1,
                                                   "cache_read_input_tokens": 5}}),
        _named("content_block_start", index=0, content_block=block),
        _named("ping"),
        *[_named("content_block_delta", index=0, delta={"type": "text_delta", "text": t})
          for t in texts],
        _named("content_block_stop", index=0),
        _named("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
               usage={"input_tokens": 30, "output_tokens": len(texts),
                      "cache_read_input_tokens": 5, "cache_creation": {"x": 1}}),
        _named("message_stop"),
    ]


def _messages_spliced(so_far: MessageSoFar, pieces: list[bytes], split: int | None = None,
                      dropped: str = "") -> tuple[list[tuple[str, dict[str, Any]]],
                                                  MessagesSplice]:
    splice = MessagesSplice(so_far, prompt=9, sent=3, dropped=dropped)
    raw = b"".join(pieces)
    if split is not None:
        pieces = [raw[i:i + split] for i in range(0, len(raw), split)]
    out = b"".join(splice.feed(p) for p in pieces) + splice.flush()
    events = []
    for event in out.split(b"\n\n"):
        if event:
            head, data = event.split(b"\n")
            obj = json.loads(data.removeprefix(b"data: "))
            assert head == b"event: " + obj["type"].encode()
            events.append((obj["type"], obj))
    return events, splice


ORIGINAL_INPUT = {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 0}


@pytest.mark.parametrize("split", [None, 1, 9, 50])
def test_the_messages_splice_continues_the_open_block(split: int | None) -> None:
    """The client's block 1 is open: no second message_start, no ping, no start of the
    continuation's text block; its deltas and stop at index 1; the whole answer's usage."""
    so_far = MessageSoFar("Hello there", 1, True, ORIGINAL_INPUT)
    events, splice = _messages_spliced(so_far, _messages_continuation(" you", "."), split)
    assert [kind for kind, _ in events] == [
        "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    assert [e["index"] for k, e in events if k.startswith("content")] == [1, 1, 1]
    assert [e["delta"]["text"] for k, e in events if k == "content_block_delta"] == [
        " you", "."]
    delta = events[3][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    # the output: 3 sent + 2; the input figures the original's (none for its cache write)
    assert delta["usage"] == {"input_tokens": 12, "output_tokens": 5,
                              "cache_read_input_tokens": 0}
    assert splice.usage is not None and splice.usage["output_tokens"] == 2
    assert splice.reported_prompt == 35  # the continuation's prompt: 30 + 5 read from cache


def test_the_messages_splice_after_a_closed_block_opens_the_next() -> None:
    so_far = MessageSoFar("Hello there", 0, False, ORIGINAL_INPUT)
    events, _ = _messages_spliced(so_far, _messages_continuation(" you"))
    assert [(k, e.get("index")) for k, e in events] == [
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("message_delta", None), ("message_stop", None)]


def test_the_messages_splice_before_any_block_keeps_the_indexes() -> None:
    so_far = MessageSoFar("", None, False, ORIGINAL_INPUT)
    pieces = _messages_continuation(" you")
    events, _ = _messages_spliced(so_far, pieces)
    assert [(k, e.get("index")) for k, e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("message_delta", None), ("message_stop", None)]
    # the text events as the engine wrote them
    spliced = MessagesSplice(so_far, prompt=9, sent=0)
    assert spliced.feed(pieces[3]) == pieces[3]


def test_the_messages_splice_keeps_text_in_the_dropped_start() -> None:
    so_far = MessageSoFar("Hello", 0, True, ORIGINAL_INPUT)
    events, _ = _messages_spliced(so_far, _messages_continuation(" you", start_text=" there"))
    assert [(k, e.get("index"), e.get("delta", {}).get("text")) for k, e in events][:2] == [
        ("content_block_delta", 0, " there"), ("content_block_delta", 0, " you")]


def test_the_whitespace_left_out_of_the_prefill_is_not_sent_twice() -> None:
    """The client had "Hello\n\n"; the prefill was "Hello"; the continuation writes the
    line breaks again: the client does not get them twice, the rest as written."""
    so_far = MessageSoFar("Hello\n\n", 0, True, ORIGINAL_INPUT)
    events, _ = _messages_spliced(so_far, _messages_continuation("\n", "\nWorld", " !"),
                                  dropped="\n\n")
    texts = [e["delta"]["text"] for k, e in events if k == "content_block_delta"]
    assert texts == ["World", " !"]
    # a continuation that goes another way keeps what it wrote past the match
    events, _ = _messages_spliced(so_far, _messages_continuation("\nWorld"), dropped="\n\n")
    assert [e["delta"]["text"] for k, e in events if k == "content_block_delta"] == ["World"]
    events, _ = _messages_spliced(so_far, _messages_continuation("World"), dropped="\n\n")
    assert [e["delta"]["text"] for k, e in events if k == "content_block_delta"] == ["World"]


def test_a_continuation_that_opens_another_kind_of_block_closes_the_clients() -> None:
    so_far = MessageSoFar("Hello", 2, True, ORIGINAL_INPUT)
    events, _ = _messages_spliced(so_far, _messages_continuation(first="tool_use"))
    assert [(k, e.get("index")) for k, e in events][:3] == [
        ("content_block_stop", 2), ("content_block_start", 3), ("content_block_stop", 3)]


def _native(*events: bytes) -> NativeStreamScanner:
    scanner = NativeStreamScanner("messages")
    for event in events:
        assert scanner.feed(event) == event
    return scanner


START = _named("message_start", message={"id": "msg_1", "usage": ORIGINAL_INPUT})


def test_the_native_scanner_says_what_the_client_holds() -> None:
    text_block = _named("content_block_start", index=0,
                        content_block={"type": "text", "text": ""})
    delta = _named("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
    assert _native().messages_so_far() is None  # nothing yet
    assert _native(START).messages_so_far() == MessageSoFar("", None, False, ORIGINAL_INPUT)
    assert _native(START, text_block, delta).messages_so_far() == \
        MessageSoFar("Hi", 0, True, ORIGINAL_INPUT)
    stop = _named("content_block_stop", index=0)
    assert _native(START, text_block, delta, stop).messages_so_far() == \
        MessageSoFar("Hi", 0, False, ORIGINAL_INPUT)
    # part of an event went out
    assert _native(START, text_block, delta[:20]).messages_so_far() is None
    # its end went out
    ended = _named("message_delta", delta={"stop_reason": "end_turn"},
                   usage={"output_tokens": 1})
    assert _native(START, text_block, delta, stop, ended).messages_so_far() is None


@pytest.mark.parametrize("block", [
    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
    {"type": "thinking", "thinking": ""},
    {"type": "redacted_thinking", "data": "x"},
])
def test_a_message_with_a_block_other_than_text_is_not_continued(block: dict[str, Any]
                                                                 ) -> None:
    text_block = _named("content_block_start", index=0,
                        content_block={"type": "text", "text": ""})
    other = _named("content_block_start", index=1, content_block=block)
    assert _native(START, text_block, _named("content_block_stop", index=0),
                   other).messages_so_far() is None
    assert _native(START, _named("content_block_start", index=0, content_block=block),
                   _named("content_block_stop", index=0)).messages_so_far() is None


def test_a_passed_through_responses_stream_has_no_message() -> None:
    scanner = NativeStreamScanner("responses")
    scanner.feed(b'event: response.created\ndata: {"type": "response.created"}\n\n')
    assert scanner.messages_so_far() is None


def test_the_held_start_of_an_event_the_client_never_got_is_dropped() -> None:
    """A chat client without ``include_usage`` gets whole events: the start of the broken
    one is the scanner's alone, and is dropped before the continuation's events come."""
    scanner = StreamScanner(strip_usage=True)
    first, second = _event(_chunk({"content": " one"})), _event(_chunk({"content": " two"}))
    assert scanner.feed(first + b'data: {"cho') == first
    assert not scanner.partial_sent
    scanner.drop_partial()
    assert scanner.feed(second) == second
    assert scanner.reply_text() == " one two"
    relayed = StreamScanner(strip_usage=False)  # the client holds that start: not continued
    relayed.feed(first + b'data: {"cho')
    assert relayed.partial_sent
