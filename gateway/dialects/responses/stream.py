"""A streamed answer: chat completions SSE in, Responses SSE out, never holding an event back.

Per streamed request, fed the chat SSE bytes as the backend sends them (an event may be split
anywhere; the part after the last blank line waits for its end); its usage scanner splits and
decodes the events (``base.StreamTranslator``). Each chat chunk becomes the Responses events it
implies, written as ``event: <type>\\ndata: <json>\\n\\n`` with a
``sequence_number`` counting from 0:

* the first chunk: ``response.created`` and ``response.in_progress`` (a snapshot with no output;
  ``created_at`` is the chunk's ``created``);
* reasoning text (``delta.reasoning_content`` / ``delta.reasoning``): a ``reasoning`` item with a
  ``reasoning_text`` part, ``response.reasoning_text.delta`` events;
* text (``delta.content``; a ``delta.refusal`` is a ``refusal`` part of the same message): a
  ``message`` item, ``response.output_item.added`` (status ``in_progress``),
  ``response.content_part.added``, ``response.output_text.delta`` ...;
* each tool call (``delta.tool_calls[i]``, by ``index``): a ``function_call`` item,
  ``response.output_item.added``, ``response.function_call_arguments.delta`` ...;
* a call to one of the request's ``custom`` tools (``answer.custom_tool_names``, by the name its
  first delta carries): a ``custom_tool_call`` item, ``response.output_item.added`` (``input``
  empty), then at its end one ``response.custom_tool_call_input.delta`` with the whole input
  and ``response.custom_tool_call_input.done``. Chat streams the arguments as JSON text
  (``{"input": "*** Begin Patch\\n...``), whose string is known only once it is whole: the
  fragments are kept and the input decoded once, when the call ends (``answer.custom_input``).

One item is open at a time, as OpenAI streams them: the next item's first delta (or the
chunk's ``finish_reason``) closes the open one with its ``*.done`` events, its
``response.content_part.done`` and ``response.output_item.done``. A backend that went back to a
call it had left (no known backend does) has those arguments added to the final object only,
since that call's ``done`` events are already out. ``data: [DONE]``, or the end of the stream
without it (``finish``), writes the last event: ``response.completed`` with the whole response,
or ``response.incomplete`` when the backend stopped at ``length`` / ``content_filter`` (OpenAI's
terminal event for an incomplete response); that object stays readable as ``final``, for the
stored response. Its usage is the backend's usage chunk (the
translation asks for it with ``include_usage``), or null when the backend sent none. The final
object is built by the same code as the non-streamed answer, so both are equal for the same
chat answer.

A stream broken after its first byte ends with ``fail``: one ``error`` event (``code``,
``message``, ``param``) and nothing after; a backend chunk carrying an ``error`` does the same.
The events are byte templates, not dicts encoded whole: each event's JSON is written from
constant pieces (its ``event:`` line and ``type``, the fixed fields of its item or part) with
the varying values spliced in, each encoded once (an item id once per item, a part's joined
text once for its ``*.done``, ``content_part.done``, ``output_item.done`` events and the
terminal response; an item's JSON once for its ``output_item.done`` and the terminal
response's ``output``). The response object's JSON is split once per stream around the values
that change (``_RESPONSE_VARIABLE``); for a request that echoes no setting besides
``max_output_tokens`` and ``store`` (the usual short request) the pieces are made once per
module for each such model and settings (``_plain_pieces``). The bytes are those msgspec writes
for the dicts the events stand for (the recorded-stream replay and the differential test
against the dict translator check it); ``final`` is built as a dict only when read (a stored
response), by ``response_object`` as the whole answer is.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.usage import usage_from_mapping
from gateway.dialects.base import StreamTranslator
from gateway.dialects.responses.answer import (
    ECHOED,
    INCOMPLETE,
    custom_input,
    custom_tool_call_item,
    custom_tool_names,
    function_call_item,
    item_id,
    message_item,
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

__all__ = ["ResponsesStream"]

_encode = msgspec.json.encode
#: a delta event's end for each of the first sequence numbers (a stream's usual length), made
#: once: a tuple lookup instead of formatting a number per chunk
_TAILS = tuple(b',"sequence_number":%d}\n\n' % n for n in range(4096))


def _tail(seq: int) -> bytes:
    """``,"sequence_number":N}`` and the event's blank line."""
    return _TAILS[seq] if seq < 4096 else b',"sequence_number":%d}\n\n' % seq


