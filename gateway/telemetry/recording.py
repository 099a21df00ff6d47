"""The spans of a sampled request: SERVER span and CLIENT attempts, recorded lean.

Created per request and not thread-safe. A span gathers its attributes in a plain dict and
becomes an OpenTelemetry SDK ``ReadableSpan`` once, when it ends, which goes straight to the
span processor (the SDK's ``BatchSpanProcessor`` in production, an in-memory exporter in tests).
The SDK's live ``Span`` is not used: its locking, per-attribute validation and copying cost
~600,000 instructions per sampled request (callgrind), more than the whole proxied request;
the attribute values here are typed by construction (str, int, float, bool, tuple of str) and
never None, so there is nothing to validate. Ids are drawn like the SDK's
``RandomIdGenerator`` (``random.getrandbits``).

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``), with the
gateway's own facts under ``gateway.*``. Prompt and completion text are recorded only when the
caller says the tenant's policy allows it (``record_content=True`` on :meth:`RecordingSpan.end`).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING, Any

import msgspec
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.telemetry.propagation import TRACE_HEADERS, format_traceparent

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import TracebackType

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from gateway.telemetry.propagation import TraceParent
    from gateway.telemetry.types import ContextView, UsageView
    from gateway.types import RawHeaders

__all__ = ["RecordingSpan", "SpanSink", "start_request_span"]

_encode = msgspec.json.Encoder().encode
_FIRST_TOKEN = "gen_ai.first_token"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)


def _random_id(bits: int) -> int:
    while True:  # zero is the invalid id
        value = random.getrandbits(bits)
        if value:
            return value


class SpanSink:
    """Where ended spans go: the processor, with the resource and scope every span carries."""

    __slots__ = ("processor", "resource", "scope")

    def __init__(self, processor: SpanProcessor, resource: Resource,
                 scope: InstrumentationScope) -> None:
        self.processor, self.resource, self.scope = processor, resource, scope

    def finish(self, name: str, context: SpanContext, parent: SpanContext | None,
               kind: SpanKind, attributes: dict[str, Any], events: Sequence[Event],
               status: Status, start: int, end: int) -> None:
        self.processor.on_end(ReadableSpan(
            name=name, context=context, parent=parent, resource=self.resource,
            attributes=attributes, events=events, kind=kind, status=status,
            start_time=start, end_time=end, instrumentation_scope=self.scope,
        ))


def start_request_span(sink: SpanSink, ctx: ContextView, operation: str, provider: str,
                       parent: TraceParent | None, tracestate: bytes | None,
                       headers: RawHeaders, epoch0: int) -> RecordingSpan:
    """Open the SERVER span of a sampled request, child of the client's span if it sent one."""
    remote = None
    state = None
    if parent is not None:
        state = TraceState.from_header([tracestate.decode("latin-1")]) if tracestate else None
        remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True,
                             trace_flags=TraceFlags(parent.flags & 0xFF), trace_state=state)
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation, "url.path": ctx.endpoint}
    for name, value in headers:
        if name == b"host":
            attrs.update(_address(value.decode("latin-1")))
            break
    trace_id = parent.trace_id if parent is not None else _random_id(128)
    context = SpanContext(trace_id, _random_id(64), is_remote=False, trace_flags=_SAMPLED,
                          trace_state=state)
    return RecordingSpan(sink, context, remote, attrs, ctx, operation, provider, epoch0)


