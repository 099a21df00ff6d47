"""The contract of a front-end: check, translate to chat, translate the answer back.

A ``Frontend`` is stateless and shared; a ``StreamTranslator`` is made per streamed request and
fed the chat completions SSE bytes the backend sends (chunks may split events anywhere), and
returns the bytes of the client's API to send now (possibly empty: never holds back an event it
can already write). It reads the stream through its own usage scanner (``scanner``, the one a
chat stream gets): the scanner splits the events, decodes each once into a ``ChatChunk`` for the
usage and the delivered text, and keeps it; the translator turns those chunks into the client's
events and never decodes an event itself. The pipeline meters the stream from that scanner
(``dialects.translated_stream.TranslatingScanner``).

Every method is pure (no I/O) so translations are tested table-driven from recorded examples,
and property-tested round trips (chat -> API -> chat keeps every message, tool call and usage
figure; a translated stream reassembles to the same object as the translated whole answer).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting import StreamScanner

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.sse import ChatChunk
    from gateway.accounting.usage import BackendUsage
    from gateway.errors import GatewayError, InvalidRequest

__all__ = ["Frontend", "StreamTranslator", "Translated"]


class Translated(msgspec.Struct, frozen=True):
    """A client request checked and translated.

    ``chat``: the chat completions payload sent to a backend that does not speak the API (and
    what the gateway counts, classifies and routes by); ``model``: the public model name;
    ``stream``: the client asked for a stream; ``max_output``: the output bound for quotas
    (None: the model's default). What the translation leaves out is kept for the pipeline's
    choice between passing the request through and translating it (``dialects.ignored``):
    ``ignored``, the client's fields a translation drops (named in ``x-gateway-ignored``);
    ``refusal``, why the request cannot be translated (a 400 only if it is translated);
    ``effort``, the client field that set chat's ``reasoning_effort`` (named instead when the
    backend takes no ``reasoning_effort``). A frozen Struct rather than a frozen dataclass: it
    is made for every translated request, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) cost a third of the Responses check-and-translate.
    """

    chat: dict[str, Any]
    model: str
    stream: bool
    max_output: int | None = None
    ignored: tuple[str, ...] = ()
    refusal: InvalidRequest | None = None
    effort: str | None = None


class StreamTranslator(abc.ABC):
    """One streamed answer, chat completions SSE in, the client API's events out.

    A subclass writes the client's events for each decoded chunk (``_chunk``), for ``[DONE]``
    (``_done``) and for the end of the stream (``_end``), and ``_opening`` writes what goes out
    with the first bytes whatever they hold (Anthropic's ``message_start``).
    """

    __slots__ = ("_chunks", "_opened", "_scan", "scanner")

    #: the longest chat event translated: one event is the whole answer for backends that do
    #: not really stream (or a tool call's arguments in one piece), so far more than the usage
    #: scanner's default bound for a relayed chat stream, whose events pass through unread
    max_event_bytes = 16 << 20

    def __init__(self) -> None:
        #: the usage scanner of the backend's chat stream, which decodes its events
        self.scanner = StreamScanner(strip_usage=False, keep_chunks=True,
                                     max_event_bytes=self.max_event_bytes)
        chunks = self.scanner.chunks
        assert chunks is not None
        self._chunks = chunks
        self._scan = self.scanner.feed
        self._opened = False

    @property
    def malformed(self) -> int:
        """Chat events that were not JSON of a chat chunk (skipped)."""
        return self.scanner.undecodable

    def feed(self, chunk: bytes) -> bytes:
        """The client bytes for this chunk of the backend's chat SSE (events may be split
        across chunks: a partial event is kept until its end arrives)."""
        self._scan(chunk)
        out: list[bytes] = []
        if not self._opened:
            self._opened = True
            self._opening(out)
        chunks = self._chunks
        if chunks:  # the loop of ``_read``, inlined: this runs once per chunk of the stream
            translate = self._chunk
            for decoded in chunks:
                if decoded is None:
                    self._done(out)
                else:
                    translate(decoded, out)
            chunks.clear()
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events after the backend's stream ended cleanly (``[DONE]`` seen or
        not): e.g. ``response.completed`` / ``message_stop`` with the usage."""
        self.scanner.flush()  # a last event without its blank line
        out: list[bytes] = []
        if not self._opened:
            self._opened = True
            self._opening(out)
        if self._chunks:
            self._read(out)
        self._end(out)
        return b"".join(out)

    @abc.abstractmethod
    def fail(self, error: GatewayError) -> bytes:
        """The events that end a stream broken after its first byte (an ``error`` event)."""

    def _read(self, out: list[bytes]) -> None:
        """Translate the chunks the scanner decoded since the last call, in stream order."""
        chunks = self._chunks
        for chunk in chunks:
            if chunk is None:
                self._done(out)
            else:
                self._chunk(chunk, out)
        chunks.clear()

    @abc.abstractmethod
    def _opening(self, out: list[bytes]) -> None:
        """What goes out with the stream's first bytes, whatever they hold (called once, by
        the first ``feed`` or by ``finish``)."""

    @abc.abstractmethod
    def _chunk(self, chunk: ChatChunk, out: list[bytes]) -> None:
        """The events of one decoded chat chunk."""

    @abc.abstractmethod
    def _done(self, out: list[bytes]) -> None:
        """``data: [DONE]``."""

    @abc.abstractmethod
    def _end(self, out: list[bytes]) -> None:
        """The backend's stream ended (after ``[DONE]`` or without it)."""


