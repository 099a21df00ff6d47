"""The Responses stream's byte templates against the dict translator they replaced.

``ResponsesStream`` writes its events from byte templates; ``responses_reference`` keeps the
translator that encoded every event as a dict. For varied chat streams (reasoning, text,
refusals, tool calls by index or by id, a call resumed after another, arguments as objects,
every finish reason, usage or none, a backend error, no ``[DONE]``, a failure mid-stream, any
unicode) and varied requests (none, the usual short one, every echoed setting), fed in the
same reads, both must return the same bytes from every call and the same ``final``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.dialects.base import StreamTranslator
from gateway.dialects.responses.stream import ResponsesStream
from gateway.errors import BackendFailure, UpstreamTimeout

from .responses_reference import DictResponsesStream
from .sse import HEAD, split_at

_text = st.text(max_size=12)


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, *,
           created: bool = True) -> dict[str, Any]:
    """One chat chunk of choice 0 (``created``: False leaves the key out)."""
    chunk: dict[str, Any] = {**HEAD, "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    if not created:
        del chunk["created"]
    return chunk


_call = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 1),
        "id": st.sampled_from(["call_a", "call_b", "call_é"]),
        "function": st.fixed_dictionaries({}, optional={
            "name": st.sampled_from(["get_weather", "lookup", "ñ"]),
            "arguments": st.one_of(_text, st.dictionaries(_text, st.integers(), max_size=2)),
        }),
    },
)

_chunks = st.one_of(
    st.builds(lambda t: _chunk({"content": t}), _text),
    st.builds(lambda t: _chunk({"reasoning_content": t}), _text),
    st.builds(lambda t: _chunk({"reasoning": t}), _text),
    st.builds(lambda t: _chunk({"refusal": t}), _text),
    st.builds(lambda t: _chunk({"role": "assistant", "content": t}), _text),
    st.builds(lambda calls: _chunk({"tool_calls": calls}), st.lists(_call, min_size=1,
                                                                     max_size=2)),
    st.builds(lambda f: _chunk({}, f),
              st.sampled_from(["stop", "length", "tool_calls", "content_filter"])),
    st.builds(lambda u: {**HEAD, "choices": [], "usage": u}, st.fixed_dictionaries({
        "prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99),
        "total_tokens": st.integers(0, 200)})),
    st.just({**HEAD, "choices": [{"index": 1, "delta": {"content": "n"}}]}),
    st.just(_chunk({"content": "late"}, created=False)),
)

_requests = st.one_of(
    st.none(),
    st.fixed_dictionaries({"model": st.just("m"), "input": st.just("hi")}, optional={
        "max_output_tokens": st.integers(1, 99), "store": st.booleans(),
        "stream": st.just(True)}),
    st.fixed_dictionaries({"model": st.just("m"), "input": st.just("hi")}, optional={
        "instructions": _text, "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "tools": st.just([{"type": "function", "name": "f", "parameters": {}}]),
        "parallel_tool_calls": st.booleans(), "user": _text,
        "metadata": st.dictionaries(_text, _text, max_size=2),
        "text": st.just({"format": {"type": "text"}, "verbosity": "low"}),
        "reasoning": st.just({"effort": "low"}), "truncation": st.just("auto"),
        "previous_response_id": st.just("resp_1"), "store": st.booleans()}),
)


def _encoded(chunk: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return _chunk({"tool_calls": list(calls)})


#: streams the random ones seldom hit: a call resumed after the next one opened (its
#: arguments go to the final object only), several items each ending at the length limit
_EXAMPLES = [
    [_chunk({"reasoning_content": "think"}), _chunk({"content": "héllo"}),
     _calls({"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"a\""}}),
     _calls({"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}),
     _calls({"index": 0, "function": {"arguments": ":1}"}}), _chunk({}, "tool_calls"),
     {**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                       "total_tokens": 7}}],
    [_chunk({"content": "a"}), _chunk({"refusal": "no"}), _chunk({"content": "b"}),
     _chunk({"reasoning": "r"}), _chunk({"content": "\u2603\U0001f600"}), _chunk({}, "length")],
]


def _compare(chunks: list[dict[str, Any]], request: dict[str, Any] | None, model: str,
             request_id: str, ending: str, cuts: list[int]) -> None:
    """Both translators fed the same reads: the same bytes from every call, the same final
    object and usage."""
    # the first chunk carries ``created``: without one, both would read the clock, perhaps
    # on either side of a second
    data = b"".join(_encoded(c) for c in [_chunk({"role": "assistant"}), *chunks])
    if ending == "done":
        data += b"data: [DONE]\n\n"
    elif ending == "error-chunk":
        data += _encoded({"error": {"message": "overloaded"}})
    streams: list[StreamTranslator] = [
        cls(model=model, request_id=request_id, prompt_tokens=7, request=request)
        for cls in (ResponsesStream, DictResponsesStream)]
    new, old = streams
    for read in split_at(data, cuts):
        assert new.feed(read) == old.feed(read)
    if ending == "fail":
        error = UpstreamTimeout("the backend did not answer in time")
        assert new.fail(error) == old.fail(error)
    else:
        assert new.finish() == old.finish()
    assert new.fail(BackendFailure("late")) == old.fail(BackendFailure("late"))
    assert isinstance(new, ResponsesStream) and isinstance(old, DictResponsesStream)
    assert new.final == old.final
    assert new.usage == old.usage


@pytest.mark.parametrize("chunks", _EXAMPLES, ids=["call-resumed", "items-at-length"])
@pytest.mark.parametrize("ending", ["done", "finish", "fail"])
def test_templates_on_the_rare_streams(chunks: list[dict[str, Any]], ending: str) -> None:
    _compare(chunks, {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}]},
             "m", "req-1", ending, [])


@settings(max_examples=400, deadline=None)
@given(
    chunks=st.lists(_chunks, max_size=14),
    request=_requests,
    model=st.sampled_from(["m", "gpt-ü", 'q"uote']),
    request_id=st.sampled_from(["req-1", "r\u00e9q", "id\\x"]),
    ending=st.sampled_from(["done", "finish", "fail", "error-chunk", "nothing"]),
    cuts=st.lists(st.integers(0, 4000), max_size=6),
)
def test_templates_write_the_dict_translators_bytes(
        chunks: list[dict[str, Any]], request: dict[str, Any] | None, model: str,
        request_id: str, ending: str, cuts: list[int]) -> None:
    """The same bytes from every call, and the same final object."""
    _compare(chunks, request, model, request_id, ending, cuts)
