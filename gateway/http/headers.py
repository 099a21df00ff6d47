"""Which headers cross the proxy hop, in each direction.

Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never relayed. The
client's credentials never reach a backend: the backend gets its own key from the policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.types import RawHeaders

__all__ = ["request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# Never forwarded upstream: credentials of the client, and what the client library sets for the
# hop it made (host, length and encoding are the upstream client's business).
_REQUEST_DROP = HOP_BY_HOP | {
    b"authorization",
    b"api-key",
    b"x-api-key",
    b"cookie",
    b"host",
    b"content-length",
    b"content-type",
    b"accept-encoding",
    b"expect",
    b"x-request-id",
    b"x-client-request-id",
}

# Never relayed back: framing is ours; the backend's identity is not the client's business.
_RESPONSE_DROP = HOP_BY_HOP | {
    b"content-length",
    b"server",
    b"date",
    b"set-cookie",
    b"x-request-id",
}


def _connection_tokens(headers: RawHeaders) -> set[bytes]:
    """Header names listed in a Connection header are hop-by-hop too."""
    tokens: set[bytes] = set()
    for key, value in headers:
        if key.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def request_headers(client_headers: RawHeaders) -> RawHeaders:
    """Client headers safe to forward upstream (ASGI servers give names in lower case)."""
    extra = _connection_tokens(client_headers) if any(
        k == b"connection" for k, _ in client_headers
    ) else ()
    return [(k, v) for k, v in client_headers if k not in _REQUEST_DROP and k not in extra]


def response_headers(upstream_headers: RawHeaders) -> RawHeaders:
    """Backend response headers safe to relay to the client."""
    extra = _connection_tokens(upstream_headers)
    return [
        (k.lower(), v)
        for k, v in upstream_headers
        if k.lower() not in _RESPONSE_DROP and k.lower() not in extra
    ]