class _Attempt:
    """A CLIENT span around one upstream attempt; outcome ``ok`` / ``error`` / ``cancelled``."""

    __slots__ = ("_attrs", "_context", "_name", "_parent", "_sink", "_start", "_status")

    def __init__(self, sink: SpanSink, name: str, parent: SpanContext,
                 attrs: dict[str, Any]) -> None:
        self._sink, self._name, self._parent, self._attrs = sink, name, parent, attrs
        self._context = SpanContext(parent.trace_id, _random_id(64), is_remote=False,
                                    trace_flags=_SAMPLED, trace_state=parent.trace_state)
        self._status = _UNSET
        self._start = time.time_ns()

    def __enter__(self) -> _Attempt:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        attrs = self._attrs
        if et is None:
            attrs["gateway.attempt.outcome"] = "ok"
        elif issubclass(et, asyncio.CancelledError):
            attrs["gateway.attempt.outcome"] = "cancelled"
        else:
            # a retry wrapper carries the client-facing error as ``.error``; name that one
            cause = getattr(ev, "error", ev)
            attrs["gateway.attempt.outcome"] = "error"
            attrs["error.type"] = type(cause).__name__
            self._status = _ERROR
        self._sink.finish(self._name, self._context, self._parent, SpanKind.CLIENT, attrs, (),
                          self._status, self._start, time.time_ns())

    def response(self, status: int) -> None:
        """Record the backend's HTTP status (before judging it)."""
        self._attrs["http.response.status_code"] = status
        if status >= 400:
            self._attrs["error.type"] = str(status)

    def traceparent(self) -> bytes:
        """``traceparent`` naming this attempt's span, for the upstream request."""
        return format_traceparent(self._context.trace_id, self._context.span_id)


class RecordingSpan:
    """A sampled request's SERVER span. Created per request; not thread-safe.

    Times come from the context's ``perf_counter_ns`` stamps, mapped to the wall clock once at
    start, so the span's start, first token and end match the gateway's own measurements.
    """

    __slots__ = ("_attrs", "_context", "_ctx", "_epoch0", "_events", "_op", "_parent", "_perf0",
                 "_provider", "_sink", "span_id", "trace_id")
    sampled: bool = True

    def __init__(self, sink: SpanSink, context: SpanContext, parent: SpanContext | None,
                 attrs: dict[str, Any], ctx: ContextView, operation: str, provider: str,
                 epoch0: int) -> None:
        self._sink, self._context, self._parent, self._attrs = sink, context, parent, attrs
        self._ctx, self._op, self._provider = ctx, operation, provider
        self._perf0, self._epoch0 = ctx.started_ns, epoch0
        self._events: list[Event] = []
        self.trace_id: str | None = f"{context.trace_id:032x}"
        self.span_id: str | None = f"{context.span_id:016x}"

    def __repr__(self) -> str:
        return f"<RecordingSpan trace={self.trace_id} span={self.span_id} op={self._op}>"

    def _wall(self, perf_ns: int) -> int:
        return self._epoch0 + (perf_ns - self._perf0)

    def propagate(self, headers: RawHeaders) -> RawHeaders:
        """Upstream headers with the client's trace headers replaced by this span's."""
        out = [h for h in headers if h[0].lower() not in TRACE_HEADERS]
        out.append((b"traceparent", self.traceparent()))
        state = self._context.trace_state
        if state:
            out.append((b"tracestate", state.to_header().encode("latin-1")))
        return out

    def traceparent(self) -> bytes:
        """``traceparent`` naming this request's span."""
        return format_traceparent(self._context.trace_id, self._context.span_id)

    def attempt(self, backend: str, pool: str | None = None, url: str | None = None) -> _Attempt:
        """Open a CLIENT child span for one upstream attempt; use as a context manager."""
        ctx = self._ctx
        model = ctx.upstream_model or ctx.request_model
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": self._op,
            "gen_ai.provider.name": self._provider,
            "gen_ai.system": self._provider,
            "gateway.backend": backend,
            "gateway.attempt": ctx.attempts,
        }
        if model:
            attrs["gen_ai.request.model"] = model
        if pool:
            attrs["gateway.pool"] = pool
        if url:
            attrs.update(_address(url))
        return _Attempt(self._sink, f"{self._op} {model}" if model else self._op,
                        self._context, attrs)

    def first_token(self) -> None:
        """Mark the first token relayed to the client (once)."""
        if not self._events:
            self._events.append(Event(_FIRST_TOKEN, timestamp=time.time_ns()))

    def end(self, ctx: ContextView, usage: UsageView | None = None, *,
            payload: Mapping[str, Any] | None = None, tenant: str | None = None,
            quota: str | None = None, queue_wait_ms: float | None = None,
            finish_reasons: Sequence[str] | None = None, response_model: str | None = None,
            record_content: bool = False, completion: str | None = None) -> None:
        """Set the request's final attributes and end the span; call once, on every path.

        ``payload`` is the parsed request body (for max_tokens, temperature, top_p); its text
        and ``completion`` are recorded only with ``record_content`` (tenant policy).
        ``usage``, ``tenant`` and ``quota`` default to the context's attributes of those names.
        """
        # the context may carry tenant, quota and usage itself; explicit arguments win
        usage = usage if usage is not None else getattr(ctx, "usage", None)
        tenant = tenant if tenant is not None else getattr(ctx, "tenant", None)
        quota = quota if quota is not None else getattr(ctx, "quota", None)
        if not self._events and ctx.first_token_ns is not None:
            self._events.append(Event(_FIRST_TOKEN, timestamp=self._wall(ctx.first_token_ns)))
        attrs = self._attrs
        attrs.update(_request_attributes(ctx, self._op, self._provider, response_model))
        if usage is not None:
            attrs.update(_usage_attributes(usage))
        if payload is not None:
            attrs.update(_payload_attributes(payload, record_content))
        if record_content and completion is not None:
            attrs["gen_ai.output.messages"] = completion
        if finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = tuple(finish_reasons)
        if tenant is not None:
            attrs["gateway.tenant"] = tenant
        if quota is not None:
            attrs["gateway.quota.decision"] = quota
        if queue_wait_ms is not None:
            attrs["gateway.queue_wait_ms"] = queue_wait_ms
        status = _ERROR if ctx.status >= 500 or ctx.outcome == "failed" else _UNSET
        name = f"{self._op} {ctx.request_model}" if ctx.request_model else self._op
        finished = ctx.finished_ns
        self._sink.finish(name, self._context, self._parent, SpanKind.SERVER, attrs,
                          tuple(self._events), status, self._epoch0,
                          self._wall(finished) if finished is not None else time.time_ns())


