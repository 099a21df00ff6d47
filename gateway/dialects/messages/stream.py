"""A streamed answer: chat completions SSE in, Anthropic Messages events out, chunk by chunk.

Every feed returns the events it can already write (a partial SSE line is all it keeps), in
Anthropic's order: ``message_start`` with the first bytes, then each content block
(``content_block_start``, deltas, ``content_block_stop``), a ``ping`` right after the first
``content_block_start`` (where Anthropic sends it; before ``message_delta`` for an answer with
no block), and ``message_delta`` (the stop reason, with the stop sequence matched when the
backend names it, and the usage) and ``message_stop`` once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from gateway.dialects.base import StreamTranslator
from gateway.dialects.messages.answer import (
    anthropic_usage,
    chat_usage,
    message_id,
    status_and_type,
    stop_reason,
    tool_id,
)

if TYPE_CHECKING:
    from gateway.accounting.sse import ChatChunk, ChunkToolCall
    from gateway.accounting.usage import BackendUsage
    from gateway.errors import GatewayError

__all__ = ["MessagesStream"]

_encode = msgspec.json.encode


def _event(name: bytes, data: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(data) + b"\n\n"


_PING: Final = _event(b"ping", {"type": "ping"})
_STOP: Final = _event(b"message_stop", {"type": "message_stop"})
_DELTA_HEAD: Final = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_MID: Final = b',"delta":{"type":"text_delta","text":'
_JSON_MID: Final = b',"delta":{"type":"input_json_delta","partial_json":'
_THINKING_MID: Final = b',"delta":{"type":"thinking_delta","thinking":'
_DELTA_TAIL: Final = b"}}\n\n"


def _error_event(kind: str, message: str) -> bytes:
    return _event(b"error", {"type": "error", "error": {"type": kind, "message": message}})


class MessagesStream(StreamTranslator):
    """One streamed answer: chat completions SSE in, Anthropic Messages events out.

    ``message_start`` (with the gateway's count of the prompt as ``input_tokens``) goes out
    with the first bytes; text and tool calls become content blocks, each stopped when the
    next starts or the choice finishes, the first followed by a ``ping``; ``message_delta``
    (stop reason, the backend's usage) and ``message_stop`` go out once the finish reason and
    the usage chunk
    have both arrived, or at ``[DONE]`` / :meth:`finish` if the usage never comes (then the
    output count is the number of chunks that carried output: an estimate).
    """

    __slots__ = (
        "_ended",
        "_finish",
        "_matched",
        "_model",
        "_next",
        "_open",
        "_output_chunks",
        "_prompt_tokens",
        "_refusal",
        "_request_id",
        "_started",
        "_text",
        "_thinking",
        "_thought",
        "_tools",
        "_usage",
    )

    def __init__(self, *, model: str, request_id: str, prompt_tokens: int,
                 thinking: bool = False) -> None:
        super().__init__()
        #: the request asked to see thinking: the backend's reasoning is a ``thinking`` block
        self._thinking = thinking
        #: the open block's thinking delta event up to the text, if the open block is thinking
        self._thought: bytes | None = None
        self._model = model
        self._request_id = request_id
        self._prompt_tokens = prompt_tokens
        self._started = False
        self._ended = False
        self._next = 0  # the index of the next content block
        self._open: int | None = None  # the block started and not stopped
        #: the open block's text delta event up to the text, if the open block is text
        self._text: bytes | None = None
        self._tools: dict[int, int] = {}  # chat tool call index -> content block index
        self._finish: str | None = None
        self._matched: str | int | None = None
        self._refusal = False
        self._usage: BackendUsage | None = None
        self._output_chunks = 0

    # the StreamTranslator interface

    def fail(self, error: GatewayError) -> bytes:
        if self._ended:
            return b""  # the message was complete: nothing to add
        self._ended = True
        _, kind = status_and_type(error)
        return _error_event(kind, error.message)

    # reading the chat stream

    def _head(self) -> bytes:
        self._started = True
        start = {
            "type": "message_start",
            "message": {
                "id": message_id(self._request_id),
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": self._prompt_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,  # what Anthropic's message_start says
                },
            },
        }
        return _event(b"message_start", start)

    def _opening(self, out: list[bytes]) -> None:
        if not self._started:
            out.append(self._head())

    def _done(self, out: list[bytes]) -> None:
        self._end(out)

    def _chunk(self, chunk: ChatChunk, out: list[bytes]) -> None:
        if self._ended:
            return
        choices = chunk.choices
        if chunk.error is not None and not choices:
            # a backend that fails mid-stream: its message may name internals, so not relayed
            self._ended = True
            out.append(_error_event("api_error", "The backend failed during the stream."))
            return
        for choice in choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if self._thinking and (thought := delta.reasoning_content or delta.reasoning):
                    self._thinking_delta(thought, out)
                content = delta.content
                if content:
                    head = self._text
                    if head is not None:  # the common chunk: ``_text_delta``, inlined
                        self._output_chunks += 1
                        out.append(head + _encode(content) + _DELTA_TAIL)
                    else:
                        self._text_delta(content, out)
                if delta.refusal:
                    self._refusal = True
                    self._text_delta(delta.refusal, out)
                if delta.tool_calls:
                    for call in delta.tool_calls:
                        self._tool_delta(call, out)
            if choice.finish_reason is not None and self._finish is None:
                self._finish = choice.finish_reason
                self._matched = choice.stop_reason
                self._stop_open(out)
        if chunk.usage is not None:
            usage = chat_usage(chunk.usage)
            if usage is not None:
                self._usage = usage
        if self._finish is not None and self._usage is not None:
            self._end(out)

    def _text_delta(self, text: str, out: list[bytes]) -> None:
        head = self._text
        if head is None:
            index = self._start({"type": "text", "text": ""}, out)
            head = self._text = _DELTA_HEAD + str(index).encode() + _TEXT_MID
        self._output_chunks += 1
        out.append(head + _encode(text) + _DELTA_TAIL)

    def _thinking_delta(self, text: str, out: list[bytes]) -> None:
        head = self._thought
        if head is None:
            index = self._start({"type": "thinking", "thinking": "", "signature": ""}, out)
            head = self._thought = _DELTA_HEAD + str(index).encode() + _THINKING_MID
        self._output_chunks += 1
        out.append(head + _encode(text) + _DELTA_TAIL)

    def _tool_delta(self, call: ChunkToolCall, out: list[bytes]) -> None:
        function = call.function
        arguments = function.arguments if function is not None else None
        if arguments is not None and not isinstance(arguments, str):
            arguments = _encode(arguments).decode()  # a backend that sent a JSON value
        key = call.index if call.index is not None else 0
        index = self._tools.get(key)
        if index is None:
            block = {
                "type": "tool_use",
                "id": call.id or tool_id(self._request_id, key),
                "name": (function.name if function is not None else None) or "",
                "input": {},
            }
            index = self._tools[key] = self._start(block, out)
        # A fragment of a call whose block was already stopped (a backend interleaving its
        # calls) still goes to that block's index: holding it back would buffer the stream.
        if arguments:
            self._output_chunks += 1
            out.append(_DELTA_HEAD + str(index).encode() + _JSON_MID + _encode(arguments)
                       + _DELTA_TAIL)

    def _start(self, block: dict[str, Any], out: list[bytes]) -> int:
        self._stop_open(out)
        index = self._open = self._next
        self._next += 1
        out.append(_event(b"content_block_start",
                          {"type": "content_block_start", "index": index, "content_block": block}))
        if not index:
            out.append(_PING)  # after the first block's start, as Anthropic sends it
        return index

    def _stop_open(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(_event(b"content_block_stop",
                              {"type": "content_block_stop", "index": self._open}))
            self._open = self._text = self._thought = None

    def _end(self, out: list[bytes]) -> None:
        """``message_delta`` and ``message_stop``, once."""
        if self._ended:
            return
        self._ended = True
        self._stop_open(out)
        if not self._next:
            out.append(_PING)  # no block came: the ping still goes before the end
        reason, sequence = stop_reason(self._finish, self._matched, bool(self._tools),
                                       self._refusal)
        usage: dict[str, Any]
        if self._usage is not None:
            usage = anthropic_usage(self._usage)
        else:
            usage = {"output_tokens": self._output_chunks}
        out.append(_event(b"message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage,
        }))
        out.append(_STOP)

    def __repr__(self) -> str:
        state = "ended" if self._ended else ("open" if self._started else "new")
        return f"<MessagesStream [{state} | {self._next} blocks]>"
