"""Translated streams byte for byte as recorded: the translators' outputs must not drift.

``recorded_streams.json`` holds what the Messages and Responses stream translators wrote for
the chat streams of this folder's table and property tests (each case: the translator's
arguments, then every ``feed`` / ``finish`` / ``fail`` call with its input and output), recorded
at main 1a5293a, before the translators read the usage scanner's decoded chunks instead of
decoding each chunk again. Replaying them checks that sharing the decode changed no event, no
byte and no split point; and the same input fed in one read, or one byte at a time, must give
the same bytes in total (a translator never depends on where the backend's reads fall).

Regenerate (``record_streams.py`` says how) only on a deliberate change of the translated
events, and say so in the commit. Deliberate changes so far: issue 40 moved the Messages
``ping`` after the first ``content_block_start`` (where Anthropic sends it); the Messages
cases' outputs were rewritten by replaying their recorded inputs, the inputs unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gateway import errors
from gateway.dialects.registry import FRONTENDS

if TYPE_CHECKING:
    from gateway.dialects.base import StreamTranslator

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).with_name("recorded_streams.json")).read_text())


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _translator(case: dict[str, Any]) -> StreamTranslator:
    kw = case["init"]
    return FRONTENDS[case["api"]].stream(model=kw["model"], request_id=kw["request_id"],
                                         prompt_tokens=kw["prompt_tokens"],
                                         request=kw.get("request"))


def _error(args: list[Any]) -> errors.GatewayError:
    kind, message, param, code = args
    error: errors.GatewayError = getattr(errors, kind)(message, param=param, code=code)
    return error


def _ids() -> list[str]:
    return [f"{i:02d}-{c['api']}-{len(c['calls'])}calls" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_replay_gives_the_recorded_bytes(case: dict[str, Any]) -> None:
    """Every call returns exactly what it returned when recorded."""
    stream = _translator(case)
    for i, (op, arg, want) in enumerate(case["calls"]):
        if op == "feed":
            got = stream.feed(_bytes(arg))
        elif op == "finish":
            got = stream.finish()
        else:
            got = stream.fail(_error(arg))
        assert got == _bytes(want), f"call {i} ({op}) differs"


def _fed(case: dict[str, Any]) -> tuple[bytes, list[Any]]:
    """All the bytes fed before the first other call, and the calls after."""
    calls = case["calls"]
    n = next((i for i, call in enumerate(calls) if call[0] != "feed"), len(calls))
    return b"".join(_bytes(c[1]) for c in calls[:n]), calls[n:]


@pytest.mark.parametrize("case", CASES, ids=_ids())
@pytest.mark.parametrize("piece", [0, 1, 7], ids=["one-read", "bytewise", "7-bytes"])
def test_any_read_size_gives_the_same_bytes(case: dict[str, Any], piece: int) -> None:
    """The same input in other reads: the same bytes out in total."""
    data, rest = _fed(case)
    want = b"".join(_bytes(c[2]) for c in case["calls"])
    stream = _translator(case)
    size = piece or max(1, len(data))
    got = b"".join(stream.feed(data[i:i + size]) for i in range(0, len(data), size))
    for op, arg, _ in rest:
        if op == "feed":
            got += stream.feed(_bytes(arg))
        elif op == "finish":
            got += stream.finish()
        else:
            got += stream.fail(_error(arg))
    assert got == want
