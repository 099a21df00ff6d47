"""What the pipeline asks of every client API, the same five calls whatever the API.

The pipeline holds one request shape (``dialects.shape.ParsedRequest``) and one ``Dialect`` per
API, and never asks which API it serves:

``parse``      the body into the request shape: checked in the API's own terms, carried as chat
               (its conversation state read here: a stored conversation a request continues)
``check``      what must be refused before admission (the output limit in the client's own
               field; what chat cannot carry when no pool could take the request as sent)
``plan``       what goes upstream once the route is known, and how the answer comes back
               (``dialects.plan.Upstream``: path, body, the stream's scanner, the whole answer)
``saver``      the conversation state an answer leaves (a stored response), or None
``send_error`` an error in the API's shape

Every client/backend pair is a translator, pass-through included (the design of Envoy AI
Gateway's ``internal/translator``): ``ChatDialect`` passes chat completions, completions and
embeddings through with the backend's model name; ``FrontendDialect`` checks a ``Frontend``'s
API (Messages, Responses) and translates it to chat, or passes it through to a pool whose
backends speak it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting import request_usage
from gateway.dialects.chat.parse import parse_request
from gateway.dialects.limits import check_output_limit
from gateway.dialects.plan import CHAT_PATH, Upstream, plan_upstream, refuse_untranslatable
from gateway.dialects.registry import (
    FRONTENDS,
    decode_native,
    send_api_error,
    translate_native,
)
from gateway.dialects.responses.store import check_room, earlier_turns, response_saver
from gateway.dialects.shape import ENDPOINTS
from gateway.http.asgi import send_error
from gateway.upstream.rename import AnswerRewriter, RenamingScanner

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from gateway.config import Model
    from gateway.config.model import StoredResponseLimits
    from gateway.dialects.base import Frontend
    from gateway.dialects.shape import Endpoint, ParsedRequest
    from gateway.errors import GatewayError
    from gateway.ledger.sql.stored_responses import ResponseStore
    from gateway.routing.pool import PoolState
    from gateway.types import RawHeaders, Send

__all__ = ["DIALECTS", "ChatDialect", "Conversation", "Dialect", "FrontendDialect"]

_encode = msgspec.json.Encoder().encode
#: the id prefix of each chat-shaped API's answers (OpenAI's); embeddings answers carry no id
_ID_PREFIXES = {"chat": "chatcmpl-", "completions": "cmpl-"}


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where a request's conversation state lives: the stored responses of its tenant, the
    tenant's bound on them and how long a new one is kept (only the APIs that keep state read
    it)."""

    store: ResponseStore | None
    tenant: str
    bound: StoredResponseLimits
    ttl_hours: float


class Dialect(abc.ABC):
    """One client API, as the pipeline calls it (shared, stateless)."""

    __slots__ = ("api", "chat_path", "key_header")

    def __init__(self, api: str, chat_path: str, key_header: bytes | None = None) -> None:
        #: the API's name on records and metrics
        self.api = api
        #: the path of the chat-shaped request it is carried as (a shadow mirrors that)
        self.chat_path = chat_path
        #: the API's own header for the key when ``Authorization`` is absent, or None
        self.key_header = key_header

    @abc.abstractmethod
    async def parse(self, body: bytes, endpoint: Endpoint,
                    conversation: Conversation) -> ParsedRequest:
        """The request in the pipeline's shape; a 400 naming the field when it is not valid."""

    @abc.abstractmethod
    def check(self, model: Model, parsed: ParsedRequest,
              pools: Mapping[str, PoolState]) -> None:
        """Raise what must be refused before admission."""

    @abc.abstractmethod
    def plan(self, parsed: ParsedRequest, raw: bytes, pool: PoolState, upstream_model: str,
             request_id: str, prompt_tokens: Callable[[], int]) -> Upstream:
        """What goes to ``pool`` and how its answer comes back (``raw``: the client's body;
        ``prompt_tokens`` counts the prompt, called only when the plan needs the figure)."""

    def saver(self, parsed: ParsedRequest, plan: Upstream, conversation: Conversation
              ) -> Callable[[bytes | None], Coroutine[Any, Any, None]] | None:
        """The save of the state this answer leaves (None: it leaves none)."""
        return None

    @abc.abstractmethod
    async def send_error(self, send: Send, error: GatewayError, headers: RawHeaders) -> None:
        """An error answer in the API's shape, with ``headers`` and the error's own."""


