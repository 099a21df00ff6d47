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

__all__ = ["ModelRenamer", "RenamingScanner"]


class ModelRenamer:
    """Rewrites one backend model name to one public name (per request, cheap to build)."""

    __slots__ = ("_pairs", "_tail")

    def __init__(self, upstream: str, public: str) -> None:
        up, pub = msgspec.json.encode(upstream), msgspec.json.encode(public)
        self._pairs = tuple(
            (b'"model"' + sep + up, b'"model"' + sep + pub) for sep in (b":", b": ")
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
    """The stream scanner, forwarding its output with the model name rewritten."""

    __slots__ = ("_renamer",)

    def __init__(self, renamer: ModelRenamer, *, strip_usage: bool) -> None:
        super().__init__(strip_usage=strip_usage)
        self._renamer = renamer

    def feed(self, chunk: bytes) -> bytes:
        return self._renamer.chunk(super().feed(chunk))

    def flush(self) -> bytes:
        return self._renamer.chunk(super().flush()) + self._renamer.flush()
