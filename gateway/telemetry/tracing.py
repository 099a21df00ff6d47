"""Request tracing: settings from the standard ``OTEL_*`` variables, sampling, span start.

Off by default (``OTEL_TRACES_EXPORTER`` unset or ``none``): :meth:`RequestTracing.start` then
returns the shared :data:`~gateway.telemetry.spans.NOOP_SPAN` and the OpenTelemetry SDK is never
imported. On (``OTEL_TRACES_EXPORTER=otlp``), spans go to an OTLP http/protobuf endpoint through
a ``BatchSpanProcessor`` (a background thread; the request path only queues the span) and
:class:`~gateway.telemetry.otlp.OTLPExporter` (the SDK's exporter with a lean encoder). Spans are
recorded by :mod:`gateway.telemetry.recording` without the SDK's live ``Span`` (see there why).

The sampling decision is made once, in :meth:`RequestTracing.start`, before any SDK call, so an
unsampled request costs one header scan and one random draw:

* ``parentbased_*`` samplers follow the client's ``traceparent`` sampled flag when it sent one;
* otherwise a ratio: ``always_on`` = 1, ``always_off`` = 0, ``*traceidratio`` =
  ``OTEL_TRACES_SAMPLER_ARG``.

With no ``OTEL_TRACES_SAMPLER``, the gateway uses ``parentbased_traceidratio`` at
:data:`DEFAULT_RATIO` (the OpenTelemetry default, ``parentbased_always_on``, costs ~40 µs per
request at the gateway's request rates). An unsampled request gets no trace id of its own: the
client's ``traceparent``, if any, passes through to the backend unchanged.

Build one :class:`RequestTracing` per worker process (in the app factory or lifespan, after any
fork) and call :meth:`RequestTracing.shutdown` on the way out to flush queued spans.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.telemetry.propagation import find_trace_headers, parse_traceparent
from gateway.telemetry.spans import NOOP_SPAN

if TYPE_CHECKING:
    from collections.abc import Mapping

    from opentelemetry.sdk.trace import SpanProcessor

    from gateway.telemetry.recording import SpanSink
    from gateway.telemetry.spans import RequestSpan
    from gateway.telemetry.types import ContextView
    from gateway.types import RawHeaders

__all__ = ["DEFAULT_RATIO", "OPERATIONS", "RequestTracing", "TracingSettings"]

#: ratio of root requests sampled when ``OTEL_TRACES_SAMPLER`` is not set
DEFAULT_RATIO = 0.01
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"

#: ``gen_ai.operation.name`` by endpoint path
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
}

_log = logging.getLogger("gateway.telemetry")

_SAMPLERS = {  # name -> (parent based, fixed ratio or None to read the argument)
    "always_on": (False, 1.0),
    "always_off": (False, 0.0),
    "traceidratio": (False, None),
    "parentbased_always_on": (True, 1.0),
    "parentbased_always_off": (True, 0.0),
    "parentbased_traceidratio": (True, None),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingSettings:
    """How requests are traced; :meth:`from_env` reads the standard variables."""

    enabled: bool = False
    endpoint: str = DEFAULT_ENDPOINT
    #: share of root requests (no client ``traceparent``) that are sampled, 0..1
    ratio: float = DEFAULT_RATIO
    #: follow the client's sampled flag when it sends a ``traceparent``
    parent_based: bool = True
    service_name: str = "llm-gateway"
    #: ``gen_ai.provider.name`` (and the older ``gen_ai.system``): the wire API spoken upstream
    provider: str = "openai"
    #: also print spans to stdout (``OTEL_TRACES_EXPORTER=otlp,console``), for debugging
    console: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingSettings:
        env = os.environ if env is None else env
        exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
        exporters.discard("")
        unknown = exporters - {"otlp", "console", "none"}
        if unknown:
            _log.warning("OTEL_TRACES_EXPORTER: ignoring unsupported %s", sorted(unknown))
        disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                           env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
        if protocol.strip() != "http/protobuf":
            _log.warning("OTLP protocol %r is not supported; using http/protobuf", protocol)
        parent_based, ratio = _sampler(env)
        return cls(
            enabled=not disabled and bool(exporters & {"otlp", "console"}) and (
                ratio > 0 or parent_based),
            endpoint=_endpoint(env),
            ratio=ratio,
            parent_based=parent_based,
            service_name=env.get("OTEL_SERVICE_NAME") or "llm-gateway",
            provider=env.get("GATEWAY_GENAI_PROVIDER") or "openai",
            console="console" in exporters and "otlp" not in exporters,
        )


def _endpoint(env: Mapping[str, str]) -> str:
    """The signal-specific endpoint is used as is; the base one gets ``/v1/traces``."""
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else DEFAULT_ENDPOINT


def _sampler(env: Mapping[str, str]) -> tuple[bool, float]:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_traceidratio"
    if name not in _SAMPLERS:
        _log.warning("OTEL_TRACES_SAMPLER %r is not supported; using the default", name)
        name = "parentbased_traceidratio"
    parent_based, fixed = _SAMPLERS[name]
    if fixed is not None:
        return parent_based, fixed
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(arg) if arg else DEFAULT_RATIO
    except ValueError:
        _log.warning("OTEL_TRACES_SAMPLER_ARG %r is not a number; using %s", arg, DEFAULT_RATIO)
        ratio = DEFAULT_RATIO
    return parent_based, min(1.0, max(0.0, ratio))


class RequestTracing:
    """Starts one span per request; shared by all requests of a worker.

    ``processor`` replaces the OTLP batch exporter (tests pass a ``SimpleSpanProcessor`` over an
    ``InMemorySpanExporter``). No global OpenTelemetry state is touched.
    """

    def __init__(self, settings: TracingSettings, *, processor: SpanProcessor | None = None
                 ) -> None:
        self.settings = settings
        self._ratio = settings.ratio
        self._parent_based = settings.parent_based
        self._sink: SpanSink | None = None
        if settings.enabled:
            from gateway.telemetry.recording import start_request_span

            self._sink = _make_sink(settings, processor)
            self._start_span = start_request_span
        else:
            self.start = self._start_off  # type: ignore[method-assign]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RequestTracing:
        return cls(TracingSettings.from_env(env))

    def __repr__(self) -> str:
        s = self.settings
        if not s.enabled:
            return "<RequestTracing off>"
        return (f"<RequestTracing on ratio={s.ratio} parent_based={s.parent_based} "
                f"endpoint={s.endpoint}>")

    def start(self, headers: RawHeaders, ctx: ContextView, operation: str | None = None
              ) -> RequestSpan:
        """The request's span: :data:`NOOP_SPAN` unless sampled. Call first thing per request.

        ``headers`` are the ASGI request headers (for ``traceparent``, ``tracestate``, ``host``);
        ``operation`` defaults to the endpoint's ``gen_ai.operation.name``.
        """
        raw_parent, raw_state = find_trace_headers(headers)
        parent = parse_traceparent(raw_parent)
        if parent is not None and self._parent_based:
            if not parent.sampled:
                return NOOP_SPAN
        elif self._ratio < 1.0 and random.random() >= self._ratio:
            return NOOP_SPAN
        assert self._sink is not None  # ``start`` is ``_start_off`` unless enabled
        return self._start_span(
            self._sink, ctx, operation or OPERATIONS.get(ctx.endpoint, ctx.endpoint),
            self.settings.provider, parent, raw_state, headers,
            time.time_ns() - (time.perf_counter_ns() - ctx.started_ns),
        )

    def _start_off(self, headers: RawHeaders, ctx: ContextView, operation: str | None = None
                   ) -> RequestSpan:
        return NOOP_SPAN

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Export queued spans now (tests, and before a worker exits)."""
        return self._sink.processor.force_flush(timeout_ms) if self._sink is not None else True

    def shutdown(self) -> None:
        """Flush and stop the exporter thread; call from the lifespan's shutdown."""
        if self._sink is not None:
            self._sink.processor.shutdown()


def _make_sink(settings: TracingSettings, processor: SpanProcessor | None) -> SpanSink:
    """The processor (OTLP batch export unless given), resource and scope of every span."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from gateway.telemetry.recording import SpanSink

    if processor is None:
        if settings.console:
            processor = SimpleSpanProcessor(ConsoleSpanExporter())
        else:
            from gateway.telemetry.otlp import OTLPExporter

            processor = BatchSpanProcessor(OTLPExporter(endpoint=settings.endpoint))
    return SpanSink(processor, Resource.create({SERVICE_NAME: settings.service_name}),
                    InstrumentationScope("gateway"))
