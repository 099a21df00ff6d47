"""The lean OTLP encoder writes the message the SDK's encoder builds, for any valid span."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from gateway.telemetry.otlp import OTLPExporter, encode_spans
from gateway.telemetry.tracing import RequestTracing, TracingSettings
from tests.telemetry.fakes import FakeUsage, finished


def _decode(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


def _same_as_sdk(spans: list[Any]) -> None:
    ours = _decode(encode_spans(spans))
    theirs = sdk_encode(spans)
    assert ours == theirs, f"ours:\n{ours}\nSDK:\n{theirs}"
    assert len(ours.resource_spans[0].scope_spans[0].spans) >= 1


def test_gateway_spans_encode_like_the_sdk() -> None:
    exporter = InMemorySpanExporter()
    tracing = RequestTracing(TracingSettings(enabled=True, ratio=1.0),
                             processor=SimpleSpanProcessor(exporter))
    headers = [(b"host", b"gw.example:8443"),
               (b"traceparent", b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"),
               (b"tracestate", b"vendor=a1,other=b2")]
    for i in range(3):
        ctx = finished(stream=True, status=200 if i else 502)
        span = tracing.start(headers, ctx)
        with span.attempt("b1", "pool-a", "http://10.0.0.7:8000/v1/chat/completions") as a:
            a.response(200 if i else 503)
        span.first_token()
        span.end(ctx, FakeUsage(), payload={"max_tokens": 64, "temperature": 0.25, "top_p": 1},
                 tenant="acme", finish_reasons=["stop"], queue_wait_ms=1.5)
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 6
    assert any(s.parent is not None and s.parent.is_remote for s in spans)
    _same_as_sdk(spans)


def test_sdk_made_spans_with_every_field_encode_like_the_sdk() -> None:
    """Spans from the SDK's own tracer: events, links, remote parents, statuses, scopes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "x", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lib-a", "1.2.3", schema_url="https://example.com/s")
    other = provider.get_tracer("lib-b")
    remote = SpanContext(2**127 + 5, 2**63 + 7, is_remote=True,
                         trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    from opentelemetry import trace

    with tracer.start_as_current_span("root", kind=SpanKind.SERVER,
                                      context=trace.set_span_in_context(
                                          trace.NonRecordingSpan(remote)),
                                      links=[Link(remote, {"why": "batch", "n": -4})]) as root:
        root.set_attributes({"s": "é ünïcode", "b": False, "i": -(2**40), "big": 2**62,
                             "f": -0.5, "strs": ("a", "b"), "ints": (1, -2, 3),
                             "floats": (0.5, 2.0), "bools": (True, False), "empty": ""})
        root.add_event("evt", {"k": 1, "flag": True}, timestamp=123)
        root.add_event("plain")
        with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("ok", kind=SpanKind.PRODUCER) as ok:
            ok.set_status(Status(StatusCode.OK))
    _same_as_sdk(list(exporter.get_finished_spans()))


_values = st.one_of(
    st.text(max_size=40), st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.lists(st.text(max_size=8), max_size=4).map(tuple),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(attributes=st.dictionaries(st.text(min_size=1, max_size=20), _values, max_size=12),
       name=st.text(max_size=30), start=st.integers(min_value=1, max_value=2**63),
       kind=st.sampled_from(list(SpanKind)))
def test_any_attributes_encode_like_the_sdk(attributes: dict[str, Any], name: str, start: int,
                                            kind: SpanKind) -> None:
    context = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1))
    span = ReadableSpan(name=name, context=context, parent=None,
                        resource=Resource.create({"service.name": "h"}), attributes=attributes,
                        events=(Event("e", attributes, timestamp=start),), kind=kind,
                        start_time=start, end_time=start + 1,
                        instrumentation_scope=InstrumentationScope("hyp"))
    _same_as_sdk([span])


def test_exporter_uses_the_fast_path_on_the_installed_sdk() -> None:
    """Fails when an SDK upgrade moves the HTTP client the fast path sends through."""
    assert OTLPExporter.fast_path_available()
    exporter = OTLPExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert hasattr(exporter, "_client") and hasattr(exporter._client, "export")
    exporter.shutdown()