def _head(type_: str) -> bytes:
    """An event up to its first field after ``type`` (the types need no JSON escaping)."""
    return b'event: %s\ndata: {"type":"%s",' % (type_.encode(), type_.encode())


_CREATED = _head("response.created")
_IN_PROGRESS = _head("response.in_progress")
_ITEM_ADDED = _head("response.output_item.added")
_ITEM_DONE = _head("response.output_item.done")
_PART_ADDED = _head("response.content_part.added")
_PART_DONE = _head("response.content_part.done")
_ARGUMENTS_DONE = _head("response.function_call_arguments.done")
_INPUT_DELTA = _head("response.custom_tool_call_input.delta")
_INPUT_DONE = _head("response.custom_tool_call_input.done")
_COMPLETED = _head("response.completed")
_INCOMPLETE = _head("response.incomplete")
_LOGPROBS = b',"logprobs":[]'
_STATUS = {"completed": b'"completed"', "incomplete": b'"incomplete"'}
#: the item kinds of a tool call, and each one's item id prefix
_CALLS = frozenset({"function_call", "custom_tool_call"})
_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc",
             "custom_tool_call": "ctc"}

#: per content part kind: its delta event's head, its done event's head and text field, the
#: empty part of ``content_part.added`` and the JSON of a whole part around its text
_PARTS: dict[str, tuple[bytes, bytes, bytes, bytes, bytes, bytes]] = {
    "output_text": (_head("response.output_text.delta"), _head("response.output_text.done"),
                    b',"text":', _encode(text_part("")),
                    b'{"type":"output_text","text":', b',"annotations":[]}'),
    "refusal": (_head("response.refusal.delta"), _head("response.refusal.done"),
                b',"refusal":', b'{"type":"refusal","refusal":""}',
                b'{"type":"refusal","refusal":', b"}"),
    "reasoning_text": (_head("response.reasoning_text.delta"),
                       _head("response.reasoning_text.done"), b',"text":',
                       b'{"type":"reasoning_text","text":""}',
                       b'{"type":"reasoning_text","text":', b"}"),
}

#: the ``response`` keys whose values differ between streams or between a stream's snapshot
#: and its end, in the object's key order: its JSON is written as the pieces between them with
#: these values spliced in
_RESPONSE_VARIABLE = ("id", "created_at", "status", "incomplete_details", "output",
                      "output_text", "usage")


def _pieces(response: dict[str, Any]) -> tuple[bytes, ...]:
    """``response``'s JSON without the values of ``_RESPONSE_VARIABLE``: the piece before
    each such value (ending with its key) and the rest, as msgspec writes the whole object."""
    pieces: list[bytes] = []
    run: dict[str, Any] = {}
    lead = b"{"
    for key, value in response.items():
        if key not in _RESPONSE_VARIABLE:
            run[key] = value
            continue
        fixed = _encode(run)[1:-1] if run else b""
        pieces.append(lead + (fixed + b"," if fixed else b"") + _encode(key) + b":")
        lead = b","
        run = {}
    fixed = _encode(run)[1:-1] if run else b""
    pieces.append((b"," + fixed if fixed else b"") + b"}")
    assert len(pieces) == len(_RESPONSE_VARIABLE) + 1, "a response key is missing"
    return tuple(pieces)


#: ``_pieces`` of a request that echoes nothing (``ECHOED``), by the JSON of its model,
#: ``max_output_tokens`` and ``store`` (all that varies in such a response's fixed pieces)
_PLAIN: dict[bytes, tuple[bytes, ...]] = {}
_PLAIN_MAX = 256  # models x settings kept; more clears the table (a client's varied models)


def _plain_pieces(model: str, request: Mapping[str, Any]) -> tuple[bytes, ...]:
    """The pieces of a request that echoes no setting, made once per module for each."""
    key = _encode((model, request.get("max_output_tokens"), request.get("store", True)))
    pieces = _PLAIN.get(key)
    if pieces is None:
        if len(_PLAIN) >= _PLAIN_MAX:
            _PLAIN.clear()
        pieces = _PLAIN[key] = _pieces(response_object(
            request_id="", model=model, created_at=0, status="", output=[], usage=None,
            request=request))
    return pieces