class Frontend(abc.ABC):
    """One client API."""

    #: the API's name on usage records, metrics and the backend ``api:`` setting
    name: str
    #: the route it is served on, e.g. ``/v1/responses``
    path: str
    #: the backend path when passed through unchanged
    upstream_path: str
    #: the request fields that bound its output, checked against the model's
    #: ``max_output_tokens`` before admission (``gateway.dialects.limits``)
    output_fields: tuple[str, ...] = ()
    #: its stream reports the prompt's tokens before the backend's usage arrives (Anthropic's
    #: ``message_start``): only then does a translated stream have the prompt counted for it
    #: (``stream``'s ``prompt_tokens``; 0 otherwise, the tokenising skipped)
    stream_counts_prompt: bool = False
    #: the API's own header for the API key when ``Authorization`` is absent (Anthropic's
    #: ``x-api-key``), or None
    key_header: bytes | None = None

    @abc.abstractmethod
    def to_chat(self, payload: dict[str, Any],
                  earlier: list[dict[str, Any]] | None = None) -> Translated:
        """Check the request in the API's own shape (raise ``InvalidRequest`` naming the
        field) and translate it to chat completions. ``earlier``: chat messages of a stored
        conversation the request continues (Responses' ``previous_response_id``), put before
        the request's own; they count as history."""

    @abc.abstractmethod
    def answer(self, chat: dict[str, Any], *, model: str, request_id: str,
               request: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The API's non-streamed answer for a chat completions answer (``model``: the public
        name the client asked for; ``request_id``: the gateway's, for ids the API needs;
        ``request``: the client's request as sent, for APIs whose answers echo its settings,
        such as Responses' ``tools`` and ``instructions``; others ignore it)."""

    @abc.abstractmethod
    def stream(self, *, model: str, request_id: str, prompt_tokens: int,
               request: Mapping[str, Any] | None = None) -> StreamTranslator:
        """A translator for one streamed answer (``prompt_tokens``: the gateway's count of the
        translated prompt, for APIs that report input usage before the backend's usage
        arrives, such as Anthropic's ``message_start`` (``stream_counts_prompt``), else 0;
        ``request`` as for ``answer``)."""

    @abc.abstractmethod
    def error(self, error: GatewayError) -> tuple[int, bytes]:
        """The status and body of an error in the API's shape."""

    @abc.abstractmethod
    def usage(self, answer: dict[str, Any]) -> BackendUsage | None:
        """The usage of a native (passed-through) answer of this API, without double counts
        (``gateway.accounting.usage`` reads each shape)."""
