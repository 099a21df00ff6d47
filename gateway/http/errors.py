"""Upstream failures, by family, so callers catch what they can act on.

    UpstreamError
    ├── UpstreamConnectError     the backend could not be reached (nothing was sent)
    ├── UpstreamTimeout
    │   ├── UpstreamConnectTimeout
    │   ├── UpstreamFirstByteTimeout   no response headers in time
    │   ├── UpstreamIdleTimeout        a gap between chunks was too long
    │   └── UpstreamTotalTimeout
    └── UpstreamProtocolError    the backend spoke garbage (the connection is closed)
        ├── UpstreamConnectionLost     it closed the connection before the response ended
        └── UpstreamResponseTooLarge   its head or (whole) body passed the client's caps

Both clients map their library's exceptions onto these (``raise ... from exc``); no stage above
``gateway.upstream`` sees aiohttp's or httptools' exceptions.

Two texts per error, on purpose. ``str(exc)`` is the internal message, for logs and traces.
What a *client* may see is built only from the class (:attr:`UpstreamError.public`) and the
``detail`` the client code set from its own fields (an errno's text, a number of seconds), never
from a library's ``str`` or ``repr``: aiohttp's exception reprs carry the request, with the
backend's ``Authorization`` header and the internal URL (issue 14, point 4).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamConnectionLost",
    "UpstreamError",
    "UpstreamFirstByteTimeout",
    "UpstreamIdleTimeout",
    "UpstreamProtocolError",
    "UpstreamResponseTooLarge",
    "UpstreamTimeout",
    "UpstreamTotalTimeout",
]


class UpstreamError(Exception):
    """Base of every failure talking to a backend."""

    #: what happened, as a client may read it after "backend '<label>' "
    public: ClassVar[str] = "failed"

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        #: client-safe precision, set only from the client code's own fields
        self.detail = detail


class UpstreamStreamError(UpstreamError):
    """The backend ended a stream after its first byte with an error event of its own (an
    engine failing mid-generation: vLLM's ``data: {"error": ...}``)."""

    public = "failed mid-stream"


class UpstreamConnectError(UpstreamError):
    """The backend refused or could not be reached; the request was not sent."""

    public = "is unreachable"


class UpstreamTimeout(UpstreamError):
    """A deadline passed while waiting for the backend."""

    public = "timed out"


class UpstreamConnectTimeout(UpstreamTimeout, UpstreamConnectError):
    """Connecting took longer than the connect timeout."""

    public = "did not accept a connection in time"


class UpstreamFirstByteTimeout(UpstreamTimeout):
    """The response headers did not arrive in time."""

    public = "timed out before answering"


class UpstreamIdleTimeout(UpstreamTimeout):
    """The backend went silent mid-response for longer than the idle timeout."""

    public = "went silent mid-response"


class UpstreamTotalTimeout(UpstreamTimeout):
    """The whole exchange took longer than the total timeout."""

    public = "ran past the request's total time"


class UpstreamProtocolError(UpstreamError):
    """The backend answered with invalid HTTP, or the exchange broke; never retried blindly."""

    public = "sent an invalid HTTP response"


class UpstreamConnectionLost(UpstreamProtocolError):
    """The connection ended (EOF or reset) before the response was complete."""

    public = "closed the connection mid-response"


class UpstreamResponseTooLarge(UpstreamProtocolError):
    """The response head (bytes or header count) or a whole-read body passed the caps."""

    public = "sent a response over the size limits"
