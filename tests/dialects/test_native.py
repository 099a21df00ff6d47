"""The pass-through stream scanner: usage and text of Messages and Responses streams, the bytes
unchanged, whatever the chunking."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.dialects.native import NativeStreamScanner


def _sse(events: list[dict[str, object]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


MESSAGES = _sse([
    {"type": "message_start", "message": {"id": "m", "usage": {
        "input_tokens": 10, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5,
        "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
])

RESPONSES = _sse([
    {"type": "response.created", "sequence_number": 0, "response": {"usage": None}},
    {"type": "response.output_text.delta", "sequence_number": 1, "delta": "Hi "},
    {"type": "response.output_text.delta", "sequence_number": 2, "delta": "there"},
    {"type": "response.completed", "sequence_number": 3, "response": {"usage": {
        "input_tokens": 40, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 4}, "total_tokens": 49}}},
])


def _scan(api: str, data: bytes, cuts: list[int]) -> tuple[NativeStreamScanner, bytes]:
    scanner = NativeStreamScanner(api)
    out = b""
    last = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += scanner.feed(data[last:cut])
        last = cut
    out += scanner.flush()
    return scanner, out


@given(st.lists(st.integers(0, len(MESSAGES)), max_size=12))
def test_messages_usage_whatever_the_chunking(cuts: list[int]) -> None:
    scanner, out = _scan("messages", MESSAGES, cuts)
    assert out == MESSAGES  # relayed byte for byte
    assert scanner.done and scanner.usage is not None
    # Anthropic's input_tokens excludes the cache: the prompt is their sum, counted once
    assert scanner.usage.prompt_tokens == 10 + 30 + 5
    assert scanner.usage.cached_tokens == 30 and scanner.usage.cache_write_tokens == 5
    assert scanner.usage.completion_tokens == 7
    assert scanner.delivered_text() == "Hello"


@given(st.lists(st.integers(0, len(RESPONSES)), max_size=12))
def test_responses_usage_whatever_the_chunking(cuts: list[int]) -> None:
    scanner, out = _scan("responses", RESPONSES, cuts)
    assert out == RESPONSES
    assert scanner.done and scanner.usage is not None
    assert scanner.usage.prompt_tokens == 40 and scanner.usage.cached_tokens == 16
    assert scanner.usage.completion_tokens == 9 and scanner.usage.reasoning_tokens == 4
    assert scanner.delivered_text() == "Hi there"


def test_a_stream_cut_short_has_text_but_no_usage() -> None:
    cut = MESSAGES.index(b"event: message_delta")
    scanner, _ = _scan("messages", MESSAGES[:cut], [])
    assert scanner.usage is None and not scanner.done
    assert scanner.delivered_text() == "Hello"
