"""The headers a backend gets for one request (the pipeline's side of the hop rules)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.http.headers import request_headers

if TYPE_CHECKING:
    from gateway.context import RequestContext
    from gateway.types import RawHeaders

__all__ = ["outbound_headers"]


def outbound_headers(client: RawHeaders, ctx: RequestContext) -> RawHeaders:
    """What the backend gets: the client's end-to-end headers, the body's type, no
    compression, the gateway's request id and, beside it, the client's own (validated)."""
    headers = request_headers(client)
    headers += (
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"identity"),
        (b"x-request-id", ctx.request_id.encode()),
    )
    if ctx.client_request_id is not None:
        headers.append((b"x-client-request-id", ctx.client_request_id.encode()))
    return headers
