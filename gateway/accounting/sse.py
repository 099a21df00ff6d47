"""An incremental scanner for a backend's SSE stream: usage, delivered text, ``[DONE]``.

Created per streamed request and fed the raw byte chunks as they arrive from the backend; chunks
may split lines and events anywhere. It

* finds the usage event (a ``data:`` event whose JSON has a non-null ``usage``; with
  ``include_usage`` OpenAI sends ``"usage": null`` on every other chunk, which is ignored);
* collects the delivered text (``choices[].delta.content``, reasoning and tool-call name and
  arguments for chat; ``choices[].text`` for completions) so that a stream that ends without
  usage, or is cut short, can still be counted (``delivered_text``);
* notes ``data: [DONE]``;
* optionally strips the usage event, when the gateway asked for usage but the client did not;
* counts the output sent as the engine counts it, for a continuation on another backend
  (``upstream/continuation.py``): :meth:`StreamScanner.output_sent`.

Output sent (:meth:`StreamScanner.output_sent`, for a stream of one choice of text: what a
continuation continues): the chunks that carried text, each at least one token of the engine's
(an engine sends a token's text once it has it, and several tokens in one chunk where a token
ends inside a UTF-8 character, a stop string may begin, or it streams at an interval), so
their count never exceeds the tokens sent; and, where the chunks carry it, the engine's own
running count, which is exact: llama.cpp's ``timings.predicted_n`` on every chunk (with
``timings_per_token``; its ``prompt_n + cache_n`` is the prompt), vLLM's usage on every chunk
(``stream_options.continuous_usage_stats``), and any usage read. Both come from the decoding
the scanner does anyway: the chunks of text are the pieces of text it keeps, and ``timings``
and ``usage`` are looked at only on a chunk that has them.

Cost per chunk: one ``rfind`` for the last event boundary, one ``split``, and the events'
decoding into ``ChatChunk``, the one Struct of a chat chunk in the gateway (what this scanner and
the stream translators of ``gateway.dialects`` read); everything else in the event is skipped by
the decoder without building objects. An event that may carry usage (its ``"usage"`` is not
``null``) is decoded at once; the others wait, as the bytes received, and are decoded together
(``PENDING_EVENTS`` at a time, or when the text is read): one decode of many events costs a
fraction of one call each, and nothing reads the text before the stream ends but a
continuation, which reads it then. A translated stream is decoded here only, each event at once:
with ``keep_chunks`` the scanner keeps each decoded chunk for the translator (``chunks``).

Forwarding (the return value of :meth:`StreamScanner.feed`):

* not stripping: the chunk itself, always, whatever it holds (zero copy, no delay);
* stripping: only whole events are forwarded; a partial event at the end of a chunk is held
  until its end arrives (a client cannot act on half an event anyway). A block with no usage
  event is forwarded as the very bytes received (or one slice of them); the usage event and its
  blank line are removed. When the usage rides on a chunk that also has choices (some backends
  put it on the last content chunk), that chunk is forwarded re-encoded with ``"usage": null``,
  the shape OpenAI gives every non-final chunk, so the text still reaches the client.

``"usage": null`` on ordinary chunks is passed through untouched (rewriting every event would cost
a re-encode each); OpenAI's clients accept it. Line endings: LF (``\\n\\n`` between events) and
CRLF (``\\r\\n\\r\\n``), detected from the first line. An event over ``max_event_bytes`` without
an end is passed through unscanned up to the next boundary, bounding memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from gateway.accounting.usage import BackendUsage, WireUsage, malformed_usage, timings_cache_n
from gateway.errors import error_body

if TYPE_CHECKING:
    from gateway.errors import GatewayError

__all__ = [
    "ChatChunk",
    "ChunkChoice",
    "ChunkDelta",
    "ChunkFunction",
    "ChunkToolCall",
    "Scanner",
    "StreamScanner",
    "chat_error_event",
]


def chat_error_event(error: GatewayError) -> bytes:
    """A chat stream broken after its first byte ends with an OpenAI error object."""
    payload = error_body(error.message, error.type, None, error.error_code)
    return b"data: " + payload + b"\n\n"


class Scanner(Protocol):
    """What the relay and the meter use of a stream's scanner: this chat one, a translating
    one (``gateway/apis``: chat in, the client's API out) or one of a stream passed through
    in its own API."""

    @property
    def usage(self) -> BackendUsage | None: ...

    @property
    def done(self) -> bool: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    def delivered_text(self) -> str: ...

    def reply_text(self) -> str | None: ...

    def error_event(self, error: GatewayError) -> bytes:
        """The event that ends a stream broken after its first byte, in the client's API."""
        ...

_LF = b"\n\n"
_CRLF = b"\r\n\r\n"
_DONE = b"[DONE]"


class ChunkFunction(msgspec.Struct, gc=False):
    name: str | None = None
    #: a string from every known backend; another JSON value is kept as decoded (the
    #: translators encode it, the delivered text counts its JSON)
    arguments: Any = None


class ChunkToolCall(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: ChunkFunction | None = None


class ChunkDelta(msgspec.Struct, gc=False):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    #: the reasoning field of some backends (vLLM's newer name): delivered text like
    #: ``reasoning_content`` (one of the two when both come), and read by the translators
    reasoning: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(msgspec.Struct, gc=False):
    index: int = 0
    delta: ChunkDelta | None = None
    #: a completions stream's text
    text: str | None = None
    finish_reason: str | None = None
    #: vLLM: the stop string matched (or the token id that stopped generation)
    stop_reason: str | int | None = None


class ChatChunk(msgspec.Struct, gc=False):
    """One event of a chat (or completions) stream, as far as the gateway reads it: the usage
    scanner (usage, delivered text) and the stream translators (``gateway.dialects``), which get
    this very object instead of decoding the event again. Fields nobody reads are skipped by
    the decoder without building objects.

    The chunk Structs are not tracked by the cyclic garbage collector (``gc=False``: ~8% of a
    decode's instructions): a decoded JSON value cannot refer back to what holds it, so they
    are never part of a cycle."""

    #: an int from OpenAI; a float from some servers, which is no reason to skip the chunk
    created: int | float | None = None
    choices: list[ChunkChoice] | None = None
    #: the usage object as decoded (a dict; None for ``"usage": null``); the scanner checks
    #: it against ``WireUsage`` itself, so a malformed usage does not make the rest of the
    #: chunk unreadable for a translator
    usage: Any = None
    #: a backend's mid-stream error object
    error: Any = None
    #: llama.cpp's ``timings`` (on the last chunk; on every chunk with ``timings_per_token``):
    #: ``cache_n`` is its cache read, ``predicted_n`` the tokens generated so far, ``prompt_n +
    #: cache_n`` the prompt
    timings: Any = None


_decode_chunk = msgspec.json.Decoder(ChatChunk).decode
_decode_chunks = msgspec.json.Decoder(list[ChatChunk]).decode
#: events decoded together, at most (bounds what a stream holds undecoded)
PENDING_EVENTS = 64
_USAGE_KEY = b'"usage"'


def _may_carry_usage(payload: bytes) -> bool:
    """Whether an event's data may hold a usage object: a ``"usage"`` key whose value is not
    ``null`` (OpenAI sends ``"usage": null`` on every chunk but the last with
    ``include_usage``). A false alarm costs only an early decode."""
    at = payload.find(_USAGE_KEY)
    while at >= 0:
        after = payload[at + 7:at + 24].lstrip()
        if after[:1] == b":" and not after[1:].lstrip().startswith(b"null"):
            return True
        at = payload.find(_USAGE_KEY, at + 7)
    return False
_to_wire = msgspec.convert
_decode_any = msgspec.json.decode
_encode = msgspec.json.encode


class StreamScanner:
    """Watches one SSE stream (per request, not shared).

    Call :meth:`feed` with every chunk from the backend and forward what it returns; at the end
    of the stream call :meth:`flush` and forward that too. Then read :attr:`usage` (None if the
    backend sent none), :attr:`done` and :meth:`delivered_text`.
    """

    __slots__ = (
        "_base",
        "_base_at",
        "_base_exact",
        "_engine",
        "_engine_at",
        "_events",
        "_extra",
        "_finished",
        "_first_prompt",
        "_malformed",
        "_note",
        "_pending",
        "_segment",
        "_sep",
        "_skipping",
        "_strip",
        "_tail",
        "_text",
        "_undecodable",
        "chunks",
        "done",
        "max_event_bytes",
        "usage",
    )

    def __init__(self, *, strip_usage: bool, max_event_bytes: int = 1 << 20,
                 keep_chunks: bool = False) -> None:
        self._strip = strip_usage
        self.max_event_bytes = max_event_bytes
        self._sep: bytes | None = None
        self._tail = b""
        self._skipping = False
        self._text: dict[int, list[str]] = {}  # content (chat) or text (completions) by choice
        self._extra: list[str] = []  # reasoning, tool-call names and arguments
        self.usage: BackendUsage | None = None
        self.done = False
        self._events = 0
        self._malformed = 0
        self._undecodable = 0
        #: the data of events not decoded yet (no usage in them), in stream order
        self._pending: list[bytes] = []
        #: with ``keep_chunks``: every event decoded since the reader last emptied the list,
        #: in stream order (None: ``[DONE]``), for a stream translator to read instead of
        #: decoding the events again; else None
        self.chunks: list[ChatChunk | None] | None = [] if keep_chunks else None
        # the output sent (``output_sent``): the engine's running count where a chunk says it
        # (as of ``_engine_at`` chunks of text: ``_texts``), and, once continued on another
        # engine, the tokens sent before (``_base``, as of ``_base_at`` chunks of text)
        self._engine: int | None = None
        self._engine_at = 0
        self._base = 0
        self._base_at = 0
        self._base_exact = True
        self._segment = 0  # continuations so far: 0, the first engine's chunks
        self._first_prompt: int | None = None  # the first engine's prompt, where it said it
        self._finished = False  # a finish reason seen
        self._note: str | None = None  # ``BackendUsage.estimated`` of the usage read now

    @property
    def events(self) -> int:
        """Chat chunks counted."""
        if self._pending:
            self._settle()
        return self._events

    @property
    def malformed(self) -> int:
        """Events not counted: not JSON of a chat chunk, or with a usage not of its shape."""
        if self._pending:
            self._settle()
        return self._malformed

    @property
    def undecodable(self) -> int:
        """Of ``malformed``, the events not JSON of a chat chunk (a translator skips only
        these)."""
        if self._pending:
            self._settle()
        return self._undecodable

    def feed(self, chunk: bytes) -> bytes:
        """Scan a chunk; return the bytes to forward to the client now (may be empty)."""
        sep = self._sep
        # Fast path, the common case: one whole single-line event per chunk (how backends
        # write), so the first line break is the separator at the very end.
        if (
            sep is not None
            and not self._tail
            and not self._skipping
            and chunk.startswith(b"data: ")
            and chunk.find(sep[:1]) == len(chunk) - len(sep)
            and chunk.endswith(sep)
        ):
            replacement = self._data(chunk[6 : -len(sep)])
            if replacement is None or not self._strip:
                return chunk
            return replacement + sep if replacement else b""
        out = self._feed(chunk)
        return out if self._strip else chunk

    def flush(self) -> bytes:
        """The stream ended: scan a last event that had no blank line; return bytes still held."""
        tail, self._tail = self._tail, b""
        if not tail or self._skipping:
            return tail if self._strip else b""
        event = tail.rstrip(b"\r\n")
        replacement = self._event(event) if event else None
        if not self._strip:
            return b""
        if replacement is None:
            return tail
        return replacement + tail[len(event) :] if replacement else b""

    def error_event(self, error: GatewayError) -> bytes:
        return chat_error_event(error)

    @property
    def partial_sent(self) -> bool:
        """Whether the client was handed part of an event whose end never came (the stream
        broke inside one): when forwarding as received (not stripping), or inside an event
        passed on unscanned (past ``max_event_bytes``)."""
        return self._skipping or (not self._strip and bool(self._tail))

    def drop_partial(self) -> None:
        """Forget the start of an event held when the stream broke, which the client never
        got (``partial_sent`` false): a stream continued on another backend goes on from the
        events it did get, and the continuation's first event must not be read as the rest
        of this one."""
        self._tail = b""
        self._skipping = False

    def output_sent(self) -> tuple[int, bool]:
        """(the output tokens sent so far, whether that is the engines' own count): the
        engine's latest running count plus one a chunk after it, exact when no chunk came
        after it; else one a chunk (never more than the tokens sent: see the module
        docstring). A count below one a chunk is not believed. Once continued
        (:meth:`continued`), the tokens sent before plus the continuation's."""
        if self._pending:
            self._settle()
        base, engine, texts = self._base, self._engine, self._texts()
        chunks = texts - self._base_at
        if engine is None or engine < base + (self._engine_at - self._base_at):
            return base + chunks, self._base_exact and chunks == 0 and engine is None
        after = texts - self._engine_at
        return engine + after, self._base_exact and after == 0

    @property
    def first_prompt(self) -> int | None:
        """The prompt tokens of the first engine, where its chunks said them (llama.cpp's
        per-token ``timings``, vLLM's per-chunk usage, a usage it sent before it broke)."""
        return self._first_prompt

    @property
    def finished(self) -> bool:
        """Whether a finish reason went out (the answer had ended, but for its usage or
        ``[DONE]``)."""
        if self._pending:
            self._settle()
        return self._finished

    def continued(self, sent: int, exact: bool, estimated: str | None = None) -> None:
        """The stream goes on on another engine (``upstream/continuation.py``) after ``sent``
        output tokens (``exact``: the engine's count): the continuation's chunks count from
        there (its ``timings`` from 1 again; its usage, spliced, is the whole answer's), and
        the usage read from now on says ``estimated`` (``BackendUsage.estimated``: which of
        its figures are the gateway's), None: none."""
        if self._pending:
            self._settle()
        self._segment += 1
        self._base, self._base_at, self._base_exact = sent, self._texts(), exact
        self._engine = None
        self._note = estimated

    def delivered_text(self) -> str:
        """Everything generated that was sent: content of all choices, reasoning, tool calls."""
        if self._pending:
            self._settle()
        content = "".join("".join(self._text[i]) for i in sorted(self._text))
        return content + "".join(self._extra) if self._extra else content

    def reply_text(self) -> str | None:
        """The reply a chat client will re-send as an assistant message, if it is plain text:
        the content of the only choice, with no reasoning or tool calls; else None."""
        if self._pending:
            self._settle()
        if len(self._text) != 1 or self._extra:
            return None
        return "".join(next(iter(self._text.values())))

    def _feed(self, chunk: bytes) -> bytes:
        passed = b""
        if self._skipping:
            passed, chunk = self._skip(chunk)
            if not chunk:
                return passed
        data = self._tail + chunk if self._tail else chunk
        sep = self._sep or self._detect(data)
        cut = -1 if sep is None else data.rfind(sep)
        if sep is None or cut < 0:
            return passed + self._hold(data)
        cut += len(sep)
        if cut == len(data):
            block, self._tail = data, b""
        else:
            block, self._tail = data[:cut], data[cut:]
        out = self._scan(block, sep)
        return passed + out if passed else out

    def _detect(self, data: bytes) -> bytes | None:
        """The event separator, from the first line ending seen."""
        i = data.find(b"\n")
        if i < 0:
            return None
        self._sep = _CRLF if i > 0 and data[i - 1] == 13 else _LF
        return self._sep

    def _hold(self, data: bytes) -> bytes:
        """Keep a partial event; past ``max_event_bytes`` give up on it and pass it through."""
        if len(data) <= self.max_event_bytes:
            self._tail = data
            return b""
        self._tail = b""
        self._skipping = True
        return data

    def _skip(self, chunk: bytes) -> tuple[bytes, bytes]:
        """(bytes passed unscanned up to the next boundary, the rest to scan)."""
        end = chunk.find(self._sep or _LF)
        if end < 0:
            return chunk, b""
        self._skipping = False
        end += len(self._sep or _LF)
        return chunk[:end], chunk[end:]

    def _scan(self, block: bytes, sep: bytes) -> bytes:
        """Scan whole events; return the block itself, or the block without the usage event."""
        events = block.split(sep)  # ends with b"" since the block ends with sep
        out: list[bytes] | None = None  # built only once an event is replaced
        for i in range(len(events) - 1):
            event = events[i]
            replacement = self._event(event) if event else None
            if replacement is None:
                if out is not None:
                    out.append(event + sep)
                continue
            if out is None:
                out = [e + sep for e in events[:i]]
            if replacement:
                out.append(replacement + sep)
        return block if out is None else b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        """Note what one event says; None to forward it as is, else its replacement (b"": drop)."""
        # ``find``, not ``in``: CPython's bytes ``in`` first tries the operand as an integer
        # and builds (and drops) a TypeError for a bytes one, twice the cost, on every event
        if event.startswith(b"data: ") and event.find(b"\n") < 0:
            return self._data(event[6:])
        payload = _data_field(event)
        return None if payload is None else self._data(payload)  # None: a comment, keep-alive

    def _data(self, payload: bytes) -> bytes | None:
        """Note what an event's data says; None to keep the event, else its replacement."""
        if payload == _DONE:
            self.done = True
            if self.chunks is not None:
                self.chunks.append(None)
            return None
        if self.chunks is None and not _may_carry_usage(payload):
            pending = self._pending
            pending.append(payload)  # decoded later, with others (the text keeps its order)
            if len(pending) >= PENDING_EVENTS:
                self._settle()
            return None
        if self._pending:
            self._settle()  # the text before this event's
        try:
            parsed = _decode_chunk(payload)
        except msgspec.DecodeError:
            self._malformed += 1
            self._undecodable += 1
            return None
        if self.chunks is not None:
            self.chunks.append(parsed)
        if parsed.usage is not None and not self._read_usage(parsed):
            return None
        self._events += 1
        if parsed.choices:
            self._collect(parsed.choices)
        if parsed.usage is not None or parsed.timings is not None:
            self._engine_counts(parsed)
        if parsed.usage is None or not self._strip:
            return None
        return _without_usage(payload) if parsed.choices else b""

    def _read_usage(self, chunk: ChatChunk) -> bool:
        """Take a chunk's usage; False when it is not of usage's shape (the event is then
        counted as malformed, its text too, and the gateway estimates)."""
        try:
            usage = _to_wire(chunk.usage, WireUsage)
        except msgspec.ValidationError:
            self._malformed += 1
            self.usage = malformed_usage()  # not believed
            return False
        read = usage.normalise(timings_cache_n(chunk.timings))
        if self._note is not None and read.rejected is None:
            read = msgspec.structs.replace(read, estimated=self._note)
        self.usage = read
        return True

    def _engine_counts(self, chunk: ChatChunk) -> None:
        """The engine's own running count of its output (and its prompt), from a chunk with
        a usage (read and believed: ``self.usage``; the whole answer's once continued) or
        llama.cpp's ``timings`` (the continuation's own count, from 1, once continued)."""
        timings = chunk.timings
        timed = timings if isinstance(timings, dict) else None
        if chunk.usage is not None:
            usage = self.usage
            if usage is None or usage.rejected is not None:
                return  # figures not believed (the meter says why)
            self._engine, self._engine_at = usage.completion_tokens, self._texts()
            if not self._segment and self._first_prompt is None:
                self._first_prompt = usage.prompt_tokens
        elif timed is not None:
            predicted = timed.get("predicted_n")
            if type(predicted) is int and predicted >= 0:
                self._engine, self._engine_at = self._base + predicted, self._texts()
        if timed is not None and not self._segment and self._first_prompt is None:
            # the tokens it prefilled and those it read from its cache: both, or no figure
            prompt, cached = timed.get("prompt_n"), timed.get("cache_n")
            if type(prompt) is int and prompt >= 0 and type(cached) is int and cached >= 0:
                self._first_prompt = prompt + cached

    def _settle(self) -> None:
        """Decode the waiting events, all in one call when they all are chat chunks (else
        each alone, so a bad one is counted as today and the others still count)."""
        pending, self._pending = self._pending, []
        try:
            parsed = _decode_chunks(b"[" + b",".join(pending) + b"]")
        except msgspec.DecodeError:
            parsed = None
        if parsed is None or len(parsed) != len(pending):  # one did not decode alone
            parsed = []
            for payload in pending:
                try:
                    parsed.append(_decode_chunk(payload))
                except msgspec.DecodeError:
                    self._malformed += 1
                    self._undecodable += 1
        collect = self._collect
        for chunk in parsed:
            # a usage here is one the quick look missed (spelt unusually)
            if chunk.usage is not None and not self._read_usage(chunk):
                continue
            self._events += 1
            if chunk.choices:
                collect(chunk.choices)
            if chunk.timings is not None or chunk.usage is not None:
                self._engine_counts(chunk)

    def _collect(self, choices: list[ChunkChoice]) -> None:
        for choice in choices:
            if choice.finish_reason:
                self._finished = True
            pieces = self._text.get(choice.index)
            if pieces is None:
                pieces = self._text[choice.index] = []
            delta = choice.delta
            if delta is None:
                if choice.text:
                    pieces.append(choice.text)
                continue
            if delta.content:
                pieces.append(delta.content)
            # vLLM's newer ``reasoning`` (some versions send both fields, the same text)
            if thought := delta.reasoning_content or delta.reasoning:
                self._extra.append(thought)
            if delta.tool_calls:
                for call in delta.tool_calls:
                    function = call.function
                    if function is not None:
                        self._extra.append(function.name or "")
                        arguments = function.arguments
                        if arguments is None or isinstance(arguments, str):
                            self._extra.append(arguments or "")
                        else:
                            self._extra.append(_encode(arguments).decode())

    def _texts(self) -> int:
        """The chunks that carried text so far (a piece each, in ``_text``)."""
        return sum(map(len, self._text.values()))

    def __repr__(self) -> str:
        state = "done" if self.done else "open"
        usage = "usage" if self.usage is not None else "no usage"
        return f"<StreamScanner [{state} | {self.events} events, {usage}]>"


def _data_field(event: bytes) -> bytes | None:
    """The data of a general SSE event (several lines, ``data:`` with or without a space)."""
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


def _without_usage(payload: bytes) -> bytes:
    """The event re-encoded with ``"usage": null`` (a chunk that carries choices and usage)."""
    obj = _decode_any(payload)
    obj["usage"] = None
    return b"data: " + _encode(obj)
