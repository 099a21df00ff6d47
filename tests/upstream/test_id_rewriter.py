"""The gateway's id in place of the backend's, however a stream is cut (issue 34, point 5)."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.rename import IdRewriter

NEW = "chatcmpl-" + "ab" * 16


def _chat_stream(backend_id: str) -> bytes:
    events = [{"id": backend_id, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {"content": f"w{i} \"id\":\"x\""}}]}
              for i in range(5)]
    events.append({"id": backend_id, "choices": [{"index": 0, "delta": {"tool_calls": [
        {"id": backend_id + "-not-top", "function": {"name": "f"}}]}}]})
    return b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(0, 2000), max_size=12), spaced=st.booleans())
def test_a_stream_cut_anywhere_comes_out_whole(cuts: list[int], spaced: bool) -> None:
    data = _chat_stream("chatcmpl-sim000000000001")
    if spaced:
        data = data.replace(b'{"id":', b'{"id": ')
    want = data.replace(b'"chatcmpl-sim000000000001"', msgspec.json.encode(NEW))
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    rewriter = IdRewriter(NEW)
    out = b"".join(rewriter.chunk(p) for p in pieces) + rewriter.flush()
    assert out == want
    assert rewriter.backend_id == "chatcmpl-sim000000000001"


def test_nested_ids_of_responses_and_messages_streams() -> None:
    for nest in ("response", "message"):
        rewriter = IdRewriter("resp_new")
        first = b'event: x\ndata: {"type":"t","%s":{"id":"resp_old"}}\n\n' % nest.encode()
        later = b'data: {"type":"u","%s":{"id":"resp_old","model":"m"}}\n\n' % nest.encode()
        out = rewriter.chunk(first[:9]) + rewriter.chunk(first[9:]) + rewriter.chunk(later)
        assert b"resp_old" not in out and out.count(b'"id":"resp_new"') == 2


def test_a_whole_body_and_bodies_it_leaves_alone() -> None:
    body = b'{"id":"cmpl-7","choices":[{"text":"\\"id\\":\\"cmpl-7\\""}],"model":"m"}'
    out = IdRewriter("cmpl-new").whole(body)
    assert msgspec.json.decode(out)["id"] == "cmpl-new"
    assert msgspec.json.decode(out)["choices"][0]["text"] == '"id":"cmpl-7"'
    assert IdRewriter("x").whole(b"not json") == b"not json"
    assert IdRewriter("x").whole(b'{"object":"list"}') == b'{"object":"list"}'
