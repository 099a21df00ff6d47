"""The Responses stream translator as it was before its byte templates: the differential oracle.

``gateway.dialects.responses.stream`` at main 51f618e, unchanged but for its name and for
answer.py's ``response_update`` (which only it used) inlined as ``_update``: every event is a
dict encoded whole by msgspec. ``test_responses_templates`` feeds it and the templated
``ResponsesStream`` the same streams and wants the same bytes, call by call, and the same
``final``. Not to be changed: it is what the templates must keep writing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.usage import usage_from_mapping
from gateway.dialects.base import StreamTranslator
from gateway.dialects.responses.answer import (
    INCOMPLETE,
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    response_object,
    responses_usage,
    text_part,
)
from gateway.errors import BackendFailure

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.sse import ChatChunk, ChunkToolCall
    from gateway.accounting.usage import BackendUsage
    from gateway.errors import GatewayError

__all__ = ["DictResponsesStream"]

_encode = msgspec.json.encode
#: a delta event's end for each of the first sequence numbers (a stream's usual length), made
#: once: a tuple lookup instead of formatting a number per chunk
_TAILS = tuple(b',"sequence_number":%d}\n\n' % n for n in range(4096))


def _tail(seq: int) -> bytes:
    """``,"sequence_number":N}`` and the event's blank line."""
    return _TAILS[seq] if seq < 4096 else b',"sequence_number":%d}\n\n' % seq

#: per content part kind: (delta event, done event, the done event's text field)
_PART_EVENTS = {
    "output_text": ("response.output_text.delta", "response.output_text.done", "text"),
    "refusal": ("response.refusal.delta", "response.refusal.done", "refusal"),
    "reasoning_text": ("response.reasoning_text.delta", "response.reasoning_text.done", "text"),
}


def _update(snapshot: Mapping[str, Any], *, status: str, output: list[dict[str, Any]],
            usage: dict[str, Any] | None, incomplete: str | None) -> dict[str, Any]:
    """``snapshot`` with a new status, output and usage (answer.py's ``response_update`` as
    it was: the keys keep their order)."""
    response = dict(snapshot)
    response["status"] = status
    response["incomplete_details"] = None if incomplete is None else {"reason": incomplete}
    response["output"] = output
    response["output_text"] = output_text(output)
    response["usage"] = usage
    return response


class _Open:
    """The output item being streamed."""

    __slots__ = ("args", "call_id", "id", "index", "key", "kind", "name", "part", "parts",
                 "prefix", "texts")

    def __init__(self, kind: str, index: int, id_: str) -> None:
        self.kind = kind  # message, reasoning, function_call
        self.index = index
        self.id = id_
        self.parts: list[dict[str, Any]] = []  # closed content parts
        self.part: str | None = None  # the open part's kind
        self.texts: list[str] = []  # the open part's text (or a call's arguments)
        self.prefix = b""  # the open part's (or call's) delta event up to the delta
        self.key: int | str | None = None
        self.call_id = ""
        self.name = ""
        self.args: list[str] = []  # a call's arguments


def _prefix(type_: str, fields: dict[str, Any]) -> bytes:
    """A delta event up to its ``delta`` value."""
    head = _encode({"type": type_, **fields})[:-1]
    return b"event: " + type_.encode() + b"\ndata: " + head + b',"delta":'


