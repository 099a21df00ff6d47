"""The public model name in every answer, whatever the engine calls its model (issue 36, 3).

A differential property: random JSON answers and SSE streams, in the encodings real engines
write (compact, Python's spaced and ASCII-escaped, ``\\/`` for a slash), with the engine's
model name anywhere among the top-level members, cut at random chunk boundaries: what comes
out, parsed, is what went in with only the top-level ``model`` (and, given one, ``id``) value
replaced; names inside strings and other members' values stay as they were.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.upstream.rename import AnswerRewriter, RenamingScanner

PUBLIC = "chat-model"
NEW_ID = "chatcmpl-" + "cd" * 16
ENGINE_NAMES = ["/models/tiny.gguf", "llama3:8b", 'we"ird\\na/me \u00e9\u2028 \U0001f600',
                "/data/models--Qwen/snapshots/abc", "sim-model", "m"]

_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8)
_keys = st.sampled_from(["model", "id", "choices", "delta", "x", "model_name", "a b", "\u00e9"])


def _json(names: list[str]) -> st.SearchStrategy[Any]:
    """JSON values whose strings may hold model-member-looking text."""
    member_texts = st.sampled_from(
        [f'"model":"{n}"' for n in names] + [f'"model": {json.dumps(n)}' for n in names])
    leaves = _scalars | member_texts | st.sampled_from(names)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(_keys, inner, max_size=3), max_leaves=8)


@st.composite
def _objects(draw: st.DrawFn, name: str, count: int, with_id: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        members = draw(st.dictionaries(
            st.sampled_from(["choices", "object", "created", "usage", "x", "timings"]),
            _json([name, PUBLIC]), max_size=4))
        # nested "model" members never hold the engine's very name (those are rewritten too)
        assume(not _nested_holds(members, name))
        items = list(members.items())
        if i == 0 or draw(st.booleans()):
            items.insert(draw(st.integers(0, len(items))), ("model", name))
        if with_id:
            items.insert(draw(st.integers(0, len(items))), ("id", "chatcmpl-7"))
        out.append(dict(items))
    return out


def _nested_holds(value: Any, name: str) -> bool:
    if isinstance(value, dict):
        return value.get("model") == name or any(_nested_holds(v, name) for v in value.values())
    if isinstance(value, list):
        return any(_nested_holds(v, name) for v in value)
    return False


def _encode(obj: Any, style: str) -> bytes:
    if style == "compact":
        return msgspec.json.encode(obj)
    if style == "python":  # json.dumps defaults: ", " and ": ", ASCII with \\u escapes
        return json.dumps(obj).encode()
    if style == "utf8":
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return json.dumps(obj, separators=(",", ":")).replace("/", "\\/").encode()  # PHP-like


def _expected(obj: dict[str, Any], with_id: bool) -> dict[str, Any]:
    want = dict(obj)
    if "model" in want:
        want["model"] = PUBLIC
    if with_id:
        want["id"] = NEW_ID
    return want


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


_styles = st.sampled_from(["compact", "python", "utf8", "slashes"])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(ENGINE_NAMES), style=_styles,
       with_id=st.booleans())
def test_a_whole_answer_has_only_its_model_replaced(data: st.DataObject, name: str,
                                                    style: str, with_id: bool) -> None:
    obj = data.draw(_objects(name, 1, with_id))[0]
    body = _encode(obj, style)
    rewriter = AnswerRewriter(PUBLIC, NEW_ID if with_id else None, "configured-name")
    out = rewriter.whole(body)
    assert json.loads(out) == _expected(obj, with_id)
    assert rewriter.backend_model == name


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(ENGINE_NAMES), style=_styles,
       with_id=st.booleans(), count=st.integers(1, 5),
       cuts=st.lists(st.integers(0, 3000), max_size=16), crlf=st.booleans())
def test_a_stream_cut_anywhere_has_only_its_model_replaced(
        data: st.DataObject, name: str, style: str, with_id: bool, count: int,
        cuts: list[int], crlf: bool) -> None:
    events = data.draw(_objects(name, count, with_id))
    nl = b"\r\n" if crlf else b"\n"
    stream = b"".join(b"data: " + _encode(e, style) + nl + nl for e in events)
    stream += b"data: [DONE]" + nl + nl
    rewriter = AnswerRewriter(PUBLIC, NEW_ID if with_id else None, "configured-name")
    out = b"".join(rewriter.chunk(p) for p in _cut(stream, cuts)) + rewriter.flush()
    got = [json.loads(line[6:]) for line in out.splitlines() if line.startswith(b"data: {")]
    assert got == [_expected(e, with_id) for e in events]
    assert out.endswith(b"data: [DONE]" + nl + nl)
    assert rewriter.backend_model == name


@settings(max_examples=100, deadline=None)
@given(data=st.data(), name=st.sampled_from(ENGINE_NAMES), style=_styles,
       cuts=st.lists(st.integers(0, 3000), max_size=16))
def test_through_the_stream_scanner(data: st.DataObject, name: str, style: str,
                                    cuts: list[int]) -> None:
    events = data.draw(_objects(name, 3, True))
    stream = b"".join(b"data: " + _encode(e, style) + b"\n\n" for e in events)
    stream += b"data: [DONE]\n\n"
    scanner = RenamingScanner(AnswerRewriter(PUBLIC, NEW_ID, "x"), strip_usage=False)
    out = b"".join(scanner.feed(p) for p in _cut(stream, cuts)) + scanner.flush()
    got = [json.loads(line[6:]) for line in out.splitlines() if line.startswith(b"data: {")]
    assert got == [_expected(e, True) for e in events]


def test_only_the_value_bytes_change() -> None:
    body = b'{"id":"x","model" :  "\\/models\\/tiny.gguf","choices":[{"text":"hi"}]}'
    out = AnswerRewriter(PUBLIC, None, "tiny").whole(body)
    assert out == b'{"id":"x","model" :  "chat-model","choices":[{"text":"hi"}]}'


def test_nested_model_of_responses_and_messages_streams() -> None:
    for nest in ("response", "message"):
        rewriter = AnswerRewriter(PUBLIC, "resp_new", "tiny")
        first = b'event: x\ndata: {"type":"t","%s":{"id":"r1","model":"llama3:8b"}}\n\n' % (
            nest.encode())
        later = b'data: {"type":"u","%s":{"id":"r1","model":"llama3:8b"}}\n\n' % nest.encode()
        out = rewriter.chunk(first[:20]) + rewriter.chunk(first[20:]) + rewriter.chunk(later)
        assert b"llama3:8b" not in out and out.count(b'"model":"chat-model"') == 2
        assert rewriter.backend_model == "llama3:8b"


def test_an_answer_without_a_model_keeps_the_configured_fallback() -> None:
    rewriter = AnswerRewriter(PUBLIC, None, "tiny")
    first = b'data: {"error":{"message":"x"}}\n\n'
    later = b'data: {"model":"tiny","choices":[]}\n\n'
    out = rewriter.chunk(first) + rewriter.chunk(later) + rewriter.flush()
    assert out == first + b'data: {"model":"chat-model","choices":[]}\n\n'
    assert rewriter.backend_model is None


def test_the_public_name_already_is_left_alone() -> None:
    body = b'{"model":"chat-model","id":"x"}'
    rewriter = AnswerRewriter(PUBLIC, None, PUBLIC)
    assert rewriter.whole(body) is body
    assert rewriter.backend_model == PUBLIC
