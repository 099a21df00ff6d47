"""The pipeline's calls for stored responses: room for one more, continue one
(``previous_response_id``), keep one.

``check_room`` runs first, before translation and admission: a Responses request that would be
stored (``store`` not false) by a tenant at its ``stored_responses`` bound (rows, or bytes with
twice this request's body: its row keeps the request and its messages; the answer is not known
yet) is answered 400 ``stored_responses_limit_exceeded``, naming the bound,
the tenant's usage and the limit, and what frees room (``DELETE /v1/responses/{id}``, expiry,
or ``store: false``); nothing is reserved or forwarded. The usage is one row the database keeps
exact (``ResponseStore.usage``); at the bound, the tenant's dead rows are freed first (at most
every few seconds), so an expiry counts at once rather than at the next hourly sweep. Requests
in flight together all pass the check, so a tenant can end past its bound by at most those
(their rows; in bytes, their answers and, beyond the first, their requests). A database
that cannot be reached, or does not answer within ``CHECK_TIMEOUT``, does not refuse the
request (its save would likely fail too, and cost a later 404).

``earlier_turns`` runs before translation too: a request naming ``previous_response_id`` gets the
stored conversation of the caller's tenant (``stored.conversation`` of the response's chain)
as ``earlier``, or OpenAI's 400 ``previous_response_not_found`` naming the parameter when the
response is missing, expired, deleted or another tenant's (the four are one answer, so an id
reveals nothing across tenants). Such a request is always translated (``dialects.plan``): the
conversation is the gateway's, not a backend's.

``response_saver`` is what the pipeline calls once the answer is complete: for a Responses request
with ``store`` not false, it saves the response object (the whole body, or a stream's last
event), the client's request, and the chat messages its turn added (``stored.turn_messages``:
its own input, then the answer's assistant turn; not the turns it continued, which their own
rows hold, nor its instructions) with the id of the response it continued. The pipeline
runs it beside the usage record, before the response's last bytes go out: a client that has
its complete answer can retrieve or continue it at once, from any replica. A save that fails
(the database away) is logged and costs the client nothing but a later 404.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.dialects.responses.stored import conversation, turn_messages
from gateway.errors import GatewayError, clip
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.sql.stored_responses import BrokenChain, ChainTooLong

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from gateway.config.model import StoredResponseLimits
    from gateway.dialects.base import Frontend
    from gateway.dialects.plan import Upstream
    from gateway.dialects.shape import ParsedRequest
    from gateway.ledger.sql.stored_responses import ResponseStore, StorageUsage, StoredResponse

__all__ = [
    "ConversationTooLong", "PreviousResponseNotFound", "ResponseNotFound", "StoreUnavailable",
    "StoredResponsesFull", "check_room", "earlier_turns", "find", "not_found", "response_saver",
]

_log = logging.getLogger("gateway.dialects.responses.store")
#: the longest ``room`` waits for the database (a read; at the bound, a sweep of the tenant):
#: past it the request is not refused for storage
CHECK_TIMEOUT = 1.0
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


class StoredResponsesFull(GatewayError):
    """The tenant is at its ``stored_responses`` bound: the request would store one more.
    A 400 (the request can be sent as it is with ``store: false``), not a 413 (its body is not
    too large) nor a 429 (waiting does not help, unless responses expire meanwhile)."""

    status = 400
    type = "invalid_request_error"
    code = "stored_responses_limit_exceeded"


class ConversationTooLong(GatewayError):
    """A ``previous_response_id`` chain longer than the store reads back."""

    status = 400
    type = "invalid_request_error"
    code = "conversation_too_long"


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


async def check_room(store: ResponseStore | None, frontend: Frontend, tenant: str,
               native: dict[str, Any], bound: StoredResponseLimits | None, size: int) -> None:
    """Refuse (``StoredResponsesFull``) a Responses request that would be stored when
    ``tenant`` is at its ``bound`` (``size``: the request's body; twice it is counted
    against ``max_bytes`` with what the tenant stores already)."""
    if (store is None or frontend.name != "responses" or native.get("store") is False
            or bound is None or (bound.max_rows is None and bound.max_bytes is None)):
        return
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            usage = await store.usage(tenant)
    except (LedgerUnavailable, TimeoutError):
        _log.debug("stored responses: cannot read %s's storage; not checked", clip(tenant))
        return
    why = _past(bound, usage, size)
    if why is not None and store.may_free(tenant):
        # at the bound: first free the expired or deleted rows the sweep has not reached
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                if await store.free(tenant):
                    why = _past(bound, await store.usage(tenant), size)
        except (LedgerUnavailable, TimeoutError):
            _log.debug("stored responses: cannot free %s's expired rows", clip(tenant))
    if why is not None:
        raise StoredResponsesFull(
            f"Stored responses limit reached for this tenant: {why}. Free room by deleting "
            "stored responses it no longer needs (DELETE /v1/responses/{id}; a response that "
            "later stored ones continue is freed with them) or letting them expire, or send "
            "this request with store: false.", param="store")


def _past(bound: StoredResponseLimits, usage: StorageUsage, size: int) -> str | None:
    """Which bound one more stored response would pass, in words; None: there is room."""
    if bound.max_rows is not None and usage.responses >= bound.max_rows:
        return (f"it stores {usage.responses:,} responses, at its limit of "
                f"{bound.max_rows:,} (max_rows)")
    # a stored row holds the request as sent and its messages (each about the body), and
    # the answer, unknown yet
    needed = 2 * size
    if bound.max_bytes is not None and usage.bytes + needed > bound.max_bytes:
        return (f"it stores {usage.bytes:,} bytes of responses, and this request would add "
                f"about {needed:,} more, past its limit of {bound.max_bytes:,} bytes "
                "(max_bytes)")
    return None


async def earlier_turns(store: ResponseStore | None, frontend: Frontend, tenant: str,
                    native: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The earlier turns a Responses request continues (None: it continues none, or names
    something that is not a string, which ``to_chat`` refuses with a 400): the
    conversation of the named response's chain, read in one query."""
    previous = native.get("previous_response_id")
    if frontend.name != "responses" or not isinstance(previous, str):
        return None
    param = "previous_response_id"
    if store is None:
        raise not_found(previous, param)
    try:
        chain = await store.chain(tenant, previous)
    except LedgerUnavailable as exc:
        raise StoreUnavailable("stored responses are unavailable right now; retry") from exc
    except ChainTooLong as exc:
        raise ConversationTooLong(
            f"The conversation of '{clip(previous)}' is too long to continue: {exc}. Start a "
            "new one (send the turns to keep as input).", param=param) from exc
    except BrokenChain:
        _log.warning("stored responses: the conversation of %s is incomplete", clip(previous),
                     exc_info=True)
        raise not_found(previous, param) from None
    if chain is None:
        raise not_found(previous, param)
    return conversation(chain)


def response_saver(store: ResponseStore | None, frontend: Frontend, parsed: ParsedRequest,
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
    # the request's own messages: after the instructions' system message and the turns it
    # continued (those are stored in the rows of its chain)
    own_start = parsed.earlier + (native.get("instructions") is not None)
    own = messages[own_start:] if isinstance(messages, list) else []
    previous = native.get("previous_response_id") if parsed.earlier else None
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
                                    messages=turn_messages(own, answer), answer=answer,
                                    ttl_ms=ttl_ms, answer_json=encoded,
                                    previous_id=previous if isinstance(previous, str) else None,
                                    delta=True)
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
