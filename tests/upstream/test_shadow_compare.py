"""Shadow comparison units: normalisation, similarity, judging, reading answers, the store."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.accounting import StreamScanner
from gateway.upstream import shadow_answer, shadow_compare
from gateway.upstream.shadow_answer import (
    TEXT_CAP,
    Answer,
    StreamCapture,
    Tap,
    read_body,
    stream_finish_reason,
)
from gateway.upstream.shadow_compare import (
    Comparison,
    ShadowComparisons,
    judge,
    normalise,
    rouge1_f,
)


def _ok(text: str | None = "x", **facts: Any) -> Answer:
    return Answer(status=200, ok=True, text=text, **facts)


def _comparison(model: str = "m", outcome: str = "agree", version: str = "v2",
                texts: tuple[str, str] | None = None, **sides: Answer) -> Comparison:
    return Comparison(model=model, version=version, primary_version=None, request_id="r",
                      tenant="t", at=0.0, outcome=outcome,  # type: ignore[arg-type]
                      exact=outcome == "agree", similarity=1.0 if outcome == "agree" else 0.2,
                      primary=sides.get("primary", _ok(None)),
                      shadow=sides.get("shadow", _ok(None)), texts=texts)


def test_exported_names_match_all() -> None:
    """Each module's ``__all__`` names what it defines in public, and only that."""
    for module in (shadow_answer, shadow_compare):
        defined = {name for name, value in vars(module).items() if not name.startswith("_")
                   and getattr(value, "__module__", None) == module.__name__}
        assert defined <= set(module.__all__) <= set(vars(module))


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("a  b\n\tc ", "a b c", id="runs-and-ends"),
    pytest.param("\n\n", "", id="only-space"),
    pytest.param("Same Case", "Same Case", id="case-kept"),
])
def test_normalise(text: str, expected: str) -> None:
    assert normalise(text) == expected


@pytest.mark.parametrize(("a", "b", "expected"), [
    pytest.param("the cat sat", "the cat sat", 1.0, id="equal"),
    pytest.param("The cat, sat!", "the cat sat", 1.0, id="case-and-punctuation"),
    pytest.param("a b c d", "e f g h", 0.0, id="disjoint"),
    pytest.param("a b c d", "a b", 2 * 2 / 6, id="prefix"),
    pytest.param("a a b", "a b b", 2 * 2 / 6, id="multiset"),
    pytest.param("", "", 1.0, id="both-empty"),
    pytest.param("a", "", 0.0, id="one-empty"),
])
def test_rouge1_f(a: str, b: str, expected: float) -> None:
    """ROUGE-1 F is the word-multiset overlap over the two lengths, symmetric."""
    assert rouge1_f(a, b) == pytest.approx(expected)
    assert rouge1_f(b, a) == pytest.approx(expected)


def test_judge_exact_after_whitespace() -> None:
    """Texts differing only in whitespace agree exactly."""
    assert judge(_ok("a  b\n"), _ok(" a b"), 0.9) == ("agree", True, 1.0)


def test_judge_by_similarity_threshold() -> None:
    """A near answer agrees at a low threshold and disagrees at a high one."""
    primary, shadow = _ok("one two three four five"), _ok("one two three four six")
    outcome, exact, similarity = judge(primary, shadow, 0.8)
    assert (outcome, exact) == ("agree", False)
    assert similarity == pytest.approx(0.8)
    assert judge(primary, shadow, 0.9)[0] == "disagree"


