"""``POST /v1/messages/count_tokens`` (Anthropic): the input tokens of a Messages request.

Answered from the gateway's own tokenizer over the request's chat translation (what admission
and accounting count), without calling a backend: authenticated like every route, bounded by
``server.max_body_bytes`` before anything is decoded, counted on the counting thread when the
body is large (as the proxy counts: a long run without spaces takes seconds to tokenise, and
must not stall the other clients of the worker), rate-limited per key by
``server.call_limits`` (a 429 with the ``x-ratelimit-*`` headers), errors in Anthropic's shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.accounting.offload import OFFLOAD_BYTES, off_loop
from gateway.context import new_request_id
from gateway.dialects.body import decode_object
from gateway.dialects.messages import MessagesFrontend, count_tokens
from gateway.dialects.registry import send_api_error
from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, ModelNotFound
from gateway.http.asgi import clip, header_value, read_body, send_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.accounting import PromptCounter
    from gateway.auth.resolver import Identity
    from gateway.runtime import Runtime
    from gateway.types import Receive, Scope, Send

__all__ = ["CountTokensHandler", "caller"]

_FRONTEND = MessagesFrontend()


class CountTokensHandler:
    """Counts a Messages request's input tokens for the model it names."""

    def __init__(self, current: Callable[[], Runtime],
                 counter: Callable[[str], PromptCounter]) -> None:
        self.current = current
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"x-request-id", new_request_id().encode())]
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed("use POST for /v1/messages/count_tokens",
                                       headers={"Allow": "POST"})
            runtime = self.current()
            auth = header_value(scope["headers"], b"authorization")
            key = header_value(scope["headers"], b"x-api-key")
            if auth is None and key is not None:
                auth = b"Bearer " + key
            identity = await runtime.resolver.authenticate(auth)
            headers += runtime.calls.take(caller(scope, identity))
            body = await read_body(scope, receive, runtime.policy.server.max_body_bytes)
            if not body:
                raise InvalidRequest("request body is empty; expected a JSON object")
            payload = decode_object(body)
            name = payload.get("model")
            if not isinstance(name, str):
                raise InvalidRequest("'model' is a required string", param="model")
            model = runtime.models.get(name)
            if model is None:
                raise ModelNotFound(f"The model '{clip(name)}' does not exist.", param="model")
            counter = self.counter(model.encoding)
            def count() -> dict[str, int]:
                return count_tokens(payload, lambda chat: counter.count_chat(chat).total)

            answer = await off_loop(count) if len(body) > OFFLOAD_BYTES else count()
            await send_json(send, 200, msgspec.json.encode(answer), headers)
        except GatewayError as exc:
            await send_api_error(send, _FRONTEND, exc, headers)


def caller(scope: Scope, identity: Identity | None) -> str:
    """Whom a utility route's call limit counts: the key, or an anonymous caller's address
    (only where the policy lets callers without a key in)."""
    if identity is not None:
        return identity.key_id
    client = scope.get("client")
    return f"anonymous:{client[0] if client else '-'}"
