"""One answer of a shadow comparison: its status, timings, output tokens, finish reason and
(capped) text, read from a whole body or a stream.

Both sides of a comparison are read into the same :class:`Answer`, from different places:

* the shadow's answer is parsed here as it arrives (:class:`StreamCapture` for a stream,
  :func:`read_body` for a whole body); text past :data:`TEXT_CAP` characters is dropped, so a
  long or endless shadow stream holds at most that much;
* the primary's answer comes from what the request already holds: the body the forward step
  read whole, or the stream scanner's delivered text (collected for accounting anyway), plus
  the last few raw chunks (:class:`Tap`, a bounded deque of references, no copy) for the
  finish reason. Capturing the primary therefore adds no parse and no buffering to its path;
  the body is decoded later, off the request's own task.

Text is "what the model generated": the content of every choice in index order, then reasoning
and tool-call names and arguments (the order ``StreamScanner.delivered_text`` uses); for an
Anthropic Messages body, its text blocks; for a Responses body, its output text parts. Finish
reasons are given their chat names (Anthropic's ``max_tokens`` reads ``length``).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from gateway.accounting import Scanner
    from gateway.accounting.usage import BackendUsage
    from gateway.errors import GatewayError

__all__ = ["TEXT_CAP", "Answer", "StreamCapture", "Tap", "read_body", "stream_finish_reason"]

#: characters of an answer's text kept for comparing (the rest is not compared)
TEXT_CAP = 16_384
#: a partial SSE line held between chunks, at most; a longer one is skipped unread
_MAX_LINE = 1 << 20
#: raw chunks at the end of a primary stream kept for its finish reason
_TAIL_CHUNKS = 4
_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([A-Za-z_]{1,32})"')
#: Anthropic stop reasons under their chat names, so a primary answered in Messages and a
#: shadow answered in chat compare like for like
_CHAT_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                "tool_use": "tool_calls"}


def _chat_finish(reason: str | None) -> str | None:
    return _CHAT_FINISH.get(reason, reason) if reason is not None else None


@dataclass(slots=True, kw_only=True)
class Answer:
    """One side of a comparison, as the store keeps it.

    Times are milliseconds from the moment the request was mirrored, so both sides are measured
    from the same instant: ``ttft_ms`` to the first body chunk of a stream (a whole body: to
    its last byte), ``duration_ms`` to the last byte received from the backend.
    """

    #: the backend's HTTP status; None: no answer (connect error, timeout, cut off)
    status: int | None
    #: a complete answer with a 2xx status (only such answers are compared)
    ok: bool
    ttft_ms: float | None = None
    duration_ms: float | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    #: what the model generated, at most TEXT_CAP characters; None when it carried no text
    text: str | None = None
    #: why the answer is not ok, in a few words of the gateway's own (never the answer's text)
    error: str | None = None

    def facts(self) -> dict[str, Any]:
        """The answer without its text, for the admin report."""
        return {"status": self.status, "ok": self.ok, "ttft_ms": self.ttft_ms,
                "duration_ms": self.duration_ms, "output_tokens": self.output_tokens,
                "finish_reason": self.finish_reason, "error": self.error}


# --- the JSON shapes read (every other field is skipped by the decoder) ----------------------
class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | list[Any] | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    delta: _Message | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Block(msgspec.Struct):
    text: str | None = None


class _Item(msgspec.Struct):
    content: list[_Block] | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None
    output_tokens: int | None = None


class _Body(msgspec.Struct):
    choices: list[_Choice] | None = None
    content: list[_Block] | None = None  # Anthropic Messages
    output: list[_Item] | None = None  # Responses
    stop_reason: str | None = None
    usage: _Usage | None = None


_decode = msgspec.json.Decoder(_Body).decode


class _Text:
    """Text by choice plus extras (reasoning, tool calls), kept to TEXT_CAP characters."""

    __slots__ = ("by_choice", "extra", "size")

    def __init__(self) -> None:
        self.by_choice: dict[int, list[str]] = {}
        self.extra: list[str] = []
        self.size = 0

    def add(self, index: int | None, piece: str | None) -> None:
        if not piece or self.size >= TEXT_CAP:
            return
        piece = piece[:TEXT_CAP - self.size]
        self.size += len(piece)
        (self.extra if index is None else self.by_choice.setdefault(index, [])).append(piece)

    def add_message(self, index: int, message: _Message) -> None:
        content = message.content
        if isinstance(content, list):  # content parts: their text
            content = "".join(p["text"] for p in content
                              if isinstance(p, dict) and isinstance(p.get("text"), str))
        self.add(index, content)
        self.add(None, message.reasoning_content)
        for call in message.tool_calls or ():
            if call.function is not None:
                self.add(None, call.function.name)
                self.add(None, call.function.arguments)

    def value(self) -> str:
        content = "".join("".join(self.by_choice[i]) for i in sorted(self.by_choice))
        return (content + "".join(self.extra))[:TEXT_CAP]


def _tokens(usage: _Usage | None) -> int | None:
    if usage is None:
        return None
    return usage.completion_tokens if usage.completion_tokens is not None \
        else usage.output_tokens


def read_body(body: bytes) -> tuple[str | None, str | None, int | None]:
    """(text, finish reason, output tokens) of a whole answer; Nones for a body not read."""
    try:
        parsed = _decode(body)
    except msgspec.DecodeError:
        return None, None, None
    text = _Text()
    finish = parsed.stop_reason
    for choice in parsed.choices or ():
        if choice.message is not None:
            text.add_message(choice.index, choice.message)
        text.add(choice.index, choice.text)
        finish = finish or choice.finish_reason
    for block in parsed.content or ():
        text.add(0, block.text)
    for item in parsed.output or ():
        for block in item.content or ():
            text.add(0, block.text)
    seen = parsed.choices is not None or parsed.content is not None or parsed.output is not None
    return (text.value() if seen else None), _chat_finish(finish), _tokens(parsed.usage)


class StreamCapture:
    """Reads a chat or completions SSE stream as it arrives (created per shadow request).

    Keeps the generated text to :data:`TEXT_CAP` characters, the last finish reason and the
    usage's output tokens; a partial line waits for its end up to ``_MAX_LINE`` bytes.
    """

    __slots__ = ("_partial", "_skipping", "_text", "finish_reason", "output_tokens")

    def __init__(self) -> None:
        self._partial = b""
        self._skipping = False
        self._text = _Text()
        self.finish_reason: str | None = None
        self.output_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_LINE:
            self._partial, self._skipping = b"", True
        for line in lines:
            if self._skipping:  # the rest of an over-long line
                self._skipping = False
                continue
            self._line(line.rstrip(b"\r"))

    def text(self) -> str:
        if self._partial and not self._skipping:  # a last event without its line break
            self._line(self._partial.rstrip(b"\r"))
            self._partial = b""
        return self._text.value()

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:
            event = _decode(data)
        except msgspec.DecodeError:
            return
        for choice in event.choices or ():
            if choice.delta is not None:
                self._text.add_message(choice.index, choice.delta)
            self._text.add(choice.index, choice.text)
            self.finish_reason = choice.finish_reason or self.finish_reason
        tokens = _tokens(event.usage)
        if tokens is not None:
            self.output_tokens = tokens


class Tap:
    """A primary stream's scanner with the stream's last raw chunks kept beside it.

    Forwards every call to the scanner it wraps and returns exactly what that returns, so the
    client's bytes are the same with or without it; per chunk it only appends a reference to a
    deque of :data:`_TAIL_CHUNKS` (the finish reason rides on one of the last events).
    """

    __slots__ = ("_scanner", "tail")

    def __init__(self, scanner: Scanner) -> None:
        self._scanner = scanner
        self.tail: deque[bytes] = deque(maxlen=_TAIL_CHUNKS)

    @property
    def usage(self) -> BackendUsage | None:
        return self._scanner.usage

    @property
    def done(self) -> bool:
        return self._scanner.done

    def feed(self, chunk: bytes) -> bytes:
        self.tail.append(chunk)
        return self._scanner.feed(chunk)

    def flush(self) -> bytes:
        return self._scanner.flush()

    def delivered_text(self) -> str:
        return self._scanner.delivered_text()

    def reply_text(self) -> str | None:
        return self._scanner.reply_text()

    def error_event(self, error: GatewayError) -> bytes:
        return self._scanner.error_event(error)


def stream_finish_reason(tail: deque[bytes]) -> str | None:
    """The last finish (or stop) reason in a stream's last chunks, under its chat name."""
    found = _FINISH.findall(b"".join(tail))
    return _chat_finish(found[-1].decode("ascii")) if found else None
