"""What the pipeline takes and gives: one request as the edge or a batch line hands it over
(``Inbound``), a batch line's answer (``LineAnswer``), and the long-lived services every request
uses (``Services``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from gateway.accounting import PromptCounter
    from gateway.auth.resolver import Identity
    from gateway.context import RequestContext
    from gateway.dialects.shape import Endpoint
    from gateway.http.base import UpstreamClient
    from gateway.ledger import Ledger
    from gateway.ledger.sql.stored_responses import ResponseStore
    from gateway.quota import QuotaStore
    from gateway.runtime import Runtime
    from gateway.telemetry import Metrics, RequestSpan, RequestTracing
    from gateway.types import RawHeaders
    from gateway.upstream.shadow import Mirror

__all__ = ["Inbound", "LineAnswer", "Services"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """The long-lived services a request uses, built once by the app and never reassigned.

    ``current`` gives the policy snapshot a request starts with (a reload swaps it; a request
    in flight keeps its own); ``draining`` says whether the process is shutting down.
    """

    current: Callable[[], Runtime]
    draining: Callable[[], bool]
    upstream: UpstreamClient
    quota: QuotaStore
    ledger: Ledger
    tracing: RequestTracing
    metrics: Metrics
    mirror: Mirror
    counter: Callable[[str], PromptCounter]
    finished: Callable[[RequestContext, RequestSpan], None]
    settle_later: Callable[[Coroutine[Any, Any, None]], None]
    #: stored responses (Responses API ``store``, ``previous_response_id``); None: none kept
    responses: ResponseStore | None = None
    #: progressive rollouts count each finished request of a versioned model
    rollouts: Callable[[RequestContext], None] | None = None


class Inbound:
    """One request as the pipeline takes it.

    The pipeline calls three methods: :meth:`read_body` reads the body (after authentication:
    an unauthenticated client never makes the gateway read it), :meth:`on_body_read` lets the
    edge start watching for a client that leaves, and :meth:`client_gone` tells a cancellation
    by that watch from a shutdown. Built with callables for them (a batch line, a test); the
    HTTP edge subclasses it and overrides the three methods instead, so a live request builds
    no closures. A batch line sets ``identity``, ``request_class``, ``request_id`` and
    ``batch_id``. A plain slotted class, not a frozen dataclass: one is built per request, and a
    frozen dataclass's ``__init__`` costs several times as much.
    """

    __slots__ = ("_client_gone", "_on_body_read", "_read_body", "batch_id", "endpoint",
                 "headers", "identity", "method", "request_class", "request_id")

    def __init__(
        self,
        *,
        method: str,
        endpoint: Endpoint,
        headers: RawHeaders,
        read_body: Callable[[int], Awaitable[bytes]],
        on_body_read: Callable[[RequestContext], None] | None = None,
        client_gone: Callable[[], bool] | None = None,
        identity: Identity | None = None,
        request_class: str | None = None,
        request_id: str | None = None,
        batch_id: str | None = None,
    ) -> None:
        self.method, self.endpoint, self.headers = method, endpoint, headers
        self._read_body, self._on_body_read = read_body, on_body_read
        self._client_gone = client_gone
        self.identity, self.request_class = identity, request_class
        self.request_id, self.batch_id = request_id, batch_id

    def read_body(self, limit: int) -> Awaitable[bytes]:
        """The body, at most ``limit`` bytes (a larger one is the edge's 413)."""
        return self._read_body(limit)

    def on_body_read(self, ctx: RequestContext) -> None:
        """The body is read and parsed: the request now runs until it is answered."""
        if self._on_body_read is not None:
            self._on_body_read(ctx)

    def client_gone(self) -> bool:
        """Whether the client left (the cause of a cancellation, if one came)."""
        return self._client_gone is not None and self._client_gone()


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """A batch line's answer: the status and the whole body the client would have read."""

    status: int
    body: bytes
