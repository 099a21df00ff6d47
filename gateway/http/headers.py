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

#: tokens of a Connection header that need no second pass: names dropped anyway, and the empty
#: token of ``a,,b``
_DROPPED_ANYWAY = _RESPONSE_DROP | {b""}


def _connection_tokens(headers: RawHeaders) -> set[bytes]:
    """Header names listed in a Connection header are hop-by-hop too."""
    tokens: set[bytes] = set()
    for key, value in headers:
        if key.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def request_headers(client_headers: RawHeaders) -> RawHeaders:
    """Client headers safe to forward upstream (ASGI servers give names in lower case)."""
    kept: RawHeaders = []
    connection = False
    for key, value in client_headers:
        if key not in _REQUEST_DROP:
            kept.append((key, value))
        elif key == b"connection":
            connection = True
    if connection:  # it may name more headers to drop
        extra = _connection_tokens(client_headers)
        kept = [(k, v) for k, v in kept if k not in extra]
    return kept


def response_headers(upstream_headers: RawHeaders) -> RawHeaders:
    """Backend response headers safe to relay to the client, names in lower case."""
    kept: RawHeaders = []
    extra: set[bytes] | None = None
    for name, value in upstream_headers:
        key = name.lower()
        if key not in _RESPONSE_DROP:
            kept.append((key, value))
        elif key == b"connection" and value.lower() != b"keep-alive":
            # it may name more headers to drop ("keep-alive" names one dropped anyway)
            tokens = {t.strip().lower() for t in value.split(b",")} - _DROPPED_ANYWAY
            if tokens:
                extra = tokens if extra is None else extra | tokens
    if extra:
        kept = [(k, v) for k, v in kept if k not in extra]
    return kept