class ChatDialect(Dialect):
    """Chat completions, completions, embeddings: passed through as the client sent them, with
    the backend's model name (streams always ask for usage; the scanner strips it when the
    client did not ask) and the public name and the gateway's id in the answer."""

    __slots__ = ("_id_prefix",)

    def __init__(self, api: str, path: str) -> None:
        super().__init__(api, path)
        self._id_prefix = _ID_PREFIXES.get(api)

    async def parse(self, body: bytes, endpoint: Endpoint,
                    conversation: Conversation) -> ParsedRequest:
        return parse_request(body, endpoint)

    def check(self, model: Model, parsed: ParsedRequest,
              pools: Mapping[str, PoolState]) -> None:
        check_output_limit(model, parsed, None)

    def plan(self, parsed: ParsedRequest, raw: bytes, pool: PoolState, upstream_model: str,
             request_id: str, prompt_tokens: Callable[[], int]) -> Upstream:
        wants_usage = request_usage(parsed.payload, parsed.stream)
        body = raw
        if upstream_model != parsed.model or not wants_usage:
            parsed.payload["model"] = upstream_model
            body = _encode(parsed.payload)
        prefix = self._id_prefix
        # one rewriter: a stream's scanner feeds it, or ``Upstream.answer`` a whole body
        rewriter = AnswerRewriter(parsed.model,
                                  prefix + request_id if prefix is not None else None,
                                  upstream_model)
        scanner = (RenamingScanner(rewriter, strip_usage=not wants_usage) if parsed.stream
                   else None)
        return Upstream(None, True, self.chat_path, body, scanner, rewriter, parsed.model,
                        request_id, "openai", api=self.api)

    async def send_error(self, send: Send, error: GatewayError, headers: RawHeaders) -> None:
        await send_error(send, error, headers)


class FrontendDialect(Dialect):
    """A ``Frontend``'s API (Messages, Responses): checked in its own shape and translated to
    chat, or passed through to a pool that speaks it (``dialects.plan``); Responses' stored
    conversations read and saved (``dialects.responses.store``)."""

    __slots__ = ("frontend",)

    def __init__(self, frontend: Frontend) -> None:
        super().__init__(frontend.name, CHAT_PATH, frontend.key_header)
        self.frontend = frontend

    async def parse(self, body: bytes, endpoint: Endpoint,
                    conversation: Conversation) -> ParsedRequest:
        native = decode_native(body)
        frontend, store, tenant = self.frontend, conversation.store, conversation.tenant
        # a request to be stored by a tenant at its stored-responses bound: a 400
        await check_room(store, frontend, tenant, native, conversation.bound, len(body))
        earlier = await earlier_turns(store, frontend, tenant, native)
        parsed, _ = translate_native(native, frontend, earlier)
        return parsed

    def check(self, model: Model, parsed: ParsedRequest,
              pools: Mapping[str, PoolState]) -> None:
        check_output_limit(model, parsed, self.frontend)
        # what chat cannot carry, when no pool could take it as sent
        refuse_untranslatable(parsed, self.frontend, pools)

    def plan(self, parsed: ParsedRequest, raw: bytes, pool: PoolState, upstream_model: str,
             request_id: str, prompt_tokens: Callable[[], int]) -> Upstream:
        return plan_upstream(self.frontend, parsed, pool, upstream_model, request_id,
                             prompt_tokens)

    def saver(self, parsed: ParsedRequest, plan: Upstream, conversation: Conversation
              ) -> Callable[[bytes | None], Coroutine[Any, Any, None]] | None:
        return response_saver(conversation.store, self.frontend, parsed, plan,
                              conversation.tenant, conversation.ttl_hours)

    async def send_error(self, send: Send, error: GatewayError, headers: RawHeaders) -> None:
        await send_api_error(send, self.frontend, error, headers)


#: every API the gateway serves, by name (``Endpoint.api``)
DIALECTS: dict[str, Dialect] = {
    **{e.api: ChatDialect(e.api, e.path) for e in ENDPOINTS.values() if e.api not in FRONTENDS},
    **{name: FrontendDialect(frontend) for name, frontend in FRONTENDS.items()},
}
