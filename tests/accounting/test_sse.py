"""The SSE scanner: usage found, text collected, usage stripped exactly, however it is chunked."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.accounting import BackendUsage, StreamScanner
from gateway.sim.shapes import DONE, ChunkFormat, usage

from .streams import HEAD, chat_events, completion_events

WORDS = ["Hello", " there", ",", " wörld", " 🙂", ' "quoted"', "\n\nnew para"]
EXPECTED_USAGE = BackendUsage(
    prompt_tokens=120, completion_tokens=7, total_tokens=127, cached_tokens=64
)


def run(chunks: list[bytes], *, strip: bool) -> tuple[StreamScanner, bytes]:
    scanner = StreamScanner(strip_usage=strip)
    out = b"".join(scanner.feed(c) for c in chunks) + scanner.flush()
    return scanner, out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_every_byte_boundary() -> None:
    """Split in two at every byte: usage found, text whole, bytes exact with and without strip."""
    events, at = chat_events(WORDS[:3])
    assert at is not None
    data = b"".join(events)
    stripped = b"".join(e for i, e in enumerate(events) if i != at)
    for cut in range(len(data) + 1):
        for strip, expected in ((False, data), (True, stripped)):
            scanner, out = run([data[:cut], data[cut:]], strip=strip)
            assert out == expected, (cut, strip)
            assert scanner.usage == EXPECTED_USAGE
            assert scanner.done
            assert scanner.delivered_text() == "".join(WORDS[:3])


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
    crlf=st.booleans(),
    strip=st.booleans(),
)
def test_random_chunking(cuts: list[int], crlf: bool, strip: bool) -> None:
    events, at = chat_events(WORDS, newline=b"\r\n" if crlf else b"\n")
    data = b"".join(events)
    scanner, out = run(split_at(data, [c % (len(data) + 1) for c in cuts]), strip=strip)
    expected = b"".join(e for i, e in enumerate(events) if not (strip and i == at))
    assert out == expected
    assert scanner.usage == EXPECTED_USAGE
    assert scanner.delivered_text() == "".join(WORDS)
    assert scanner.done


def test_pass_through_returns_the_same_objects() -> None:
    """Without stripping every chunk is forwarded as the very object received."""
    events, _ = chat_events(WORDS)
    scanner = StreamScanner(strip_usage=False)
    for chunk in events:
        assert scanner.feed(chunk) is chunk
    assert scanner.flush() == b""


def test_strip_forwards_untouched_events_as_received() -> None:
    """With stripping on, a one-event chunk without usage is forwarded as the same object."""
    events, at = chat_events(WORDS)
    scanner = StreamScanner(strip_usage=True)
    for i, chunk in enumerate(events):
        out = scanner.feed(chunk)
        assert out == b"" if i == at else out is chunk


def test_usage_on_the_last_content_chunk_is_nulled_not_dropped() -> None:
    """When usage rides on a chunk with choices, the chunk is kept with ``"usage": null``."""
    events, at = chat_events(WORDS, usage="on-last")
    assert at is not None
    scanner, out = run([b"".join(events)], strip=True)
    assert scanner.usage == EXPECTED_USAGE
    parts = out.split(b"\n\n")[:-1]
    assert len(parts) == len(events)
    rewritten = msgspec.json.decode(parts[at][len(b"data: ") :])
    assert rewritten["usage"] is None
    assert rewritten["choices"][0]["finish_reason"] == "stop"
    assert [p + b"\n\n" for i, p in enumerate(parts) if i != at] == [
        e for i, e in enumerate(events) if i != at
    ]


def test_stream_without_usage() -> None:
    """No usage event: usage is None, the text is there to count."""
    events, _ = chat_events(WORDS, usage="none")
    scanner, out = run(events, strip=True)
    assert scanner.usage is None and scanner.done
    assert out == b"".join(events)
    assert scanner.delivered_text() == "".join(WORDS)


def test_cut_short_mid_event() -> None:
    """A stream that dies mid-event: flush returns the held partial bytes; text so far kept."""
    events, _ = chat_events(WORDS, usage="none")
    data = b"".join(events[:4])
    chunks = [data, events[4][:20]]
    scanner, out = run(chunks, strip=True)
    assert out == data + events[4][:20]
    assert not scanner.done and scanner.usage is None
    assert scanner.delivered_text() == "".join(WORDS[:3])


def test_last_event_without_blank_line_is_still_read() -> None:
    events, at = chat_events(WORDS[:2])
    assert at is not None
    data = b"".join(events[:at]) + events[at].rstrip(b"\n")
    scanner, out = run([data], strip=True)
    assert scanner.usage == EXPECTED_USAGE
    assert out == b"".join(events[:at])


def test_completions_text_and_usage() -> None:
    events, at = completion_events(WORDS)
    scanner, out = run([b"".join(events)], strip=True)
    assert scanner.delivered_text() == "".join(WORDS)
    assert scanner.usage == EXPECTED_USAGE
    assert out == b"".join(e for i, e in enumerate(events) if i != at)


def test_comments_multiline_data_and_no_space() -> None:
    """Keep-alive comments pass; ``data:`` without a space and split data lines are read."""
    chunk = {**HEAD, "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    body = msgspec.json.encode(chunk)
    half = body.index(b',"choices"')  # data lines join with "\n": JSON whitespace here
    data = (
        b": keep-alive\n\n"
        + b"event: message\nid: 1\ndata:"
        + body
        + b"\n\n"
        + b"data: "
        + body[:half]
        + b"\ndata: "
        + body[half:]
        + b"\n\n"
        + b"data:[DONE]\n\n"
    )
    scanner, out = run([data], strip=True)
    assert out == data
    assert scanner.delivered_text() == "hihi"
    assert scanner.done


def test_multiline_event_split_after_its_first_line() -> None:
    """A chunk ending one byte into an event's second data line is not taken as a whole event."""
    body = msgspec.json.encode({"choices": [{"index": 0, "delta": {"content": "x"}}]})
    cut = body.index(b',"delta"')
    first = b"data: " + body[:cut] + b"\nd"
    rest = b"ata: " + body[cut:] + b"\n\n" + DONE
    scanner, out = run([b"data: {}\n\n", first, rest], strip=True)
    assert out == b"data: {}\n\n" + first + rest
    assert scanner.delivered_text() == "x" and scanner.done


