"""The model name the client asked for, in every answer.

A backend answers with its own model name (``sim-model``, a canary's ``model-v2``); the client
asked for the public one and must get it back, or an SDK that checks ``response.model`` (and
every log downstream) sees an internal name. Only ``"model"`` members whose value is exactly the
backend's name are rewritten: inside a JSON string a quote is escaped, so the byte pattern
``"model":"<name>"`` can only be a real member. Both the compact (``"model":"x"``) and the
spaced (``"model": "x"``) encodings are handled with plain ``bytes.replace`` (no JSON parse).

For streams the rewrite runs on the bytes the relay forwards; a pattern split across two
chunks is caught by holding back the shortest chunk tail that could begin one. A chunk that
ends an SSE event (a line break) can never end inside a pattern, so nothing is delayed in
the usual case.
"""

from __future__ import annotations

import msgspec

from gateway.accounting import StreamScanner

__all__ = ["IdRewriter", "ModelRenamer", "RenamingScanner"]


class ModelRenamer:
    """Rewrites one backend model name to one public name (per request, cheap to build)."""

    __slots__ = ("_pairs", "_tail")

    def __init__(self, upstream: str, public: str, *, member: bytes = b'"model"') -> None:
        up, pub = msgspec.json.encode(upstream), msgspec.json.encode(public)
        self._pairs = tuple(
            (member + sep + up, member + sep + pub) for sep in (b":", b": ")
        )
        self._tail = b""

    def whole(self, body: bytes) -> bytes:
        """A complete body with the name rewritten."""
        for old, new in self._pairs:
            if old in body:
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
        span = max(len(old) for old, _ in self._pairs) - 1
        start = max(0, len(data) - span)
        q = data.find(b'"', start)
        while q >= 0:  # every pattern starts with a quote
            tail = data[q:]
            if any(old.startswith(tail) for old, _ in self._pairs):
                return len(data) - q
            q = data.find(b'"', q + 1)
        return 0


class RenamingScanner(StreamScanner):
    """The stream scanner, forwarding its output with the backend's id replaced by the
    gateway's and (with a renamer) the model name rewritten."""

    __slots__ = ("_ids", "_renamer")

    def __init__(self, renamer: ModelRenamer | None, *, strip_usage: bool,
                 ids: IdRewriter | None = None) -> None:
        super().__init__(strip_usage=strip_usage)
        self._renamer = renamer
        self._ids = ids

    def feed(self, chunk: bytes) -> bytes:
        out = super().feed(chunk)
        if self._ids is not None:
            out = self._ids.chunk(out)
        return self._renamer.chunk(out) if self._renamer is not None else out

    def flush(self) -> bytes:
        out = super().flush()
        if self._ids is not None:
            out = self._ids.chunk(out) + self._ids.flush()
        if self._renamer is None:
            return out
        return self._renamer.chunk(out) + self._renamer.flush()


class IdRewriter:
    """The gateway's own id in place of the backend's, in a whole answer or a stream.

    Every id a client sees is the gateway's (``chatcmpl-``, ``resp_``, ``msg_`` + the request
    id: 128 random bits): a backend's ids are often a per-process counter (guessable, and
    repeated after an engine restart, which would let one stored conversation replace
    another's). The backend's id is learnt from the first object of the answer (a whole body,
    or a stream's first ``data:`` line; a Responses or Messages stream nests it in
    ``response`` / ``message``), then every ``"id"`` member holding exactly that value is
    rewritten with the byte replacement of :class:`ModelRenamer`. Until the first data line is
    complete the stream's bytes are held (it is the first event: nothing else waits for it).
    """

    __slots__ = ("_head", "_learnt", "_new", "_renamer", "backend_id")

    def __init__(self, gateway_id: str) -> None:
        self._new: str = gateway_id
        self._learnt = False
        self._head = b""
        self._renamer: ModelRenamer | None = None
        #: the backend's own id, once learnt (for the usage record and traces only)
        self.backend_id: str | None = None

    @property
    def gateway_id(self) -> str:
        """The id the client sees."""
        return self._new

    def _learn(self, obj: object) -> None:
        self._learnt = True
        if not isinstance(obj, dict):
            return
        found = obj.get("id")
        for nest in ("response", "message"):
            inner = obj.get(nest)
            if not isinstance(found, str) and isinstance(inner, dict):
                found = inner.get("id")
        if isinstance(found, str) and found != self._new:
            self.backend_id = found
            self._renamer = ModelRenamer(found, self._new, member=b'"id"')

    def whole(self, body: bytes) -> bytes:
        """A complete body with the backend's id replaced."""
        try:
            self._learn(msgspec.json.decode(body))
        except msgspec.DecodeError:
            return body
        return self._renamer.whole(body) if self._renamer is not None else body

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
            try:
                self._learn(msgspec.json.decode(data[start + 5:end].strip()))
            except msgspec.DecodeError:
                self._learnt = True  # not a JSON event (an error's text): nothing to rewrite
        return self._renamer.chunk(data) if self._renamer is not None else data

    def flush(self) -> bytes:
        """Bytes held back at the end of the stream."""
        head, self._head = self._head, b""
        if self._renamer is None:
            return head
        return self._renamer.chunk(head) + self._renamer.flush()
