"""Translate upstream failures into the errors a client sees (502, 504)."""

from __future__ import annotations

from gateway.errors import BackendFailure, GatewayError, UpstreamTimeout
from gateway.upstream.errors import UpstreamError
from gateway.upstream.errors import UpstreamTimeout as _UpstreamTimeout

__all__ = ["as_gateway_error"]


def as_gateway_error(exc: UpstreamError, backend: str) -> GatewayError:
    """504 for a deadline, 502 for anything else; the message names the backend's failure."""
    if isinstance(exc, _UpstreamTimeout):
        return UpstreamTimeout(f"backend '{backend}' timed out: {exc}")
    return BackendFailure(f"backend '{backend}' failed: {exc}")
