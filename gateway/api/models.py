"""``GET /v1/models`` and ``GET /v1/models/{id}``: the public model names of the policy."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import unquote

import msgspec

from gateway.context import new_request_id
from gateway.errors import GatewayError, MethodNotAllowed, ModelNotFound
from gateway.http.asgi import clip, get_header, send_error, send_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.runtime import Runtime
    from gateway.types import Receive, Scope, Send

__all__ = ["ModelsHandler"]


class _ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: str = "model"


class _ModelList(msgspec.Struct):
    data: list[_ModelCard]
    object: str = "list"


def _model_id(scope: Scope) -> str:
    """The id after ``/v1/models/`` in the request path ('' for the list)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = unquote(raw.split(b"?", 1)[0].decode("utf-8", "replace"))
    return path.removeprefix("/v1/models").strip("/")


class ModelsHandler:
    """Lists models, or shows one when the route carries a ``model_id``."""

    def __init__(self, current: Callable[[], Runtime]) -> None:
        self.current = current
        self.created = int(time.time())
        self._built_for: Runtime | None = None
        self.cards: dict[str, _ModelCard] = {}
        self.list_body = b""

    def _cards(self) -> None:
        """Rebuild the cards when the policy was reloaded."""
        runtime = self.current()
        if runtime is self._built_for:
            return
        self.cards = {
            m.name: _ModelCard(m.name, self.created, m.owned_by) for m in runtime.policy.models
        }
        self.list_body = msgspec.json.encode(_ModelList(list(self.cards.values())))
        self._built_for = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        id_header = [(b"x-request-id", new_request_id().encode())]
        try:
            if scope["method"] not in ("GET", "HEAD"):
                raise MethodNotAllowed(
                    f"method {scope['method']} is not allowed here; use GET",
                    headers={"Allow": "GET"},
                )
            await self.current().resolver.authenticate(get_header(scope, b"authorization"))
            self._cards()
            model_id = _model_id(scope)
            if not model_id:
                await send_json(send, 200, self.list_body, id_header)
                return
            card = self.cards.get(model_id)
            if card is None:
                raise ModelNotFound(f"The model '{clip(model_id)}' does not exist.", param="model")
            await send_json(send, 200, msgspec.json.encode(card), id_header)
        except GatewayError as exc:
            await send_error(send, exc, id_header)