def test_judge_error_when_either_side_failed() -> None:
    failed = Answer(status=500, ok=False, error="status 500")
    assert judge(_ok(), failed, 0.9) == ("error", None, None)
    assert judge(failed, _ok(), 0.9) == ("error", None, None)


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param({"choices": [{"index": 1, "message": {"content": "B"}, "finish_reason": "stop"},
                              {"index": 0, "message": {"content": "A"}}],
                  "usage": {"completion_tokens": 3}}, ("AB", "stop", 3), id="chat-two-choices"),
    pytest.param({"choices": [{"message": {"content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]},
        ("f{}", "tool_calls", None), id="chat-tool-call"),
    pytest.param({"choices": [{"message": {"content": [{"type": "text", "text": "hi"}]}}]},
                 ("hi", None, None), id="chat-content-parts"),
    pytest.param({"choices": [{"text": "done", "finish_reason": "length"}],
                  "usage": {"completion_tokens": 1}}, ("done", "length", 1), id="completions"),
    pytest.param({"content": [{"type": "text", "text": "x"}, {"type": "tool_use", "input": {}}],
                  "stop_reason": "end_turn", "usage": {"output_tokens": 4}},
                 ("x", "stop", 4), id="anthropic"),
    pytest.param({"output": [{"content": [{"type": "output_text", "text": "r"}]}],
                  "usage": {"output_tokens": 2}}, ("r", None, 2), id="responses"),
    pytest.param({"data": [{"embedding": [0.1]}]}, (None, None, None), id="no-text"),
])
def test_read_body(body: dict[str, Any], expected: tuple[Any, ...]) -> None:
    assert read_body(json.dumps(body).encode()) == expected


def test_read_body_not_json() -> None:
    assert read_body(b"<html>oops") == (None, None, None)


def test_read_body_caps_text() -> None:
    body = {"choices": [{"message": {"content": "y" * (TEXT_CAP + 500)}}]}
    text, _, _ = read_body(json.dumps(body).encode())
    assert text is not None and len(text) == TEXT_CAP


def _sse(events: list[Any], sep: bytes = b"\n\n") -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(e) + sep for e in events) + \
        b"data: [DONE]" + sep


_EVENTS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "hello"}}]},
    {"choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
]


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("size", [1, 7, 10_000], ids=["bytewise", "odd", "whole"])
def test_stream_capture_any_split(size: int, sep: bytes) -> None:
    """The text, finish reason and usage come out the same however the chunks split."""
    raw = _sse(_EVENTS, sep)
    capture = StreamCapture()
    for i in range(0, len(raw), size):
        capture.feed(raw[i:i + size])
    assert (capture.text(), capture.finish_reason, capture.output_tokens) == (
        "hello world", "stop", 2)


def test_stream_capture_matches_the_scanners_text() -> None:
    """The shadow's capture and the primary's scanner read the same text from one stream."""
    raw = _sse([{"choices": [{"index": 1, "delta": {"content": "b"}}]},
                {"choices": [{"index": 0, "delta": {"content": "a",
                                                    "reasoning_content": "think"}}]}])
    capture, scanner = StreamCapture(), StreamScanner(strip_usage=False)
    capture.feed(raw)
    scanner.feed(raw)
    scanner.flush()
    assert capture.text() == scanner.delivered_text() == "abthink"


def test_stream_capture_is_bounded() -> None:
    """A long stream keeps TEXT_CAP characters; an endless line is dropped, not held."""
    capture = StreamCapture()
    piece = _sse([{"choices": [{"delta": {"content": "z" * 1000}}]}])
    for _ in range(100):
        capture.feed(piece)
    assert len(capture.text()) == TEXT_CAP
    capture = StreamCapture()
    for _ in range(300):  # 3 MB without a line break
        capture.feed(b"data: " + b"q" * 10_000)
    assert len(capture._partial) <= 1 << 20
    capture.feed(b"\n\n" + _sse(_EVENTS[1:2]))
    assert capture.text() == "hello"


def test_tap_forwards_the_same_bytes_and_keeps_a_short_tail() -> None:
    """The tap returns exactly the scanner's bytes and keeps only the last chunks."""
    raw = _sse(_EVENTS)
    chunks = [raw[i:i + 9] for i in range(0, len(raw), 9)]
    plain, tapped = StreamScanner(strip_usage=True), Tap(StreamScanner(strip_usage=True))
    assert [plain.feed(c) for c in chunks] == [tapped.feed(c) for c in chunks]
    assert plain.flush() == tapped.flush()
    assert tapped.delivered_text() == plain.delivered_text()
    assert tapped.usage == plain.usage and tapped.done == plain.done
    assert len(tapped.tail) == 4


def test_stream_finish_reason_from_the_tail() -> None:
    """The last finish reason in the tail; an Anthropic stop reason under its chat name."""
    tap = Tap(StreamScanner(strip_usage=False))
    tap.feed(_sse(_EVENTS))
    assert stream_finish_reason(tap.tail) == "stop"
    tap.feed(b'event: message_delta\ndata: {"delta":{"stop_reason":"max_tokens"}}\n\n')
    assert stream_finish_reason(tap.tail) == "length"
    assert stream_finish_reason(Tap(StreamScanner(strip_usage=False)).tail) is None