class _Open:
    """The output item being streamed."""

    __slots__ = ("args", "call_id", "id", "id_json", "index", "key", "kind", "name", "part",
                 "part_json", "parts", "prefix", "texts", "texts_json", "where")

    def __init__(self, kind: str, index: int, id_: str) -> None:
        self.kind = kind  # message, reasoning, function_call, custom_tool_call
        self.index = index
        self.id = id_
        self.id_json = _encode(id_)
        self.parts: list[dict[str, Any]] = []  # closed content parts
        self.part_json: list[bytes] = []  # their JSON
        self.texts_json: list[bytes] = []  # their texts' JSON
        self.part: str | None = None  # the open part's kind
        self.texts: list[str] = []  # the open part's text (or a call's arguments)
        self.where = b""  # the open part's ``"item_id":..,"output_index":..,"content_index":..``
        self.prefix = b""  # the open part's (or call's) delta event up to the delta
        self.key: int | str | None = None
        self.call_id = ""
        self.name = ""
        self.args: list[str] = []  # a call's arguments


class ResponsesStream(StreamTranslator):
    """One streamed Responses answer (see the module docstring)."""

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
        #: the response's JSON pieces (``_pieces``), made at the start
        self._pieces: tuple[bytes, ...] = ()
        self._lead = b""  # the response's JSON up to its status: pieces, id and created_at
        self._count = 0  # output items opened
        self._open: _Open | None = None
        self._output: list[dict[str, Any]] = []  # closed items, in output order
        #: their JSON, or None once a closed call's arguments grew (a backend that went back)
        self._output_json: list[bytes] | None = []
        #: the JSON of each message text part, in output order (the response's ``output_text``)
        self._texts_json: list[bytes] = []
        self._texts: list[str] = []
        self._calls: dict[int | str, int] = {}  # tool call key -> output index
        #: the request's custom tools' names, read at the first call (None: not yet)
        self._custom: frozenset[str] | None = None
        #: the chat arguments of each closed custom call, by output index (a backend that
        #: went back to one: its input is decoded again for the final object)
        self._custom_args: dict[int, str] = {}
        self._finish: str | None = None
        #: the backend's usage, when its usage chunk arrived
        self.usage: BackendUsage | None = None
        #: the terminal event's status, usage and incomplete reason, once it is out
        self._ending: tuple[str, dict[str, Any] | None, str | None] | None = None
        self._final: dict[str, Any] | None = None

    @property
    def final(self) -> dict[str, Any] | None:
        """The whole response the terminal event carried (``response.completed`` or
        ``response.incomplete``): what a stored response keeps; None until then, and for a
        stream that failed. Built on first read, by the code that builds the whole answer."""
        if self._final is None and self._ending is not None:
            status, usage, incomplete = self._ending
            self._final = response_object(
                request_id=self._rid, model=self._model, created_at=self._created_at,
                status=status, output=self._output, usage=usage, request=self._request,
                incomplete=incomplete)
        return self._final

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
        """An event from a dict (the ``error`` event)."""
        seq = self._seq
        self._seq += 1
        data = _encode({"type": type_, **fields, "sequence_number": seq})
        return b"event: " + type_.encode() + b"\ndata: " + data + b"\n\n"

    def _put(self, head: bytes, body: bytes, out: list[bytes]) -> None:
        """An event from its ``head`` (``_head``) and the JSON of its fields after ``type``."""
        seq = self._seq
        self._seq = seq + 1
        out.append(head + body + (_TAILS[seq] if seq < 4096 else _tail(seq)))

    def _delta(self, prefix: bytes, text: str) -> bytes:
        seq = self._seq
        self._seq += 1
        return prefix + _encode(text) + _tail(seq)

    def _start(self, created: float | None, out: list[bytes]) -> None:
        self._started = True
        self._created_at = int(created) if created is not None else int(time.time())
        request = self._request
        if request is None or ECHOED.isdisjoint(request):
            self._pieces = _plain_pieces(self._model, request or {})
        else:
            self._pieces = _pieces(response_object(
                request_id=self._rid, model=self._model, created_at=0, status="", output=[],
                usage=None, request=request))
        p = self._pieces
        self._lead = b"".join((p[0], _encode("resp_" + self._rid), p[1],
                               b"%d" % self._created_at, p[2]))
        # once for both events, which carry the same snapshot
        body = b'"response":' + self._response(b'"in_progress"', b"null", b"[]", b'""', b"null")
        self._put(_CREATED, body, out)
        self._put(_IN_PROGRESS, body, out)

    def _response(self, status: bytes, incomplete: bytes, output: bytes, text: bytes,
                  usage: bytes) -> bytes:
        """The response's JSON with these values' JSON (``_RESPONSE_VARIABLE``; the id and
        ``created_at`` are in ``_lead``)."""
        p = self._pieces
        return b"".join((self._lead, status, p[3], incomplete, p[4], output, p[5], text, p[6],
                         usage, p[7]))

    def _complete(self, out: list[bytes]) -> None:
        """The last event: the whole response."""
        if not self._started:
            self._start(None, out)
        self._end_output(out)
        incomplete = INCOMPLETE.get(self._finish or "")
        status = "completed" if incomplete is None else "incomplete"
        usage = responses_usage(self.usage)
        self._ending = (status, usage, incomplete)
        items = self._output_json
        output = (b"[" + b",".join(items) + b"]" if items is not None
                  else _encode(self._output))
        texts = self._texts_json
        text = texts[0] if len(texts) == 1 else _encode("".join(self._texts))
        response = self._response(
            _STATUS[status], b"null" if incomplete is None else _encode({"reason": incomplete}),
            output, text, b"null" if usage is None else _encode(usage))
        self._put(_COMPLETED if incomplete is None else _INCOMPLETE, b'"response":' + response,
                  out)
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
        item = self._open = _Open(kind, index, item_id(_PREFIXES[kind], self._rid, index))
        if kind == "message":
            added = b'"output_index":%d,"item":{"id":%s,"type":"message",' \
                    b'"status":"in_progress","role":"assistant","content":[]}'
        elif kind == "reasoning":
            added = b'"output_index":%d,"item":{"id":%s,"type":"reasoning","summary":[],' \
                    b'"content":[],"status":"in_progress"}'
        else:
            return item  # a call's added event needs its call id and name (``_tool``)
        self._put(_ITEM_ADDED, added % (index, item.id_json), out)
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
        where = item.where = b'"item_id":%s,"output_index":%d,"content_index":%d' % (
            item.id_json, item.index, len(item.parts))
        delta_head, _, _, empty, _, _ = _PARTS[part]
        self._put(_PART_ADDED, where + b',"part":' + empty, out)
        item.prefix = (delta_head + where + (_LOGPROBS if part == "output_text" else b"")
                       + b',"delta":')

    def _part_done(self, item: _Open, out: list[bytes]) -> None:
        part = item.part
        assert part is not None
        text = "".join(item.texts)
        text_json = _encode(text)
        _, done_head, field, _, before, after = _PARTS[part]
        where = item.where
        if part == "output_text":
            self._put(done_head, where + field + text_json + _LOGPROBS, out)
            whole = text_part(text)
            if item.kind == "message":
                self._texts.append(text)
                self._texts_json.append(text_json)
        else:
            self._put(done_head, where + field + text_json, out)
            whole = ({"type": "refusal", "refusal": text} if part == "refusal" else
                     {"type": "reasoning_text", "text": text})
        part_json = before + text_json + after
        self._put(_PART_DONE, where + b',"part":' + part_json, out)
        item.parts.append(whole)
        item.part_json.append(part_json)
        item.texts_json.append(text_json)
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
        if item is None or item.kind not in _CALLS or item.key != key:
            done = self._calls.get(key)
            if done is not None:  # a call already closed: the final object only
                closed = self._output[done]
                if closed["type"] == "custom_tool_call":
                    whole = self._custom_args[done] = self._custom_args[done] + (args or "")
                    closed["input"] = custom_input(whole)
                else:
                    closed["arguments"] += args or ""
                self._output_json = None  # its JSON is out of date: encode the output whole
                return
            custom = self._custom
            if custom is None:
                custom = self._custom = custom_tool_names(self._request)
            kind = "custom_tool_call" if name and name in custom else "function_call"
            item = self._item_open(kind, out)
            item.key = key
            item.call_id = call.id or f"call_{self._rid}_{item.index}"
            item.name = name or ""
            self._calls[key] = item.index
            if kind == "custom_tool_call":
                self._put(_ITEM_ADDED, b'"output_index":%d,"item":{"id":%s,'
                          b'"type":"custom_tool_call","status":"in_progress","call_id":%s,'
                          b'"input":"","name":%s}' % (item.index, item.id_json,
                                                      _encode(item.call_id),
                                                      _encode(item.name)), out)
            else:
                self._put(_ITEM_ADDED, b'"output_index":%d,"item":{"id":%s,'
                          b'"type":"function_call","status":"in_progress","arguments":"",'
                          b'"call_id":%s,"name":%s}' % (item.index, item.id_json,
                                                       _encode(item.call_id),
                                                       _encode(item.name)), out)
                item.prefix = (_head("response.function_call_arguments.delta")
                               + b'"item_id":%s,"output_index":%d,"delta":' % (item.id_json,
                                                                                item.index))
        elif name:
            item.name += name
        if args:
            item.args.append(args)
            if item.kind == "function_call":
                out.append(self._delta(item.prefix, args))
            # a custom call's arguments are JSON around its input: kept whole until it ends
            # (``_close``), since a fragment may cut a string escape anywhere

    def _close(self, out: list[bytes], *, last: bool) -> None:
        """Close the open item (``last``: the answer ends with it, so a stop at the length
        limit makes it incomplete)."""
        item = self._open
        if item is None:
            return
        self._open = None
        status = "incomplete" if last and self._finish in INCOMPLETE else "completed"
        kind = item.kind
        if kind == "function_call":
            arguments = "".join(item.args)
            args_json = _encode(arguments)
            self._put(_ARGUMENTS_DONE, b'"item_id":%s,"output_index":%d,"arguments":%s' % (
                item.id_json, item.index, args_json), out)
            done = function_call_item(item.id, item.call_id, item.name, arguments, status)
            item_json = b'{"id":%s,"type":"function_call","status":%s,"arguments":%s,' \
                        b'"call_id":%s,"name":%s}' % (item.id_json, _STATUS[status], args_json,
                                                     _encode(item.call_id),
                                                     _encode(item.name))
        elif kind == "custom_tool_call":
            # the input decoded from the whole arguments, in one delta (``_tool``)
            arguments = "".join(item.args)
            self._custom_args[item.index] = arguments
            input_ = custom_input(arguments)
            input_json = _encode(input_)
            where = b'"item_id":%s,"output_index":%d' % (item.id_json, item.index)
            if input_:
                self._put(_INPUT_DELTA, where + b',"delta":' + input_json, out)
            self._put(_INPUT_DONE, where + b',"input":' + input_json, out)
            done = custom_tool_call_item(item.id, item.call_id, item.name, input_, status)
            item_json = b'{"id":%s,"type":"custom_tool_call","status":%s,"call_id":%s,' \
                        b'"input":%s,"name":%s}' % (item.id_json, _STATUS[status],
                                                   _encode(item.call_id), input_json,
                                                   _encode(item.name))
        else:
            if item.part is not None:
                self._part_done(item, out)
            if kind == "message":
                done = message_item(item.id, item.parts, status)
                item_json = b'{"id":%s,"type":"message","status":%s,"role":"assistant",' \
                            b'"content":[%s]}' % (item.id_json, _STATUS[status],
                                                  b",".join(item.part_json))
            else:
                text = "".join(p["text"] for p in item.parts)
                done = reasoning_item(item.id, text, status)
                texts = item.texts_json
                item_json = b'{"id":%s,"type":"reasoning","summary":[],"content":' \
                            b'[{"type":"reasoning_text","text":%s}],"status":%s}' % (
                                item.id_json, texts[0] if len(texts) == 1 else _encode(text),
                                _STATUS[status])
        self._put(_ITEM_DONE, b'"output_index":%d,"item":' % item.index + item_json, out)
        self._output.append(done)
        if self._output_json is not None:
            self._output_json.append(item_json)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ResponsesStream [{state} | {len(self._output)} items, seq {self._seq}]>"