class DictResponsesStream(StreamTranslator):
    """One streamed Responses answer, every event a dict encoded whole."""

    def __init__(self, *, model: str, request_id: str, prompt_tokens: int,
                 request: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._model = model
        self._rid = request_id
        self.prompt_tokens = prompt_tokens
        self._request = request
        self._seq = 0
        self._started = False
        self._closed = False
        self._created_at = 0
        #: the ``response.created`` snapshot (the request's settings echoed), made at the start
        self._snapshot: dict[str, Any] = {}
        self._count = 0  # output items opened
        self._open: _Open | None = None
        self._output: list[dict[str, Any]] = []  # closed items, in output order
        self._calls: dict[int | str, int] = {}  # tool call key -> output index
        self._finish: str | None = None
        #: the backend's usage, when its usage chunk arrived
        self.usage: BackendUsage | None = None
        #: the whole response the terminal event carried (``response.completed`` or
        #: ``response.incomplete``): what a stored response keeps; None until then, and for a
        #: stream that failed
        self.final: dict[str, Any] | None = None

    # -- the contract -------------------------------------------------------------------------

    def fail(self, error: GatewayError) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        return self._emit("error", {"code": error.error_code or error.type,
                                    "message": error.message, "param": error.param})

    # -- chat events in -----------------------------------------------------------------------

    def _opening(self, out: list[bytes]) -> None:
        """Nothing: ``response.created`` waits for the first chunk, whose ``created`` it
        carries."""

    def _done(self, out: list[bytes]) -> None:
        if not self._closed:
            self._complete(out)

    def _end(self, out: list[bytes]) -> None:
        if not self._closed:
            self._complete(out)

    def _chunk(self, chunk: ChatChunk, out: list[bytes]) -> None:
        if self._closed:
            return
        if chunk.error is not None:
            out.append(self.fail(BackendFailure("the backend failed during the stream")))
            return
        if not self._started:
            self._start(chunk.created, out)
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue  # one answer: Responses has no ``n``
            delta = choice.delta
            if delta is not None:
                reasoning = delta.reasoning_content or delta.reasoning
                if reasoning:
                    self._text("reasoning", "reasoning_text", reasoning, out)
                content = delta.content
                if content:
                    item = self._open
                    if item is not None and item.part == "output_text":
                        # the common chunk, text of the text part already open: ``_text``'s
                        # last step and ``_delta``, inlined
                        item.texts.append(content)
                        seq = self._seq
                        self._seq = seq + 1
                        out.append(item.prefix + _encode(content)
                                   + (_TAILS[seq] if seq < 4096 else _tail(seq)))
                    else:
                        self._text("message", "output_text", content, out)
                if delta.refusal:
                    self._text("message", "refusal", delta.refusal, out)
                for call in delta.tool_calls or ():
                    self._tool(call, out)
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
                self._end_output(out)
        if chunk.usage is not None:
            self.usage = usage_from_mapping(chunk.usage, "openai")

    # -- Responses events out -----------------------------------------------------------------

    def _emit(self, type_: str, fields: dict[str, Any]) -> bytes:
        seq = self._seq
        self._seq += 1
        data = _encode({"type": type_, **fields, "sequence_number": seq})
        return b"event: " + type_.encode() + b"\ndata: " + data + b"\n\n"

    def _delta(self, prefix: bytes, text: str) -> bytes:
        seq = self._seq
        self._seq += 1
        return prefix + _encode(text) + _tail(seq)

    def _start(self, created: float | None, out: list[bytes]) -> None:
        self._started = True
        self._created_at = int(created) if created is not None else int(time.time())
        self._snapshot = response_object(
            request_id=self._rid, model=self._model, created_at=self._created_at,
            status="in_progress", output=[], usage=None, request=self._request)
        body = _encode(self._snapshot)  # once for both events, which carry the same snapshot
        for type_ in ("response.created", "response.in_progress"):
            seq = self._seq
            self._seq += 1
            out.append(b"event: %s\ndata: {\"type\":\"%s\",\"response\":%s,"
                       b"\"sequence_number\":%d}\n\n" % (type_.encode(), type_.encode(), body, seq))

    def _complete(self, out: list[bytes]) -> None:
        """The last event: the whole response."""
        if not self._started:
            self._start(None, out)
        self._end_output(out)
        incomplete = INCOMPLETE.get(self._finish or "")
        response = _update(
            self._snapshot, status="completed" if incomplete is None else "incomplete",
            output=self._output, usage=responses_usage(self.usage), incomplete=incomplete)
        kind = "response.completed" if incomplete is None else "response.incomplete"
        self.final = response
        out.append(self._emit(kind, {"response": response}))
        self._closed = True

    def _end_output(self, out: list[bytes]) -> None:
        """The answer is over: close the open item as its last; an answer of no text and no
        call gets an empty message, as the whole answer has."""
        open_kind = self._open.kind if self._open is not None else "reasoning"
        if open_kind == "reasoning" and all(i["type"] == "reasoning" for i in self._output):
            self._text("message", "output_text", "", out)
        self._close(out, last=True)

    def _item_open(self, kind: str, out: list[bytes]) -> _Open:
        self._close(out, last=False)
        index = self._count
        self._count += 1
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self._open = _Open(kind, index, item_id(prefix, self._rid, index))
        if kind == "message":
            added = message_item(item.id, [], "in_progress")
        elif kind == "reasoning":
            added = reasoning_item(item.id, None, "in_progress")
        else:
            return item  # a call's added event needs its call id and name (``_tool``)
        out.append(self._emit("response.output_item.added",
                              {"output_index": index, "item": added}))
        return item

    def _text(self, kind: str, part: str, text: str, out: list[bytes]) -> None:
        """A text delta of a message or reasoning item; opens the item and part as needed."""
        item = self._open
        if item is None or item.kind != kind:
            item = self._item_open(kind, out)
        if item.part != part:
            if item.part is not None:
                self._part_done(item, out)
            self._part_added(item, part, out)
        if text:
            item.texts.append(text)
            out.append(self._delta(item.prefix, text))

    def _part_added(self, item: _Open, part: str, out: list[bytes]) -> None:
        item.part = part
        item.texts = []
        where = {"item_id": item.id, "output_index": item.index,
                 "content_index": len(item.parts)}
        empty = (text_part("") if part == "output_text" else
                 {"type": "refusal", "refusal": ""} if part == "refusal" else
                 {"type": "reasoning_text", "text": ""})
        out.append(self._emit("response.content_part.added", {**where, "part": empty}))
        delta_type = _PART_EVENTS[part][0]
        extra: dict[str, Any] = {"logprobs": []} if part == "output_text" else {}
        item.prefix = _prefix(delta_type, {**where, **extra})

    def _part_done(self, item: _Open, out: list[bytes]) -> None:
        part = item.part
        assert part is not None
        text = "".join(item.texts)
        _, done_type, field = _PART_EVENTS[part]
        where = {"item_id": item.id, "output_index": item.index,
                 "content_index": len(item.parts)}
        extra: dict[str, Any] = {"logprobs": []} if part == "output_text" else {}
        out.append(self._emit(done_type, {**where, field: text, **extra}))
        whole = (text_part(text) if part == "output_text" else
                 {"type": "refusal", "refusal": text} if part == "refusal" else
                 {"type": "reasoning_text", "text": text})
        out.append(self._emit("response.content_part.done", {**where, "part": whole}))
        item.parts.append(whole)
        item.part = None

    def _tool(self, call: ChunkToolCall, out: list[bytes]) -> None:
        item = self._open
        function = call.function
        name = function.name if function is not None else None
        args = function.arguments if function is not None else None
        if args is not None and not isinstance(args, str):
            args = _encode(args).decode()
        key: int | str
        if call.index is not None:
            key = call.index
        elif call.id is not None and (item is None or item.call_id != call.id):
            key = f"id:{call.id}"
        else:
            key = item.key if item is not None and item.key is not None else 0
        if item is None or item.kind != "function_call" or item.key != key:
            done = self._calls.get(key)
            if done is not None:  # a call already closed: the final object only
                self._output[done]["arguments"] += args or ""
                return
            item = self._item_open("function_call", out)
            item.key = key
            item.call_id = call.id or f"call_{self._rid}_{item.index}"
            item.name = name or ""
            self._calls[key] = item.index
            out.append(self._emit("response.output_item.added", {
                "output_index": item.index,
                "item": function_call_item(item.id, item.call_id, item.name, "", "in_progress"),
            }))
            item.prefix = _prefix("response.function_call_arguments.delta",
                                  {"item_id": item.id, "output_index": item.index})
        elif name:
            item.name += name
        if args:
            item.args.append(args)
            out.append(self._delta(item.prefix, args))

    def _close(self, out: list[bytes], *, last: bool) -> None:
        """Close the open item (``last``: the answer ends with it, so a stop at the length
        limit makes it incomplete)."""
        item = self._open
        if item is None:
            return
        self._open = None
        status = "incomplete" if last and self._finish in INCOMPLETE else "completed"
        if item.kind == "function_call":
            arguments = "".join(item.args)
            out.append(self._emit("response.function_call_arguments.done", {
                "item_id": item.id, "output_index": item.index, "arguments": arguments}))
            done = function_call_item(item.id, item.call_id, item.name, arguments, status)
        else:
            if item.part is not None:
                self._part_done(item, out)
            if item.kind == "message":
                done = message_item(item.id, item.parts, status)
            else:
                text = "".join(p["text"] for p in item.parts)
                done = reasoning_item(item.id, text, status)
        out.append(self._emit("response.output_item.done",
                              {"output_index": item.index, "item": done}))
        self._output.append(done)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DictResponsesStream [{state} | {len(self._output)} items, seq {self._seq}]>"

