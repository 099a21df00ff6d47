"""The public model name the client asked for, and the gateway's own id, in every answer.

An engine answers with its own model name, whatever it was asked for: llama.cpp its model
file's name (``/models/tiny.gguf``), SGLang a served path, TGI and Ollama their tags, a canary
``model-v2``. The client asked for the public name and must get it back, or an SDK that checks
``response.model`` (and every log downstream) sees an internal name. Likewise every id a client
sees is the gateway's (``chatcmpl-``, ``resp_``, ``msg_`` + the request id: 128 random bits):
a backend's ids are often a per-process counter (guessable, and repeated after an engine
restart, which would let one stored conversation replace another's).

:class:`AnswerRewriter` learns both from the answer's first object (a whole body, or a
stream's first ``data:`` line): its top-level ``"model"`` and ``"id"`` members (a Responses or
Messages stream nests them in ``response`` / ``message``). It keeps the very bytes the engine
wrote for each member (``"model":"\\/models\\/tiny.gguf"``: its separator, its escapes), and
then rewrites every ``"model"`` / ``"id"`` member holding exactly those bytes, in this and every
later piece, with a plain ``bytes.replace`` (no JSON parse per chunk). Inside a JSON string a
quote is escaped, so the byte pattern ``"model":"<value>"`` can only be a real member; a member
of a nested object holding the very same value is rewritten too (that is where a Responses or
Messages stream carries it). Only the value changes: every other byte is the engine's.

The backend's own name and id stay on the rewriter (``backend_model``, ``backend_id``) for the
trace; the name the gateway sent (the policy's ``backend_model``) is a fallback pattern for an
answer whose first object has no model member.

For streams the rewrite runs on the bytes the relay forwards; a pattern split across two
chunks is caught by holding back the shortest chunk tail that could begin one. A chunk that
ends an SSE event (a line break) can never end inside a pattern, so nothing is delayed in
the usual case. Until the first data line is complete the stream's bytes are held (it is the
first event: nothing else waits for it).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.accounting import StreamScanner

__all__ = ["AnswerRewriter", "IdRewriter", "ModelRenamer", "RenamingScanner", "Replacer"]

#: JSON whitespace between a member's name, its colon and its value
_WS = rb"[ \t\r\n]*"
#: a member's name and separator, then its value when that is a string (escapes included)
_MEMBERS = {
    name: re.compile(rb'("' + name + rb'"' + _WS + rb":" + _WS + rb')("(?:[^"\\]|\\.)*")',
                     re.DOTALL)
    for name in (b"model", b"id")
}
_NESTS = ("response", "message")


class _Head(msgspec.Struct):
    """What the first object says, as far as the rewrite reads it (the rest is skipped)."""

    id: Any = None
    model: Any = None
    response: Any = None
    message: Any = None


_decode_head = msgspec.json.Decoder(_Head).decode
_encode = msgspec.json.encode


class Replacer:
    """Rewrites exact byte patterns, in a whole body or across a stream's chunks."""

    __slots__ = ("_pairs", "_span", "_tail")

    def __init__(self, pairs: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]
                 ) -> None:
        self._pairs = tuple(pairs)
        self._span = max((len(old) for old, _ in self._pairs), default=1) - 1
        self._tail = b""

    def whole(self, body: bytes) -> bytes:
        """A complete body with the patterns rewritten."""
        # ``replace`` alone: it returns the same object when there is nothing to replace, where
        # an ``in`` test first (bytes ``in`` bytes builds and drops a TypeError) costs twice
        for old, new in self._pairs:
            body = body.replace(old, new)
        return body

    def chunk(self, data: bytes) -> bytes:
        """The next piece of a stream, rewritten; may hold back a few bytes until the next."""
        if self._tail:
            data = self._tail + data
            self._tail = b""
        data = self.whole(data)
        hold = self._partial(data)
        if hold:
            self._tail = data[-hold:]
            return data[:-hold]
        return data

    def flush(self) -> bytes:
        """Bytes held back at the end of the stream."""
        tail, self._tail = self._tail, b""
        return tail

    def _partial(self, data: bytes) -> int:
        """Length of the longest tail of ``data`` that is a proper prefix of a pattern."""
        if not data or data[-1] in (10, 13):  # an event's line break ends no pattern
            return 0
        start = max(0, len(data) - self._span)
        q = data.find(b'"', start)
        while q >= 0:  # every pattern starts with a quote
            tail = data[q:]
            if any(old.startswith(tail) for old, _ in self._pairs):
                return len(data) - q
            q = data.find(b'"', q + 1)
        return 0


def _pairs_of(value: str, new: str, member: bytes = b'"model"') -> list[tuple[bytes, bytes]]:
    """The compact and the spaced encodings of a member holding ``value``, to ``new``."""
    old, pub = _encode(value), _encode(new)
    return [(member + sep + old, member + sep + pub) for sep in (b":", b": ")]


class ModelRenamer(Replacer):
    """Rewrites one known model name to one public name (both encodings of the member)."""

    __slots__ = ()

    def __init__(self, upstream: str, public: str, *, member: bytes = b'"model"') -> None:
        super().__init__(_pairs_of(upstream, public, member))


