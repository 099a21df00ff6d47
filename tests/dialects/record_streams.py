"""A pytest plugin that writes ``recorded_streams.json``: the stream translators' calls and bytes.

Run the folder's tests with it to record what the Messages and Responses translators write::

    RECORD_OUT=tests/dialects/recorded_streams.json PYTHONPATH=.:tests/dialects \\
        python -m pytest tests/dialects -q -p record_streams -p no:cacheprovider

Every translator made during the run is wrapped: its arguments and each outermost ``feed`` /
``finish`` / ``fail`` call (a ``fail`` a ``feed`` makes itself is part of that feed) with its
input and output. The file keeps a sample small enough to read: per kind of stream (API, the
sequence of event types, the calls other than ``feed``, split reads or not) the smallest case
and one with many reads, plus a few cases per input feature (CRLF, comments, tool calls,
reasoning, refusals, errors, usage, ...), each under 12 KB.
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Any

from gateway.dialects import messages as _messages
from gateway.dialects.responses import stream as _responses

_CASES: list[dict[str, Any]] = []
_OPEN: dict[int, dict[str, Any]] = {}
_DEPTH: dict[int, int] = {}
_FEATURES = ("\r\n", "\n: ", "tool_calls", "reasoning", "refusal", "error", 'usage":{',
             "[DONE]", "stop_reason", "event:", "data:{", 'finish_reason":"length',
             "content_filter")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _wrap(cls: Any, api: str) -> None:
    init, feed, finish, fail = cls.__init__, cls.feed, cls.finish, cls.fail

    def call(self: Any, op: str, arg: Any, fn: Any, *args: Any) -> bytes:
        _DEPTH[id(self)] = _DEPTH.get(id(self), 0) + 1
        try:
            out: bytes = fn(self, *args)
        finally:
            _DEPTH[id(self)] -= 1
        if not _DEPTH[id(self)]:
            _OPEN[id(self)]["calls"].append([op, arg, _text(out)])
        return out

    def __init__(self: Any, **kw: Any) -> None:
        init(self, **kw)
        _OPEN[id(self)] = case = {"api": api, "init": dict(kw), "calls": []}
        _CASES.append(case)

    cls.__init__ = __init__
    cls.feed = lambda self, chunk: call(self, "feed", _text(chunk), feed, chunk)
    cls.finish = lambda self: call(self, "finish", None, finish)
    cls.fail = lambda self, error: call(
        self, "fail", [type(error).__name__, error.message, error.param, error.error_code],
        fail, error)


_wrap(_messages.MessagesStream, "messages")
_wrap(_responses.ResponsesStream, "responses")


def _kind(case: dict[str, Any]) -> tuple[Any, ...]:
    types = re.findall(r"event: (\S+)", "".join(c[2] for c in case["calls"]))
    runs = [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]
    others = tuple(c[0] for c in case["calls"] if c[0] != "feed")
    return case["api"], tuple(runs), others, len(case["calls"]) > 3


def sample(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases the file keeps (see the module docstring)."""
    size = {id(c): len(json.dumps(c)) for c in cases}
    kinds: dict[tuple[Any, ...], list[dict[str, Any]]] = collections.defaultdict(list)
    for case in cases:
        kinds[_kind(case)].append(case)
    keep: list[dict[str, Any]] = []
    for group in kinds.values():
        group.sort(key=lambda c: size[id(c)])
        keep.append(group[0])
        split = [c for c in group if len(c["calls"]) > 6 and size[id(c)] < 12000]
        if split and split[0] is not group[0]:
            keep.append(split[0])
    by_feature: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for case in cases:
        if size[id(case)] < 4000 and case not in keep:
            fed = "".join(c[1] for c in case["calls"] if c[0] == "feed")
            for feature in _FEATURES:
                if feature in fed:
                    by_feature[(case["api"], feature)].append(case)
    for group in by_feature.values():
        keep.extend(c for c in group[:3] if c not in keep)
    return [c for c in keep if size[id(c)] < 12000]


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    cases = [c for c in _CASES if c["calls"]]
    unique = list({json.dumps(c): c for c in cases}.values())
    with open(os.environ["RECORD_OUT"], "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c) for c in sample(unique)) + "\n]\n")
