"""The output a stream sent, counted as its engine counts it (``StreamScanner.output_sent``),
for a continuation on another backend (issue 38): one token a chunk that carried output, never
more than the engine's tokens; the engine's own running count where the chunks carry it
(llama.cpp's ``timings.predicted_n`` with ``timings_per_token``, vLLM's per-chunk usage with
``continuous_usage_stats``), exact; and once continued, the tokens sent before plus the
continuation's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.accounting.split import PromptSplit
from gateway.accounting.sse import StreamScanner
from gateway.accounting.tokens import account

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
           **extra: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return _event({**HEAD, "choices": [choice], **extra})


def _timings(predicted: Any, prompt: Any = 1, cached: Any = 34) -> dict[str, Any]:
    """llama.cpp's per-token ``timings`` (the prompt is ``prompt_n + cache_n``)."""
    return {"cache_n": cached, "prompt_n": prompt, "prompt_ms": 5.2,
            "predicted_n": predicted, "predicted_ms": 4.4, "predicted_per_second": 223.8}


ROLE = _chunk({"role": "assistant", "content": None})


def _scanner(keep_chunks: bool, strip: bool = False) -> StreamScanner:
    """The scanner of a chat stream passed through (events decoded in batches) or of one
    translated (``keep_chunks``: each decoded at once)."""
    return StreamScanner(strip_usage=strip, keep_chunks=keep_chunks)


@pytest.fixture(params=[False, True], ids=["passed-through", "translated"])
def keep(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_without_engine_counts_a_chunk_of_text_is_a_token(keep: bool) -> None:
    """The role chunk, an empty content and a finish carry no text; each chunk of text counts
    one (at least one token of the engine's), never exact."""
    scanner = _scanner(keep)
    assert scanner.output_sent() == (0, True)  # nothing sent: nothing to doubt
    scanner.feed(ROLE + _chunk({"content": ""}) + _chunk({"content": " Once"})
                 + _chunk({"content": " upon a"}))  # a chunk of two tokens counts one
    assert scanner.output_sent() == (2, False)
    assert not scanner.finished
    scanner.feed(_chunk({"content": " time"}, finish="length"))
    assert scanner.output_sent() == (3, False) and scanner.finished


def test_a_completions_stream_counts_its_text_chunks(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_event({**HEAD, "choices": [{"index": 0, "text": " a"}]})
                 + _event({**HEAD, "choices": [{"index": 0, "text": ""}]}))
    assert scanner.output_sent() == (1, False)


def test_llamacpps_running_count_is_exact(keep: bool) -> None:
    """With ``timings_per_token`` every chunk says how many tokens its engine generated: a
    token that ended inside a UTF-8 character went out with the next one (2 chunks, 3
    tokens), and the count says 3; the prompt is ``prompt_n + cache_n``."""
    scanner = _scanner(keep)
    scanner.feed(ROLE + _chunk({"content": " A"}, timings=_timings(1))
                 + _chunk({"content": " é"}, timings=_timings(3)))
    assert scanner.output_sent() == (3, True)
    assert scanner.first_prompt == 35


def test_chunks_after_the_last_count_add_one_each(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}, timings=_timings(4)) + _chunk({"content": " B"}))
    assert scanner.output_sent() == (5, False)


@pytest.mark.parametrize("odd", [-1, True, 2.0, "3", None], ids=str)
def test_a_running_count_that_is_no_count_is_ignored(keep: bool, odd: Any) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}, timings=_timings(odd, prompt=odd))
                 + _chunk({"content": " B"}, timings="soon"))
    assert scanner.output_sent() == (2, False)
    assert scanner.first_prompt is None
    assert scanner.reply_text() == " A B"  # the chunks themselves are read as ever


def test_a_count_below_one_token_a_chunk_is_not_believed(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}) + _chunk({"content": " B"})
                 + _chunk({"content": " C"}, timings=_timings(1)))
    assert scanner.output_sent() == (3, False)


