"""OpenAI-shaped HTTP errors of the simulator.

::

    SimHTTPError                 (status, type, code; rendered as {"error": {...}})
    ├── BadRequest               400 invalid_request_error
    ├── ModelNotFound            404 invalid_request_error / model_not_found
    ├── NotFound                 404 route not found
    ├── MethodNotAllowed         405
    ├── RateLimited              429 rate_limit_exceeded (fault injection, with Retry-After)
    ├── InjectedError            any status chosen by a fault
    └── Overloaded               503 queue_full (the engine's waiting queue is at its limit)
"""

from __future__ import annotations

import msgspec

__all__ = [
    "BadRequest",
    "InjectedError",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotFound",
    "Overloaded",
    "RateLimited",
    "SimHTTPError",
    "error_body",
]

_encode = msgspec.json.Encoder().encode


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    """The JSON body OpenAI returns for an error."""
    return _encode({"error": {"message": message, "type": type_, "param": param, "code": code}})


class SimHTTPError(Exception):
    """An error answered to the client; subclasses fix the status and type."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return []

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


class BadRequest(SimHTTPError):
    status = 400
    type = "invalid_request_error"


class ModelNotFound(SimHTTPError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(SimHTTPError):
    status = 404
    type = "invalid_request_error"


class MethodNotAllowed(SimHTTPError):
    status = 405
    type = "invalid_request_error"


class RateLimited(SimHTTPError):
    status = 429
    type = "rate_limit_exceeded"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


class InjectedError(SimHTTPError):
    """A fault-injected error with the status the fault asked for."""

    def __init__(self, status: int) -> None:
        super().__init__(f"simulated error {status} (fault injection)")
        self.status = status
        self.type = "invalid_request_error" if 400 <= status < 500 else "server_error"
        self.code = "simulated_error"


class Overloaded(SimHTTPError):
    status = 503
    type = "server_error"
    code = "queue_full"
