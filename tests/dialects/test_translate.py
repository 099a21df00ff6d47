"""``TranslatingScanner``: a translated stream is decoded once, and metered from that decode.

The usage scanner and the front-end's translator used to decode every chat event each; now the
translator reads the chunks its scanner decoded (``StreamScanner(keep_chunks=True)``). The
count of JSON decodes per stream is what would regress if a translator went back to decoding
the events itself, so it is counted (with cProfile, which sees every call of msgspec's C
decoders) rather than timed.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

import pytest

from gateway.dialects.registry import FRONTENDS
from gateway.dialects.translated_stream import TranslatingScanner

from .sse import chat_stream

ANSWER: dict[str, Any] = {
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}}],
    "usage": {"prompt_tokens": 31, "completion_tokens": 12, "total_tokens": 43},
}
CONTENT = ["Let", " me", " look."]
ARGUMENTS = [['{"city"', ': "Par', 'is"}']]


def _decodes(profile: cProfile.Profile) -> int:
    """Calls of msgspec's JSON decoders (a ``Decoder``'s method and ``msgspec.json.decode``)."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(calls for (_, _, name), (calls, *_) in stats.items()
               if "decode" in name and "msgspec" in name)


@pytest.mark.parametrize("api", sorted(FRONTENDS))
@pytest.mark.parametrize("piece", [0, 9], ids=["one-read", "9-byte-reads"])
def test_each_chat_event_is_decoded_once(api: str, piece: int) -> None:
    """One decode per data event of the chat stream (``[DONE]`` is not JSON), whatever the
    reads; the scanner still meters the stream (usage, delivered text) from it."""
    sse = chat_stream(ANSWER, content_pieces=CONTENT, argument_pieces=ARGUMENTS)
    events = sse.count(b"data: {")
    translator = FRONTENDS[api].stream(model="m", request_id="req-1", prompt_tokens=31,
                                       request={"model": "m", "input": "x"})
    scanner = TranslatingScanner(translator)
    size = piece or len(sse)
    profile = cProfile.Profile()
    profile.enable()
    out = b"".join(scanner.feed(sse[i:i + size]) for i in range(0, len(sse), size))
    out += scanner.flush()
    profile.disable()
    assert _decodes(profile) == events
    assert scanner.done and scanner.usage is not None and scanner.usage.completion_tokens == 12
    assert scanner.delivered_text() == 'Let me look.get_weather{"city": "Paris"}'
    assert b"Par" in out and b"look." in out


@pytest.mark.parametrize("api", sorted(FRONTENDS))
def test_an_event_past_the_relay_bound_is_still_translated(api: str) -> None:
    """A backend that sends the whole answer as one event (3 MiB here, past the 1 MiB a
    relayed chat stream's scanner reads) still has it translated, and metered, in 64 KiB reads."""
    text = "word " * (600 << 10)
    answer = {"choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": text}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 614400, "total_tokens": 614403}}
    sse = chat_stream(answer)
    translator = FRONTENDS[api].stream(model="m", request_id="req-1", prompt_tokens=3,
                                       request={"model": "m", "input": "x"})
    scanner = TranslatingScanner(translator)
    out = b"".join(scanner.feed(sse[i:i + 65536]) for i in range(0, len(sse), 65536))
    out += scanner.flush()
    assert scanner.delivered_text() == text
    assert scanner.usage is not None and scanner.usage.completion_tokens == 614400
    assert out.count(text.encode()) >= 1
