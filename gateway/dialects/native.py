"""Usage and text of a stream passed through in its own API (Responses or Messages events).

A backend that speaks the client's API gets the request unchanged and its stream is relayed
byte for byte; this scanner reads the events on the way without changing them, the way
``accounting.sse.StreamScanner`` reads a chat stream: the usage (Anthropic: ``message_start``'s
input usage merged with ``message_delta``'s output usage; Responses: ``response.completed``'s
``response.usage``) and the delivered text (for an estimate when a stream breaks before its
usage). It has the same reading surface as ``StreamScanner`` (``feed``, ``flush``, ``usage``,
``done``, ``delivered_text``, ``reply_text``), so the meter counts both alike.

A Messages stream's scanner also keeps what a continuation on another backend needs
(``upstream/continuation.py``): :meth:`NativeStreamScanner.messages_so_far`, the message as
the client holds it (its text, its last content block and whether it is open, the input
usage of its ``message_start``), or None when it cannot be continued as text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.usage import checked_usage
from gateway.upstream.continuation import MessageSoFar

if TYPE_CHECKING:
    from gateway.accounting.usage import BackendUsage
    from gateway.errors import GatewayError

__all__ = ["NativeStreamScanner"]

_decode = msgspec.json.decode


class NativeStreamScanner:
    """Watches one passed-through stream of ``api`` ("messages" or "responses")."""

    __slots__ = ("_anthropic_usage", "_api", "_block", "_ended", "_input_usage", "_lost",
                 "_on_error", "_open", "_plain", "_reply", "_tail", "_text", "done",
                 "max_event_bytes", "usage")

    def __init__(self, api: str, *, on_error: Callable[[GatewayError], bytes] | None = None,
                 max_event_bytes: int = 1 << 20) -> None:
        self._api = api
        self._on_error = on_error
        self._tail = b""
        self._lost = False  # an event past ``max_event_bytes`` forwarded without its end
        self._text: list[str] = []
        self._anthropic_usage: dict[str, Any] = {}
        # a Messages stream as its client holds it (``messages_so_far``)
        self._input_usage: dict[str, Any] | None = None  # None: no ``message_start`` yet
        self._reply: list[str] = []
        self._block: int | None = None
        self._open = False
        self._plain = True  # every block and delta text so far
        self._ended = False  # its ``message_delta`` (the stop reason) seen
        self.max_event_bytes = max_event_bytes
        self.usage: BackendUsage | None = None
        self.done = False

    def feed(self, chunk: bytes) -> bytes:
        """Read a chunk; it is forwarded unchanged (returned as is)."""
        data = self._tail + chunk if self._tail else chunk
        end = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if end < 0:
            if len(data) <= self.max_event_bytes:
                self._tail = data
            else:
                self._tail, self._lost = b"", True
            return chunk
        self._lost = False
        whole, self._tail = data[:end], data[end:].lstrip(b"\r\n")
        for line in whole.splitlines():
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        return chunk

    def flush(self) -> bytes:
        """The stream ended: read a last event without its blank line."""
        tail, self._tail = self._tail, b""
        for line in tail.splitlines():
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        return b""

    def _event(self, raw: bytes) -> None:
        try:
            event = _decode(raw)
        except msgspec.DecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if self._api == "messages":
            self._messages_event(kind, event)
        else:
            self._responses_event(kind, event)

    def _messages_event(self, kind: Any, event: dict[str, Any]) -> None:
        if kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                text = delta.get("text", delta.get("partial_json"))
                if isinstance(text, str):
                    self._text.append(text)
                    if delta.get("type") == "text_delta":
                        self._reply.append(text)
                        return
            self._plain = False  # a tool's input, a thinking block's, a citation
        elif kind == "content_block_start":
            index, block = event.get("index"), event.get("content_block")
            self._block = index if isinstance(index, int) else (
                -1 if self._block is None else self._block) + 1
            self._open = True
            if not isinstance(block, dict) or block.get("type") != "text":
                self._plain = False
            elif isinstance(text := block.get("text"), str) and text:
                self._text.append(text)
                self._reply.append(text)
        elif kind == "content_block_stop":
            self._open = False
        elif kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._anthropic_usage.update(usage)
            self._input_usage = dict(usage) if isinstance(usage, dict) else {}
        elif kind == "message_delta":
            self._ended = True
            usage = event.get("usage")
            if isinstance(usage, dict):  # cumulative figures: the later ones win
                self._anthropic_usage.update({k: v for k, v in usage.items() if v is not None})
            self.usage = checked_usage(self._anthropic_usage, "anthropic")
        elif kind == "message_stop":
            self.done = True

    def _responses_event(self, kind: Any, event: dict[str, Any]) -> None:
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            delta = event.get("delta")
            if isinstance(delta, str):
                self._text.append(delta)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                self.usage = checked_usage(usage, "responses")
            self.done = True

    def error_event(self, error: GatewayError) -> bytes:
        """The API's own error event (``on_error``: the front-end's), ending a broken stream."""
        return self._on_error(error) if self._on_error is not None else b""

    def delivered_text(self) -> str:
        """The text (and tool arguments) relayed so far, for an estimate."""
        return "".join(self._text)

    def reply_text(self) -> str | None:
        """The reply, for the next turn's history cache (None: not a plain reply)."""
        return "".join(self._text) or None

    @property
    def partial_sent(self) -> bool:
        """Whether the client was handed part of an event whose end never came (the stream
        broke inside one)."""
        return self._lost or bool(self._tail.strip())

    def messages_so_far(self) -> MessageSoFar | None:
        """A Messages stream as its client holds it, for a continuation: None when it is
        not one that can go on as text (not a Messages stream; no ``message_start`` yet; a
        block or delta other than text, e.g. a tool's call or thinking; its ``message_delta``
        or ``message_stop`` already sent; the client holding part of an event)."""
        if (self._api != "messages" or self._input_usage is None or not self._plain
                or self._ended or self.done or self.partial_sent):
            return None
        return MessageSoFar("".join(self._reply), self._block, self._open,
                            dict(self._input_usage))
