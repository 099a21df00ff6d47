"""OpenAI-shaped errors: one class per case, the HTTP status as a class attribute.

    GatewayError
    ├── InvalidRequest (400)            bad JSON, wrong types, missing fields, limits
    ├── AuthenticationFailed (401)      missing, malformed or unknown API key
    ├── ModelNotFound (404)
    ├── RouteNotFound (404)
    ├── MethodNotAllowed (405)
    ├── BodyTooLarge (413)
    ├── RateLimited (429)               a quota, a call limit or a backend said slow down
    ├── InternalError (500)             a bug; no detail leaves the process
    ├── BackendFailure (502)            the backend failed or answered garbage
    ├── NoBackendAvailable (503)        every backend is down or full
    ├── ServerShuttingDown (503)        draining: retry on another replica
    ├── QuotaStoreUnavailable (503)     Redis away and the policy fails closed
    ├── UsageNotRecorded (503)          the usage record not durable within its bound
    └── UpstreamTimeout (504)

Every error leaves the gateway as ``{"error": {"message", "type", "param", "code"}}``;
``error_body`` is the only place that builds that body (the Messages and Responses front-ends
re-shape it into their own), so no code path can answer with a traceback.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

#: characters of client-supplied text an error message or a log field quotes
FIELD_LIMIT = 256


def clip(text: str, limit: int = FIELD_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, marked with how many were cut.

    Client-supplied text (an unknown model's name, an error echoing it) can be megabytes;
    a log line or an error message keeps its start, and says it was cut.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"

__all__ = [
    "FIELD_LIMIT",
    "AuthenticationFailed",
    "BackendFailure",
    "BodyTooLarge",
    "GatewayError",
    "InternalError",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotFound",
    "NoBackendAvailable",
    "QuotaStoreUnavailable",
    "RateLimited",
    "RouteNotFound",
    "ServerShuttingDown",
    "UpstreamTimeout",
    "UsageNotRecorded",
    "clip",
    "error_body",
]


class GatewayError(Exception):
    """Base of every error the gateway answers with."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        if code is not None:
            self.code_override: str | None = code
        else:
            self.code_override = None

    @property
    def error_code(self) -> str | None:
        return self.code_override or self.code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.error_code)


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BackendFailure(GatewayError):
    status = 502
    type = "api_error"
    code = "backend_error"


class NoBackendAvailable(GatewayError):
    status = 503
    type = "api_error"
    code = "no_backend_available"


class ServerShuttingDown(GatewayError):
    status = 503
    type = "api_error"
    code = "shutting_down"


class InternalError(GatewayError):
    """A bug in the gateway: answered as a plain 500 with no detail."""

    status = 500
    type = "server_error"


class QuotaStoreUnavailable(GatewayError):
    """The shared quota store is away and the policy fails closed."""

    status = 503
    type = "api_error"
    code = "quota_unavailable"


class UsageNotRecorded(GatewayError):
    """The answer's usage record could not be made durable within ``store.ledger_timeout``
    (the database and the spool both failing): the answer is withheld rather than given
    without a record of it."""

    status = 503
    type = "api_error"
    code = "usage_not_recorded"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "api_error"
    code = "upstream_timeout"


class _ErrorDetail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None
    code: str | None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorDetail


_encoder = msgspec.json.Encoder()


def error_body(message: str, type_: str, param: str | None, code: str | None) -> bytes:
    """The one place an error body is built."""
    return _encoder.encode(_ErrorEnvelope(_ErrorDetail(message, type_, param, code)))