@pytest.mark.parametrize("strip", [False, True], ids=["client-usage", "stripped"])
def test_vllms_usage_on_every_chunk_is_exact(keep: bool, strip: bool) -> None:
    """``continuous_usage_stats``: each chunk's usage counts the tokens so far."""
    scanner = _scanner(keep, strip)
    usage = {"prompt_tokens": 21, "completion_tokens": 1, "total_tokens": 22}
    scanner.feed(_chunk({"role": "assistant", "content": ""}, usage={**usage,
                                                                     "completion_tokens": 0})
                 + _chunk({"content": " A"}, usage=usage)
                 + _chunk({"content": " Bc"}, usage={**usage, "completion_tokens": 3}))
    assert scanner.output_sent() == (3, True)
    assert scanner.first_prompt == 21


def test_a_usage_sent_before_the_break_is_the_engines_count(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}) + _chunk({"content": " B"}) + _chunk(finish="stop")
                 + _event({**HEAD, "choices": [], "usage": {
                     "prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}))
    assert scanner.output_sent() == (3, True)
    assert scanner.first_prompt == 9 and scanner.finished


def test_a_continuation_counts_on_from_the_tokens_sent(keep: bool) -> None:
    """Continued after 3 tokens: the continuation's ``predicted_n`` counts from 1 again, its
    usage (spliced: the whole answer's) counts from 0; the first engine's prompt stays, and
    the usage read from now on says which figures are the gateway's."""
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}, timings=_timings(1))
                 + _chunk({"content": " Bc"}, timings=_timings(3)))
    scanner.continued(3, True, "continued:completion_tokens")
    assert scanner.output_sent() == (3, True)
    scanner.feed(_chunk({"content": " D"}, timings=_timings(1, prompt=40, cached=0)))
    assert scanner.output_sent() == (4, True)
    assert scanner.first_prompt == 35  # the first engine's, not the continuation's
    scanner.feed(_chunk({"content": " E"}))
    assert scanner.output_sent() == (5, False)
    scanner.feed(_chunk(finish="length") + _event({**HEAD, "choices": [], "usage": {
        "prompt_tokens": 35, "completion_tokens": 6, "total_tokens": 41}}))
    assert scanner.output_sent() == (6, True)
    assert scanner.usage is not None and scanner.usage.completion_tokens == 6
    assert scanner.usage.estimated == "continued:completion_tokens"


def test_a_continuation_after_a_chunk_count_stays_a_count(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}) + _chunk({"content": " B"}))
    scanner.continued(*scanner.output_sent())
    scanner.feed(_chunk({"content": " C"}, timings=_timings(2)))
    assert scanner.output_sent() == (4, False)  # 2 counted + 2 of the engine's


def test_an_estimated_figure_marks_the_record_estimated() -> None:
    """A continued stream's usage is billed as read; a figure of the gateway's in it makes
    the record ``estimated``, with the reason; none: not estimated."""
    scanner = StreamScanner(strip_usage=False)
    scanner.continued(2, False, "continued:prompt_tokens,completion_tokens")
    scanner.feed(_event({**HEAD, "choices": [], "usage": {
        "prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}}))
    usage = account(PromptSplit(new=17), scanner.usage)
    assert (usage.prompt_total, usage.output) == (17, 5)
    assert usage.estimated and \
        usage.estimate_reason == "continued:prompt_tokens,completion_tokens"
    plain = StreamScanner(strip_usage=False)
    plain.feed(_event({**HEAD, "choices": [], "usage": {
        "prompt_tokens": 35, "completion_tokens": 5, "total_tokens": 40}}))
    usage = account(PromptSplit(new=17), plain.usage)
    assert (usage.prompt_total, usage.estimated, usage.estimate_reason) == (35, False, None)


def test_a_usage_not_believed_says_nothing(keep: bool) -> None:
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}, usage={"prompt_tokens": None, "completion_tokens": 9,
                                                "total_tokens": 9}))
    assert scanner.usage is not None and scanner.usage.rejected is not None
    assert scanner.output_sent() == (1, False) and scanner.first_prompt is None


def test_llamacpps_prompt_needs_both_its_parts(keep: bool) -> None:
    """``prompt_n`` alone is what it prefilled, not its prompt (the rest read from its
    cache): without ``cache_n`` there is no prompt figure; the running count still holds."""
    scanner = _scanner(keep)
    scanner.feed(_chunk({"content": " A"}, timings={"prompt_n": 1, "predicted_n": 1}))
    assert scanner.output_sent() == (1, True) and scanner.first_prompt is None