def test_store_stays_bounded() -> None:
    """Many comparisons over many models: rings, examples and models keep their sizes."""
    store = ShadowComparisons(keep=16, examples=3, max_models=4, max_versions=2)
    for i in range(5_000):
        outcome = ("agree", "disagree", "error")[i % 3]
        store.add(_comparison(model=f"m{i % 7}", outcome=outcome, version=f"v{i % 5}",
                              texts=("p", "s")))
    assert len(store.models()) == 4
    for entry in store._models.values():
        assert len(entry.recent) <= 16
        assert len(entry.examples) <= 3
        assert len(entry.counts) <= 2
    for _ in range(100):  # one model, many versions
        store.add(_comparison(model="m6", outcome="disagree", version=f"x{_}"))
    entry = store._models["m6"]
    assert (len(entry.recent), len(entry.examples), len(entry.counts)) == (16, 3, 2)
    assert repr(store).startswith("<ShadowComparisons [models: 4 |")


def test_store_keeps_texts_only_for_disagreeing_examples() -> None:
    """An agreeing comparison's texts are dropped; an example without texts says why."""
    store = ShadowComparisons()
    store.add(_comparison(outcome="agree", texts=("a", "a")))
    store.add(_comparison(outcome="disagree", texts=("a", "b")))
    store.add(_comparison(outcome="disagree", texts=None))
    assert all(c.texts is None for c in store._models["m"].recent
               if c.outcome == "agree")
    first, second = store.summary("m")["disagreeing"]
    assert (first["primary"]["text"], first["shadow"]["text"]) == ("a", "b")
    assert "text" not in second["primary"] and "not recorded" in second["content"]


def test_agreement_and_summary_figures() -> None:
    """Counts by version, the agreement rate without errors, latency and token ratios."""
    store = ShadowComparisons()
    for ttft, duration in ((10.0, 100.0), (20.0, 200.0)):
        store.add(_comparison(
            primary=_ok(None, ttft_ms=ttft, duration_ms=duration, output_tokens=10,
                        finish_reason="stop"),
            shadow=_ok(None, ttft_ms=2 * ttft, duration_ms=duration / 2, output_tokens=5,
                       finish_reason="length")))
    store.add(_comparison(outcome="disagree", version="v3"))
    store.add(_comparison(outcome="error",
                          shadow=Answer(status=None, ok=False, error="no answer")))
    assert store.agreement("m") == (2, 3)
    assert store.agreement("m", "v2") == (2, 2)
    assert store.agreement("m", "v3") == (0, 1)
    assert store.agreement("other") == (0, 0)
    summary = store.summary("m")
    assert summary["compared"] == {"agree": 2, "disagree": 1, "error": 1}
    assert summary["agreement_rate"] == pytest.approx(2 / 3)
    assert summary["versions"]["v2"]["agreement_rate"] == 1.0
    window = summary["window"]
    assert window["ttft"]["ratio_p50"] == pytest.approx(2.0)
    assert window["ttft"]["ratio_p90"] == pytest.approx(2.0)
    assert window["duration"]["ratio_p90"] == pytest.approx(0.5)
    assert window["output_tokens_ratio"] == pytest.approx(0.5)
    assert window["finish_reason_match"] == 0.0
    assert window["status"] == {"primary": {"200": 4}, "shadow": {"200": 3, "none": 1}}
    json.dumps(summary)  # JSON-ready


def test_ttfts_of_one_version_since_a_time() -> None:
    """What a rollout's shadow stage reads: (primary, shadow) TTFTs in seconds of the named
    version's compared answers since a wall-clock time; errors and other versions left out."""
    store = ShadowComparisons()
    for at, version, outcome, ttfts in [(10.0, "v2", "agree", (100, 150)),
                                        (20.0, "v2", "disagree", (200, 260)),
                                        (20.0, "v3", "agree", (50, 50)),
                                        (30.0, "v2", "error", (10, 10)),
                                        (5.0, "v2", "agree", (1, 1))]:
        c = _comparison(version=version, outcome=outcome,
                        primary=_ok(None, ttft_ms=ttfts[0]), shadow=_ok(None, ttft_ms=ttfts[1]))
        c.at = at
        store.add(c)
    assert store.ttfts("m", "v2", since=8.0) == ([0.1, 0.2], [0.15, 0.26])
    assert store.ttfts("m", "v3", since=0.0) == ([0.05], [0.05])
    assert store.ttfts("other", "v2", since=0.0) == ([], [])
