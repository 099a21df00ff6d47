"""The pipeline's calls for stored responses: continue one (``previous_response_id``), keep one.

``continued`` runs before translation: a request naming ``previous_response_id`` gets the stored
conversation of the caller's tenant (``stored.earlier_messages``) as ``earlier``, or OpenAI's
400 ``previous_response_not_found`` naming the parameter when the response is missing, expired
or another tenant's (the three are one answer, so an id reveals nothing across tenants). Such a
request is always translated (``apis.plan``): the conversation is the gateway's, not a
backend's.

``keeper`` is what the pipeline calls once the answer is complete: for a Responses request
with ``store`` not false, it saves the response object (the whole body, or a stream's last
event), the client's request and the chat messages the request was translated to (earlier
turns included, so the next turn rebuilds the whole conversation from one row). The pipeline
runs it beside the usage record, before the response's last bytes go out: a client that has
its complete answer can retrieve or continue it at once, from any replica. A save that fails
(the database away) is logged and costs the client nothing but a later 404.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.apis.responses.stored import earlier_messages
from gateway.errors import GatewayError, clip
from gateway.ledger.errors import LedgerUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from gateway.apis.base import Frontend
    from gateway.apis.plan import Upstream
    from gateway.ledger.sql.responses import ResponseStore, StoredResponse
    from gateway.request.parse import ParsedRequest

__all__ = [
    "PreviousResponseNotFound", "ResponseNotFound", "StoreUnavailable", "continued", "find",
    "keeper", "not_found",
]

_log = logging.getLogger("gateway.apis.responses.store")
_HOUR_MS = 3_600_000


class ResponseNotFound(GatewayError):
    """A stored response that is not there for this tenant (missing, expired, another's)."""

    status = 404
    type = "invalid_request_error"


class PreviousResponseNotFound(GatewayError):
    """A request continues a response that is not there for this tenant: OpenAI answers 400
    (the request is invalid), not 404 (the route exists), with ``previous_response_not_found``."""

    status = 400
    type = "invalid_request_error"


class StoreUnavailable(GatewayError):
    """The database holding stored responses cannot be reached."""

    status = 503
    type = "api_error"
    code = "response_store_unavailable"


def not_found(response_id: str,
              param: str | None = None) -> ResponseNotFound | PreviousResponseNotFound:
    """OpenAI's 404 for a response id, or its 400 when a request named it as
    ``previous_response_id`` (with OpenAI's code for that case)."""
    if param == "previous_response_id":
        return PreviousResponseNotFound(
            f"Previous response with id '{clip(response_id)}' not found.",
            param=param, code="previous_response_not_found")
    return ResponseNotFound(f"Response with id '{clip(response_id)}' not found.", param=param)


async def find(store: ResponseStore | None, tenant: str, response_id: str,
               param: str | None = None) -> StoredResponse:
    """``tenant``'s stored response, or the 404 (a 503 when the database is away)."""
    if store is None:
        raise not_found(response_id, param)
    try:
        stored = await store.get(tenant, response_id)
    except LedgerUnavailable as exc:
        raise StoreUnavailable("stored responses are unavailable right now; retry") from exc
    if stored is None:
        raise not_found(response_id, param)
    return stored


async def continued(store: ResponseStore | None, frontend: Frontend, tenant: str,
                    native: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The earlier turns a Responses request continues (None: it continues none, or names
    something that is not a string, which ``translate`` refuses with a 400)."""
    previous = native.get("previous_response_id")
    if frontend.name != "responses" or not isinstance(previous, str):
        return None
    stored = await find(store, tenant, previous, "previous_response_id")
    return earlier_messages(stored.messages, stored.answer)


def keeper(store: ResponseStore | None, frontend: Frontend, parsed: ParsedRequest,
           plan: Upstream | None, tenant: str, ttl_hours: float
           ) -> Callable[[bytes | None], Coroutine[Any, Any, None]] | None:
    """The save of a request's response once complete (``body``: the whole answer the client
    got, None for a stream), or None when the request is not stored. Calling it queues the row
    for the store's next commit at once; the coroutine it returns waits for that commit (so
    the caller waits for the usage record meanwhile without a task for the save)."""
    native = parsed.native
    if (store is None or plan is None or frontend.name != "responses" or native is None
            or native.get("store") is False):
        return None
    messages = parsed.payload.get("messages")
    ttl_ms = max(1, int(ttl_hours * _HOUR_MS))

    def keep(body: bytes | None) -> Coroutine[Any, Any, None]:
        answer = plan.final(body)
        response_id = answer.get("id") if answer is not None else None
        if answer is None or not isinstance(response_id, str):
            return _saved(None, "")  # no complete response object: nothing to retrieve
        # a translated whole answer is saved as the bytes the client got: they are its JSON
        encoded = body if body is not None and answer is plan.answered else None
        try:
            queued = store.put_soon(tenant, response_id, request=native,
                                    messages=messages if isinstance(messages, list) else [],
                                    answer=answer, ttl_ms=ttl_ms, answer_json=encoded)
        except Exception:
            _log.warning("stored responses: could not save %s", clip(response_id),
                         exc_info=True)
            return _saved(None, response_id)
        return _saved(queued, response_id)

    return keep


async def _saved(queued: asyncio.Future[int] | None, response_id: str) -> None:
    """Wait for a queued save's commit; a save that failed (the database away) is logged and
    costs the client nothing but a later 404."""
    if queued is None:
        return
    try:
        await queued
    except Exception:
        _log.warning("stored responses: could not save %s", clip(response_id), exc_info=True)
