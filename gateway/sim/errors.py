"""HTTP errors of the simulator, rendered in the shape of the API that was called.

::

    SimHTTPError                 (status, type, code; OpenAI's {"error": {...}} by default)
    ├── BadRequest               400 invalid_request_error
    ├── ModelNotFound            404 invalid_request_error / model_not_found
    ├── NotFound                 404 route not found
    ├── MethodNotAllowed         405
    ├── RateLimited              429 rate_limit_exceeded (fault injection, with Retry-After)
    ├── InjectedError            any status chosen by a fault
    ├── Overloaded               503 queue_full (the engine's waiting queue is at its limit)
    └── EngineStopped            503 engine_stopped (the engine shut down mid-answer)

On ``/v1/messages`` the same errors take Anthropic's shape, ``{"type": "error", "error":
{"type": ..., "message": ...}}``, with its type by status (:data:`ANTHROPIC_TYPES`); a full
queue is Anthropic's 529 ``overloaded_error`` there.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ANTHROPIC_TYPES",
    "BadRequest",
    "EngineFailed",
    "EngineStopped",
    "InjectedError",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotFound",
    "Overloaded",
    "RateLimited",
    "SimHTTPError",
    "anthropic_error_body",
    "anthropic_status_type",
    "error_body",
    "render_error",
]

_encode = msgspec.json.Encoder().encode


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    """The JSON body OpenAI returns for an error."""
    return _encode({"error": {"message": message, "type": type_, "param": param, "code": code}})


#: Anthropic's error type by HTTP status (its documented table); other 4xx are invalid requests,
#: other 5xx API errors.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_body(message: str, type_: str) -> bytes:
    """The JSON body Anthropic returns for an error (also the data of a stream's error event)."""
    return _encode({"type": "error", "error": {"type": type_, "message": message}})


def anthropic_status_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    found = ANTHROPIC_TYPES.get(status)
    if found is not None:
        return found
    return "invalid_request_error" if status < 500 else "api_error"


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

    @property
    def anthropic_status(self) -> int:
        """The status on Anthropic's API (the same but for a full queue)."""
        return self.status

    def anthropic_body(self) -> bytes:
        return anthropic_error_body(self.message, anthropic_status_type(self.anthropic_status))


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

    @property
    def anthropic_status(self) -> int:
        return 529


class EngineStopped(SimHTTPError):
    status = 503
    type = "server_error"
    code = "engine_stopped"


class EngineFailed(SimHTTPError):
    """The engine failed mid-generation (the ``error_event_after`` fault)."""

    status = 500
    type = "server_error"
    code = "engine_error"


def render_error(error: SimHTTPError, api: str) -> tuple[int, bytes]:
    """The status and body of ``error`` on ``api`` (``"messages"``: Anthropic's shape)."""
    if api == "messages":
        return error.anthropic_status, error.anthropic_body()
    return error.status, error.body()