def _request_attributes(ctx: ContextView, op: str, provider: str,
                        response_model: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gateway.request_id": ctx.request_id,
        "gateway.attempts": ctx.attempts,
        "gateway.failovers": ctx.failovers,
        "gateway.outcome": ctx.outcome,
        "gateway.stream": ctx.stream,
    }
    if ctx.status:
        attrs["http.response.status_code"] = ctx.status
        if ctx.status >= 500:
            attrs["error.type"] = str(ctx.status)
    for key, value in (
        ("gen_ai.request.model", ctx.request_model),
        ("gen_ai.response.model", response_model or ctx.upstream_model),
        ("gateway.key_id", ctx.key_id),
        ("gateway.client_request_id", ctx.client_request_id),
        ("gateway.class", ctx.request_class),
        ("gateway.pool", ctx.pool),
        ("gateway.backend", ctx.backend),
    ):
        if value is not None:
            attrs[key] = value
    return attrs


def _usage_attributes(usage: UsageView) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.prompt_total,
        "gen_ai.usage.output_tokens": usage.output,
        "gateway.tokens.system": usage.system,
        "gateway.tokens.history": usage.history,
        "gateway.tokens.new": usage.new,
        "gateway.tokens.tools": usage.tools,
        "gateway.tokens.cached": usage.cached,
        "gateway.tokens.estimated": usage.estimated,
    }
    if usage.cost is not None:
        attrs["gateway.cost_micros"] = usage.cost.total
    return attrs


_REQUEST_PARAMS = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
)
_CONTENT_FIELDS = ("messages", "prompt", "input")


def _payload_attributes(payload: Mapping[str, Any], record_content: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for field, name in _REQUEST_PARAMS:
        value = payload.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[name] = value
    if record_content:
        for field in _CONTENT_FIELDS:
            if field in payload:
                attrs["gen_ai.input.messages"] = _encode(payload[field]).decode()
                break
    return attrs


def _address(url: str) -> dict[str, Any]:
    """``server.address`` / ``server.port`` of a backend URL (no urllib: cheap and lenient)."""
    rest = url.split("://", 1)[-1]
    hostport = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port, or a bare IPv6 address
        return {"server.address": hostport.strip("[]")}
    return {"server.address": host.strip("[]"), "server.port": int(port)}
