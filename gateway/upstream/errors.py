"""Upstream failures, by family, so callers catch what they can act on.

    UpstreamError
    ├── UpstreamConnectError     the backend could not be reached (nothing was sent)
    ├── UpstreamTimeout
    │   ├── UpstreamConnectTimeout
    │   ├── UpstreamFirstByteTimeout   no response headers in time
    │   ├── UpstreamIdleTimeout        a gap between chunks was too long
    │   └── UpstreamTotalTimeout
    └── UpstreamProtocolError    the connection broke or the backend spoke garbage

``gateway.upstream`` maps the HTTP client's exceptions onto these (``raise ... from exc``); no
stage above it sees aiohttp's exceptions.
"""

from __future__ import annotations

__all__ = [
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamError",
    "UpstreamFirstByteTimeout",
    "UpstreamIdleTimeout",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "UpstreamTotalTimeout",
]


class UpstreamError(Exception):
    """Base of every failure talking to a backend."""


class UpstreamConnectError(UpstreamError):
    """The backend refused or could not be reached; the request was not sent."""


class UpstreamTimeout(UpstreamError):
    """A deadline passed while waiting for the backend."""


class UpstreamConnectTimeout(UpstreamTimeout, UpstreamConnectError):
    """Connecting took longer than the connect timeout."""


class UpstreamFirstByteTimeout(UpstreamTimeout):
    """The response headers did not arrive in time."""


class UpstreamIdleTimeout(UpstreamTimeout):
    """The backend went silent mid-response for longer than the idle timeout."""


class UpstreamTotalTimeout(UpstreamTimeout):
    """The whole exchange took longer than the total timeout."""


class UpstreamProtocolError(UpstreamError):
    """The connection broke mid-response or the backend answered with invalid HTTP."""
