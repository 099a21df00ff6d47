"""``GET`` / ``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.

The stored responses of the Responses API (``store: true``, the default), for the caller's
tenant only: another tenant's id is a 404 exactly like a missing or expired one. Authenticated
like every route (``Authorization: Bearer``), errors in OpenAI's shape. ``input_items`` pages
the items the client sent in that request (``limit`` 1-100, default 20; ``order`` asc / desc,
default desc; ``after`` / ``before`` an item id), as OpenAI does. Each call decodes a stored
conversation, so the routes share the per-key ``server.call_limits`` of the utility routes.
A deleted response is not found at once; its row (and its room in the tenant's
``stored_responses`` bound) goes at once too, unless a later stored response continues it:
then it goes with that one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote

import msgspec

from gateway.api.count_tokens import caller
from gateway.context import new_request_id
from gateway.dialects.responses import input_items
from gateway.dialects.responses.store import StoreUnavailable, find, not_found
from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    clip,
)
from gateway.http.asgi import get_header, send_error, send_json
from gateway.ledger.errors import LedgerUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.ledger.sql.stored_responses import ResponseStore
    from gateway.runtime import Runtime
    from gateway.types import Receive, Scope, Send

__all__ = ["PREFIX", "StoredResponsesHandler"]

_log = logging.getLogger("gateway.api.stored_responses")

PREFIX = "/v1/responses/"
_INPUT_ITEMS = "input_items"
_QUERY = frozenset({"limit", "order", "after", "before", "include", "include[]"})


def _target(scope: Scope) -> tuple[str, str | None]:
    """The response id and the sub-resource (None, or ``input_items``) of the path."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = unquote(raw.split(b"?", 1)[0].decode("utf-8", "replace"))
    parts = path.removeprefix(PREFIX).strip("/").split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 2 and parts[0] and parts[1] == _INPUT_ITEMS:
        return parts[0], _INPUT_ITEMS
    raise RouteNotFound(f"Unknown route: {scope['method']} {clip(path)}")


class _Page(msgspec.Struct, frozen=True):
    """``input_items``'s query parameters."""

    order: str = "desc"
    after: str | None = None
    before: str | None = None
    limit: int = 20


def _page(scope: Scope) -> _Page:
    """``input_items``'s query parameters, checked (a 400 naming the parameter; the values
    themselves are checked by ``input_items``)."""
    found: dict[str, str] = {}
    query = scope.get("query_string", b"").decode("utf-8", "replace")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in _QUERY:
            raise InvalidRequest(f"Unknown parameter: '{clip(name)}'.", param=name)
        found[name] = value
    try:
        limit = int(found.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("'limit' must be an integer from 1 to 100", param="limit") from None
    return _Page(found.get("order", "desc"), found.get("after"), found.get("before"), limit)


class StoredResponsesHandler:
    """Retrieve, delete, or list the input items of one of the tenant's stored responses."""

    def __init__(self, current: Callable[[], Runtime], store: ResponseStore | None) -> None:
        self.current = current
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"x-request-id", new_request_id().encode())]
        try:
            method = scope["method"]
            response_id, sub = _target(scope)
            allowed = ("GET", "HEAD") if sub else ("GET", "HEAD", "DELETE")
            if method not in allowed:
                raise MethodNotAllowed(f"method {method} is not allowed here; use "
                                       f"{' or '.join(a for a in allowed if a != 'HEAD')}",
                                       headers={"Allow": ", ".join(allowed)})
            runtime = self.current()
            identity = await runtime.resolver.authenticate(get_header(scope, b"authorization"))
            headers += runtime.calls.take(caller(scope, identity))
            tenant = identity.tenant if identity is not None else "anonymous"
            if method == "DELETE":
                await self._delete(tenant, response_id)
                body = {"id": response_id, "object": "response", "deleted": True}
            elif sub is None:
                body = (await find(self.store, tenant, response_id)).answer
            else:
                page = _page(scope)
                stored = await find(self.store, tenant, response_id)
                body = input_items(stored.request, response_id=response_id, order=page.order,
                                   after=page.after, before=page.before, limit=page.limit)
            await send_json(send, 200, msgspec.json.encode(body), headers)
        except GatewayError as exc:
            await send_error(send, exc, headers)
        except Exception:  # a bug: a plain 500, never a traceback to the client
            _log.exception("unexpected error on %s %s", scope["method"], clip(scope["path"]))
            await send_error(send, InternalError("internal gateway error"), headers)

    async def _delete(self, tenant: str, response_id: str) -> None:
        if self.store is None:
            raise not_found(response_id)
        try:
            deleted = await self.store.delete(tenant, response_id)
        except LedgerUnavailable as exc:
            raise StoreUnavailable("stored responses are unavailable right now; retry") from exc
        if not deleted:
            raise not_found(response_id)
