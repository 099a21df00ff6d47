"""The span interface of one request and of its upstream attempts, and the no-op spans.

:class:`RequestTracing.start <gateway.telemetry.tracing.RequestTracing.start>` returns
:data:`NOOP_SPAN` (a shared singleton whose methods do nothing and allocate nothing) unless the
request is sampled; only a sampled request builds a
:class:`~gateway.telemetry.recording.RecordingSpan` and touches the OpenTelemetry SDK. This
module imports no OpenTelemetry code, so a gateway with tracing off never loads it.

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``), with the
gateway's own facts under ``gateway.*``. Prompt and completion text are recorded only when the
caller says the tenant's policy allows it (``record_content=True`` on :meth:`RecordingSpan.end`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

    from gateway.telemetry.types import ContextView, UsageView
    from gateway.types import RawHeaders

__all__ = ["NOOP_ATTEMPT", "NOOP_SPAN", "AttemptSpan", "RequestSpan"]


class AttemptSpan(Protocol):
    """One upstream attempt; a context manager that ends the span on exit."""

    def __enter__(self) -> AttemptSpan: ...
    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def response(self, status: int) -> None: ...
    def traceparent(self) -> bytes | None: ...


class RequestSpan(Protocol):
    """The SERVER span of one request.

    The contract of each method is on :class:`~gateway.telemetry.recording.RecordingSpan`.
    """

    @property
    def sampled(self) -> bool: ...
    @property
    def trace_id(self) -> str | None: ...
    @property
    def span_id(self) -> str | None: ...

    def propagate(self, headers: RawHeaders) -> RawHeaders: ...
    def traceparent(self) -> bytes | None: ...
    def attempt(self, backend: str, pool: str | None = None, url: str | None = None
                ) -> AttemptSpan: ...
    def first_token(self) -> None: ...
    def end(self, ctx: ContextView, usage: UsageView | None = None, *,
            payload: Mapping[str, Any] | None = None, tenant: str | None = None,
            quota: str | None = None, queue_wait_ms: float | None = None,
            finish_reasons: Sequence[str] | None = None, response_model: str | None = None,
            record_content: bool = False, completion: str | None = None) -> None: ...


class _NoopAttempt:
    __slots__ = ()

    def __enter__(self) -> _NoopAttempt:
        return self

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        return None

    def response(self, status: int) -> None:
        return None

    def traceparent(self) -> bytes | None:
        return None


class _NoopSpan:
    """An unsampled request: every method returns at once; headers pass through unchanged."""

    __slots__ = ()
    sampled: bool = False
    trace_id: str | None = None
    span_id: str | None = None

    def propagate(self, headers: RawHeaders) -> RawHeaders:
        return headers

    def traceparent(self) -> bytes | None:
        return None

    def attempt(self, backend: str, pool: str | None = None, url: str | None = None
                ) -> _NoopAttempt:
        return NOOP_ATTEMPT

    def first_token(self) -> None:
        return None

    def end(self, ctx: object, usage: object = None, **facts: object) -> None:
        return None

    def __repr__(self) -> str:
        return "<NoopSpan>"


NOOP_ATTEMPT = _NoopAttempt()
NOOP_SPAN = _NoopSpan()