def _found(head: _Head, name: str) -> str | None:
    """The first object's top-level member ``name`` (or its ``response``/``message``'s)."""
    found = getattr(head, name)
    if isinstance(found, str):
        return found
    for nest in _NESTS:
        inner = getattr(head, nest)
        if isinstance(inner, dict) and isinstance(inner.get(name), str):
            return inner[name]  # type: ignore[no-any-return]
    return None


def _learnt(data: bytes, name: bytes, value: str, new: str) -> list[tuple[bytes, bytes]]:
    """Every member ``name`` of ``data`` holding ``value``, as the engine wrote it, to ``new``
    (the engine's own separator kept; only the value changes)."""
    pairs: dict[bytes, bytes] = {}
    encoded = _encode(new)
    for match in _MEMBERS[name].finditer(data):
        whole = match.group(0)
        if whole in pairs:
            continue
        try:
            same = msgspec.json.decode(match.group(2)) == value
        except msgspec.DecodeError:
            continue
        if same:
            pairs[whole] = match.group(1) + encoded
    return list(pairs.items())


class AnswerRewriter:
    """The public model name and the gateway's id in place of the engine's, in a whole answer
    or a stream (see the module docstring).

    ``public``: the model name the client asked for (None: leave names alone); ``gateway_id``:
    the id the client sees (None: an answer without ids, e.g. embeddings); ``sent``: the model
    name the gateway sent the engine, rewritten too when the first object names none.
    """

    __slots__ = ("_head", "_learnt", "_new_id", "_public", "_replacer", "_sent", "backend_id",
                 "backend_model")

    def __init__(self, public: str | None, gateway_id: str | None = None,
                 sent: str | None = None) -> None:
        self._public = public
        self._new_id = gateway_id
        self._sent = sent
        self._learnt = False
        self._head = b""
        self._replacer: Replacer | None = None
        #: the backend's own id and model name, once learnt (for traces only)
        self.backend_id: str | None = None
        self.backend_model: str | None = None

    @property
    def gateway_id(self) -> str | None:
        """The id the client sees."""
        return self._new_id

    @property
    def public(self) -> str | None:
        """The model name the client sees (None: names are left alone)."""
        return self._public

    def fresh(self) -> AnswerRewriter:
        """A rewriter to the same public name and id that has learnt nothing yet: for another
        engine's answer in the same stream (a continuation, ``continuation.py``)."""
        return AnswerRewriter(self._public, self._new_id, self._sent)

    def _learn(self, data: bytes) -> None:
        """Learn the engine's id and model from the JSON object ``data``."""
        self._learnt = True
        try:
            head = _decode_head(data)
        except msgspec.DecodeError:  # not a JSON object (an error's text): nothing learnt
            head = None
        pairs: list[tuple[bytes, bytes]] = []
        if self._public is not None:
            model = _found(head, "model") if head is not None else None
            self.backend_model = model
            if model is None:
                if self._sent is not None and self._sent != self._public:
                    pairs += _pairs_of(self._sent, self._public)
            elif model != self._public:
                pairs += _learnt(data, b"model", model, self._public)
        if self._new_id is not None and head is not None:
            found = _found(head, "id")
            if found is not None and found != self._new_id:
                self.backend_id = found
                pairs += _learnt(data, b"id", found, self._new_id)
        if pairs:
            self._replacer = Replacer(pairs)

    def whole(self, body: bytes) -> bytes:
        """A complete body with the engine's model name and id replaced."""
        self._learn(body)
        return self._replacer.whole(body) if self._replacer is not None else body

    def chunk(self, data: bytes) -> bytes:
        """The next piece of a stream, rewritten; holds bytes until the first data line."""
        if not self._learnt:
            data = self._head + data
            start = data.find(b"data:")
            end = data.find(b"\n", start) if start >= 0 else -1
            if end < 0:
                self._head = data
                return b""
            self._head = b""
            self._learn(data[start + 5:end].strip())
        return self._replacer.chunk(data) if self._replacer is not None else data

    def flush(self) -> bytes:
        """Bytes held back at the end of the stream."""
        head, self._head = self._head, b""
        if self._replacer is None:
            return head
        return self._replacer.chunk(head) + self._replacer.flush()


class IdRewriter(AnswerRewriter):
    """The gateway's own id in place of the backend's, and nothing else."""

    __slots__ = ()

    def __init__(self, gateway_id: str) -> None:
        super().__init__(None, gateway_id)

    @property
    def gateway_id(self) -> str:
        assert self._new_id is not None
        return self._new_id


class RenamingScanner(StreamScanner):
    """The stream scanner, forwarding its output with the engine's model name and id
    replaced by the public name and the gateway's id."""

    __slots__ = ("_rewriter",)

    def __init__(self, rewriter: AnswerRewriter, *, strip_usage: bool) -> None:
        super().__init__(strip_usage=strip_usage)
        self._rewriter = rewriter

    def feed(self, chunk: bytes) -> bytes:
        return self._rewriter.chunk(super().feed(chunk))

    def flush(self) -> bytes:
        rewriter = self._rewriter
        return rewriter.chunk(super().flush()) + rewriter.flush()
