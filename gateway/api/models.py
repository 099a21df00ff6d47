"""``GET /v1/models`` and ``GET /v1/models/{id}``: the public model names of the policy.

Each model is shown with what an agent needs to size its requests, so it does not guess: its
context window (the policy's ``context_length``, else what an engine of its pool reports,
``upstream.model_info``) and its output bound (``max_output_tokens``, else the ceiling the
gateway enforces, ``Model.output_ceiling``). Two shapes, by the client:

* OpenAI's (the default): ``{"object": "list", "data": [{"id", "object": "model", "created",
  "owned_by", "max_output_tokens", "context_length", "max_model_len"}]}`` (the context window
  under both names clients read: OpenRouter's and vLLM's; absent when unknown);
* Anthropic's, for a request with an ``anthropic-version`` header (every Anthropic SDK sends
  one): ``{"data": [{"type": "model", "id", "display_name", "created_at", "lifecycle":
  "active", "max_input_tokens", "max_tokens"}], "has_more": false, "first_id", "last_id"}``.

Authenticated like the proxy routes: ``Authorization: Bearer``, or Anthropic's ``x-api-key``;
errors in the client's shape.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import msgspec

from gateway.context import new_request_id
from gateway.dialects.registry import FRONTENDS, send_api_error
from gateway.errors import GatewayError, MethodNotAllowed, ModelNotFound
from gateway.http.asgi import clip, get_header, send_error, send_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import Model
    from gateway.runtime import Runtime
    from gateway.types import Receive, Scope, Send
    from gateway.upstream.model_info import ContextLookup

__all__ = ["ModelsHandler"]

_encode = msgspec.json.encode


def _model_id(scope: Scope) -> str:
    """The id after ``/v1/models/`` in the request path ('' for the list)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = unquote(raw.split(b"?", 1)[0].decode("utf-8", "replace"))
    return path.removeprefix("/v1/models").strip("/")


class ModelsHandler:
    """Lists models, or shows one when the route carries a ``model_id``.

    ``lookup``: engines' context windows, for models whose policy sets none (None: the
    policy's figures only).
    """

    def __init__(self, current: Callable[[], Runtime],
                 lookup: ContextLookup | None = None) -> None:
        self.current = current
        self.lookup = lookup
        self.created = int(time.time())
        self.created_at = datetime.fromtimestamp(self.created, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")

    async def _context(self, runtime: Runtime, model: Model) -> int | None:
        """The model's context window: the policy's, else its pool's engine's."""
        if model.context_length is not None or self.lookup is None:
            return model.context_length
        pool = runtime.router.pools.get(model.pool)
        if pool is None:
            return None
        return await self.lookup.context(model.name, pool, model.upstream_name)

    def _openai(self, model: Model, context: int | None) -> dict[str, Any]:
        card: dict[str, Any] = {"id": model.name, "object": "model", "created": self.created,
                                "owned_by": model.owned_by,
                                "max_output_tokens": model.output_ceiling}
        if context is not None:
            card["context_length"] = card["max_model_len"] = context
        return card

    def _anthropic(self, model: Model, context: int | None) -> dict[str, Any]:
        return {"type": "model", "id": model.name, "display_name": model.name,
                "created_at": self.created_at, "lifecycle": "active",
                "max_input_tokens": context, "max_tokens": model.output_ceiling}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        id_header = [(b"x-request-id", new_request_id().encode())]
        anthropic = get_header(scope, b"anthropic-version") is not None
        try:
            if scope["method"] not in ("GET", "HEAD"):
                raise MethodNotAllowed(
                    f"method {scope['method']} is not allowed here; use GET",
                    headers={"Allow": "GET"},
                )
            runtime = self.current()
            auth = get_header(scope, b"authorization")
            if auth is None:  # Anthropic's own header
                key = get_header(scope, b"x-api-key")
                auth = b"Bearer " + key if key is not None else None
            await runtime.resolver.authenticate(auth)
            card = self._anthropic if anthropic else self._openai
            model_id = _model_id(scope)
            if model_id:
                model = runtime.models.get(model_id)
                if model is None:
                    raise ModelNotFound(f"The model '{clip(model_id)}' does not exist.",
                                        param="model")
                body = card(model, await self._context(runtime, model))
            else:
                models = runtime.policy.models
                contexts = await asyncio.gather(*(self._context(runtime, m) for m in models))
                body = self._listing([card(m, c) for m, c in zip(models, contexts, strict=True)],
                                     anthropic=anthropic)
            await send_json(send, 200, _encode(body), id_header)
        except GatewayError as exc:
            if anthropic:
                await send_api_error(send, FRONTENDS["messages"], exc, id_header)
            else:
                await send_error(send, exc, id_header)

    @staticmethod
    def _listing(cards: list[dict[str, Any]], *, anthropic: bool) -> dict[str, Any]:
        if not anthropic:
            return {"object": "list", "data": cards}
        return {"data": cards, "has_more": False,
                "first_id": cards[0]["id"] if cards else None,
                "last_id": cards[-1]["id"] if cards else None}

    def __repr__(self) -> str:
        return f"<ModelsHandler [lookup: {self.lookup!r}]>"
