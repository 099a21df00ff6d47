"""Pass through or translate: what a front-end's request sends upstream, and what comes back.

A request passes through unchanged (its own API's path, the client's body with the backend's
model name) when every backend of the pool it was routed to speaks its API (``api:`` on the
backend); otherwise the chat translation goes to ``/v1/chat/completions`` and the answer is
translated back. The pool decides, not the backend, because a retry may move the request to
another backend of the pool before the first byte. A Responses request that continues a stored
response (``previous_response_id``) is always translated: the gateway rebuilt its conversation
from its own store, and a backend would not know the gateway's ids.

``Upstream.answer`` turns a whole answer into the client's body; ``Upstream.metered`` is what
the meter reads (the backend's own answer, in its own usage shape); ``Upstream.final`` is the
answer as the client's API object once it is complete (a whole body, or a stream's last event),
for the stored response.

What a translation leaves out (``dialects.ignored``) matters only when the request is translated:
then a refusal the translation recorded is raised (a 400 naming the field), the fields it
dropped are named in ``Upstream.headers`` (``x-gateway-ignored``), and so is the field that set
``reasoning_effort`` when the pool's engine takes none (``_NO_REASONING_EFFORT``: it is left
out of the chat body). A request passed through goes as the client sent it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import msgspec

from gateway.dialects.ignored import ignored_headers
from gateway.dialects.native import NativeStreamScanner
from gateway.dialects.translated_stream import TranslatingScanner
from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    RateLimited,
)
from gateway.upstream.engines import pool_engine
from gateway.upstream.rename import AnswerRewriter

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gateway.accounting import Scanner
    from gateway.accounting.usage import Shape
    from gateway.dialects.base import Frontend, StreamTranslator
    from gateway.dialects.shape import ParsedRequest
    from gateway.routing.pool import PoolState
    from gateway.types import RawHeaders

__all__ = ["Upstream", "plan_upstream", "refuse_untranslatable"]

CHAT_PATH = "/v1/chat/completions"
_SHAPES: dict[str, Shape] = {"messages": "anthropic", "responses": "responses"}
#: the id prefix of a passed-through API's answers: the gateway's id replaces the backend's
_NATIVE_IDS = {"messages": "msg_", "responses": "resp_"}
_encode = msgspec.json.encode
_decode = msgspec.json.decode
#: engines whose chat completions take no ``reasoning_effort`` (an unknown engine gets it:
#: chat completions defines it, and the OpenAI-compatible servers take or ignore it)
_NO_REASONING_EFFORT = frozenset({"tgi"})


@dataclass(slots=True)
class Upstream:
    """How one request goes to its backend and comes back: passed through in its own API
    (``native``: a chat-shaped request always, a front-end's to a pool that speaks it) or
    translated to chat (``frontend``: the API it is translated from; None for chat)."""

    frontend: Frontend | None
    native: bool
    path: str
    body: bytes
    scanner: Scanner | None
    #: a passed-through answer's rewriter (the public model name and the gateway's id for
    #: the engine's)
    rewriter: AnswerRewriter | None
    model: str
    request_id: str
    #: the usage shape of what the backend answers
    shape: Shape
    #: the client's request as sent (answers of some APIs echo its settings)
    request: dict[str, Any] | None = None
    #: a translated stream's translator (its ``final`` object, once the stream is complete)
    translator: StreamTranslator | None = None
    #: the last whole answer ``answer`` translated, as an object
    answered: dict[str, Any] | None = None
    #: the model name the engine answered a translated whole answer with (for the trace)
    answered_model: str | None = None
    #: the client's fields the translation dropped (none when passed through)
    ignored: tuple[str, ...] = ()
    #: the client API (``Endpoint.api``)
    api: str = "chat"

    @property
    def streams_chat(self) -> bool:
        """The backend streams chat completions for this request (a chat request, or one
        translated to chat): what a continuation on another backend can splice."""
        return self.api == "chat" if self.frontend is None else not self.native

    @property
    def continues_as(self) -> str | None:
        """What a continuation on another backend splices for this request's stream:
        ``"chat"`` (a chat stream, or one translated to chat), ``"messages"`` (a Messages
        stream passed through: continued with Anthropic's prefill), or None (a Responses
        stream passed through: that API has no way to continue a text, so never)."""
        if self.streams_chat:
            return "chat"
        return "messages" if self.native and self.api == "messages" else None

    @property
    def headers(self) -> RawHeaders:
        """The response headers the plan adds: ``x-gateway-ignored`` naming the dropped
        fields of a translated request."""
        return ignored_headers(self.ignored)

    @property
    def backend_model(self) -> str | None:
        """The model name the engine answered with, when known (traces only)."""
        if self.rewriter is not None:
            return self.rewriter.backend_model
        return self.answered_model

    def answer(self, status: int, body: bytes) -> bytes:
        """The client's body for a whole answer of the backend."""
        frontend = self.frontend
        if self.native or frontend is None:
            if self.rewriter is not None and status < 400:
                body = self.rewriter.whole(body)
            return body
        if status >= 400:
            return frontend.error(_backend_error(status, body))[1]
        try:
            chat = _decode(body)
        except msgspec.DecodeError:
            return frontend.error(_backend_error(502, b""))[1]
        if not isinstance(chat, dict):
            return frontend.error(_backend_error(502, b""))[1]
        engine_model = chat.get("model")
        self.answered_model = engine_model if isinstance(engine_model, str) else None
        self.answered = frontend.answer(chat, model=self.model,
                                             request_id=self.request_id, request=self.request)
        return _encode(self.answered)

    def final(self, body: bytes | None) -> dict[str, Any] | None:
        """The complete answer as the client's API object: the stream's last event (None if
        it never came), or the whole ``body`` the client received."""
        if body is None:  # a stream
            source = self.translator if not self.native else self.scanner
            final = getattr(source, "final", None)
            if not isinstance(final, dict):
                return None
            if not self.native:
                return final
            new_id = self.rewriter.gateway_id if self.rewriter is not None else None
            gateway_id = {"id": new_id} if new_id is not None else {}
            return {**final, "model": self.model, **gateway_id}
        if self.answered is not None:
            return self.answered
        try:
            data = _decode(body)
        except msgspec.DecodeError:
            return None
        return data if isinstance(data, dict) else None


def speaks(pool: PoolState, api: str) -> bool:
    """Every backend of the pool serves ``api`` natively."""
    return bool(pool.backends) and all(api in b.apis for b in pool.backends)


def refuse_untranslatable(parsed: ParsedRequest, frontend: Frontend | None,
                          pools: Mapping[str, PoolState]) -> None:
    """Raise now, before admission, the 400 a translation recorded when the request cannot
    pass through: no pool speaks its API, or it continues a stored response (always
    translated). Otherwise a pool that speaks it may still take it as sent, and ``plan_upstream``
    decides once the route is known."""
    translated = parsed.translated
    if frontend is None or translated is None or translated.refusal is None:
        return
    native = parsed.native
    if (native is None or native.get("previous_response_id") is not None
            or not any(speaks(pool, frontend.name) for pool in pools.values())):
        raise translated.refusal


def plan_upstream(
    frontend: Frontend,
    parsed: ParsedRequest,
    pool: PoolState,
    upstream_model: str,
    request_id: str,
    prompt_tokens: Callable[[], int],
) -> Upstream:
    """Pass through (the pool speaks the API) or translate to chat; the body, the path, the
    stream's scanner and the model renamer that go with it. ``prompt_tokens`` counts the
    prompt: called only for a translated stream whose front-end reports it up front
    (``Frontend.stream_counts_prompt``), since the count may tokenise the whole prompt.
    A translated answer is built with the public name; a passed-through one has the engine's
    model name (whatever it is) and id rewritten."""
    if (speaks(pool, frontend.name) and parsed.native is not None
            and parsed.native.get("previous_response_id") is None):
        native = dict(parsed.native)
        native["model"] = upstream_model
        prefix = _NATIVE_IDS.get(frontend.name)
        gateway_id = prefix + request_id if prefix is not None else None
        # one rewriter: a stream's scanner feeds it, or ``answer`` a whole body (never both)
        rewriter = AnswerRewriter(parsed.model, gateway_id, upstream_model)
        scanner: Scanner | None = None
        if parsed.stream:
            stream = frontend.stream(model=parsed.model, request_id=request_id, prompt_tokens=0,
                                     request=parsed.native)
            scanner = _RenamedNative(frontend.name, stream.fail, rewriter)
        return Upstream(frontend, True, frontend.upstream_path, _encode(native), scanner,
                        rewriter, parsed.model, request_id, _SHAPES.get(frontend.name, "openai"),
                        parsed.native, api=frontend.name)
    translated = parsed.translated
    ignored: tuple[str, ...] = ()
    chat = dict(parsed.payload)
    if translated is not None:
        if translated.refusal is not None:
            raise translated.refusal  # what chat cannot carry: a 400 naming it
        ignored = translated.ignored
        if translated.effort is not None and pool_engine(pool) in _NO_REASONING_EFFORT:
            chat.pop("reasoning_effort", None)
            ignored = (*ignored, translated.effort)
    chat["model"] = upstream_model
    scanner = None
    if parsed.stream:
        # the prompt is counted only for a stream that reports it (``stream_counts_prompt``)
        translator = frontend.stream(
            model=parsed.model, request_id=request_id,
            prompt_tokens=prompt_tokens() if frontend.stream_counts_prompt else 0,
            request=parsed.native)
        scanner = TranslatingScanner(translator)
    return Upstream(frontend, False, CHAT_PATH, _encode(chat), scanner, None, parsed.model,
                    request_id, "openai", parsed.native,
                    translator if parsed.stream else None, ignored=ignored, api=frontend.name)


class _RenamedNative(NativeStreamScanner):
    """A passed-through stream read for usage, with the engine's model name and id rewritten;
    ``final``: a Responses stream's terminal object (for the stored response)."""

    __slots__ = ("final", "rewriter")

    def __init__(self, api: str, on_error: Callable[[GatewayError], bytes],
                 rewriter: AnswerRewriter) -> None:
        super().__init__(api, on_error=on_error)
        self.rewriter = rewriter
        self.final: dict[str, Any] | None = None

    def _responses_event(self, kind: Any, event: dict[str, Any]) -> None:
        super()._responses_event(kind, event)
        if kind in ("response.completed", "response.incomplete"):
            response = event.get("response")
            self.final = response if isinstance(response, dict) else None

    def feed(self, chunk: bytes) -> bytes:
        return self.rewriter.chunk(super().feed(chunk))

    def flush(self) -> bytes:
        return self.rewriter.chunk(super().flush()) + self.rewriter.flush()


@lru_cache(maxsize=16)
def _error_class(status: int) -> type[GatewayError]:
    """A gateway error class for a backend's error status (its message is the backend's)."""
    base: type[GatewayError] = {400: InvalidRequest, 401: AuthenticationFailed,
                                404: ModelNotFound, 429: RateLimited}.get(status, InvalidRequest)
    return cast("type[GatewayError]", type(f"Backend{status}", (base,), {"status": status}))


def _backend_error(status: int, body: bytes) -> GatewayError:
    """A chat backend's error answer as a gateway error, to be shown in the client's API."""
    message = "the backend could not serve the request"
    code: str | None = None
    try:
        data: Any = _decode(body) if body else None
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        text = data["error"].get("message")
        if isinstance(text, str) and text:
            message = text[:2000]
        given = data["error"].get("code")  # OpenAI's (``context_length_exceeded``), if a code
        if isinstance(given, str) and _CODE.fullmatch(given):
            code = given
    return _error_class(status)(message, code=code)


#: an error code a backend's answer may pass on to the client: a short snake_case name
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