def test_tool_call_and_reasoning_deltas_count_as_delivered() -> None:
    ev = [
        {"index": 0, "delta": {"reasoning_content": "think "}},
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}},
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}},
    ]
    data = b"".join(b"data: " + msgspec.json.encode({"choices": [c]}) + b"\n\n" for c in ev)
    scanner, _ = run([data], strip=False)
    assert scanner.delivered_text() == "think f{}"
    assert scanner.reply_text() is None  # not a plain reply a client would re-send


@pytest.mark.parametrize("fields", [{"reasoning": "think "},
                                    {"reasoning_content": "think ", "reasoning": "think "}])
def test_vllms_reasoning_field_counts_as_delivered_once(fields: dict[str, str]) -> None:
    """vLLM's newer ``delta.reasoning`` is reasoning too (alone, or beside the older field
    with the same text: counted once), so such a stream is not taken for a plain reply."""
    ev = [{"index": 0, "delta": fields}, {"index": 0, "delta": {"content": "answer"}}]
    data = b"".join(b"data: " + msgspec.json.encode({"choices": [c]}) + b"\n\n" for c in ev)
    scanner, _ = run([data], strip=False)
    assert scanner.delivered_text() in ("answerthink ", "think answer")
    assert scanner.reply_text() is None


def test_reply_text_is_the_single_choice_content() -> None:
    events, _ = chat_events(WORDS)
    scanner, _ = run(events, strip=False)
    assert scanner.reply_text() == "".join(WORDS)


def test_malformed_event_is_counted_and_passed() -> None:
    data = b"data: {not json\n\n" + DONE
    scanner, out = run([data], strip=True)
    assert out == data and scanner.malformed == 1 and scanner.done


def test_oversized_event_passes_through_unscanned() -> None:
    """An event beyond max_event_bytes is forwarded and skipped; scanning resumes after it."""
    events, at = chat_events(WORDS)
    big = b"data: " + b"x" * 5000 + b"\n\n"
    data = big + b"".join(events)
    scanner = StreamScanner(strip_usage=True, max_event_bytes=1000)
    chunks = split_at(data, list(range(0, len(data), 700)))
    out = b"".join(scanner.feed(c) for c in chunks) + scanner.flush()
    assert out == big + b"".join(e for i, e in enumerate(events) if i != at)
    assert scanner.usage == EXPECTED_USAGE


def test_simulator_stream() -> None:
    """The gateway's own simulator's stream shape scans the same way."""
    fmt = ChunkFormat(chat=True, model="m")
    words = [" a", " b", " c"]
    tail = fmt.usage(usage(10, 3, 4)) + DONE
    data = fmt.role() + b"".join(fmt.token(w) for w in words) + fmt.finish("stop") + tail
    scanner, out = run([data[i : i + 13] for i in range(0, len(data), 13)], strip=True)
    assert scanner.usage == BackendUsage(
        prompt_tokens=10, completion_tokens=3, total_tokens=13, cached_tokens=4
    )
    assert out == data[: -len(tail)] + DONE
    assert scanner.delivered_text() == " a b c"


@pytest.mark.parametrize("strip", [False, True])
def test_repr_shows_state(strip: bool) -> None:
    events, _ = chat_events(WORDS[:1])
    scanner, _ = run(events, strip=strip)
    assert repr(scanner) == "<StreamScanner [done | 4 events, usage]>"
