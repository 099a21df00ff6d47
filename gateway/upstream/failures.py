"""Translate upstream failures into the errors a client sees (502, 504).

The message is built from the failure's kind (its class's ``public`` text) and the ``detail``
our client code set, never from ``str(exc)``: a library's text can carry the request it was
sending, the backend's key included. The result also passes the log redactor's key patterns, a
second guard should a backend label or a detail ever hold a key shape.
"""

from __future__ import annotations

from gateway.errors import BackendFailure, GatewayError, UpstreamTimeout
from gateway.http.errors import UpstreamError
from gateway.http.errors import UpstreamTimeout as _UpstreamTimeout
from gateway.telemetry.redact import Redactor

__all__ = ["as_gateway_error", "public_message"]

_REDACTOR = Redactor()


def public_message(exc: UpstreamError, backend: str) -> str:
    """``backend '<label>' <what happened>[ (<detail>)]``, redacted: safe to show a client."""
    text = f"backend '{backend}' {exc.public}"
    if exc.detail:
        text += f" ({exc.detail})"
    return _REDACTOR.text(text)


def as_gateway_error(exc: UpstreamError, backend: str) -> GatewayError:
    """504 for a deadline, 502 for anything else; the message says what kind of failure."""
    if isinstance(exc, _UpstreamTimeout):
        return UpstreamTimeout(public_message(exc, backend))
    return BackendFailure(public_message(exc, backend))
