"""Request spans: sampling, GenAI attributes, attempts, first token, propagation, content."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry.spans import NOOP_ATTEMPT, NOOP_SPAN
from gateway.telemetry.tracing import DEFAULT_RATIO, RequestTracing, TracingSettings
from tests.telemetry.fakes import FakeContext, FakeUsage, finished

PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PARENT_UNSAMPLED = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracing(exporter: InMemorySpanExporter, **kw: object) -> RequestTracing:
    settings = TracingSettings(enabled=True, **{"ratio": 1.0, **kw})  # type: ignore[arg-type]
    return RequestTracing(settings, processor=SimpleSpanProcessor(exporter))


def by_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


def now_ctx(**kw: object) -> FakeContext:
    ctx = finished(**kw)
    shift = time.perf_counter_ns() - ctx.started_ns
    ctx.started_ns += shift
    for name in ("first_token_ns", "last_chunk_ns", "finished_ns"):
        setattr(ctx, name, getattr(ctx, name) + shift)
    return ctx


def test_off_by_default_returns_the_shared_noop() -> None:
    """With no OTEL_* variables tracing is off: every request gets the same no-op object."""
    tr = RequestTracing.from_env({})
    assert repr(tr) == "<RequestTracing off>"
    span = tr.start([(b"traceparent", PARENT)], FakeContext())
    assert span is NOOP_SPAN
    assert span.attempt("b1") is NOOP_ATTEMPT
    headers = [(b"traceparent", PARENT)]
    assert span.propagate(headers) is headers
    assert span.traceparent() is None and span.trace_id is None
    with span.attempt("b1", "p", "http://x") as attempt:
        attempt.response(500)
    span.first_token()
    span.end(FakeContext(), FakeUsage(), tenant="t")


@pytest.mark.process
def test_off_does_not_import_the_sdk() -> None:
    """A gateway with tracing off never loads the OpenTelemetry SDK (a fresh interpreter)."""
    import subprocess

    code = ("import sys; from gateway.telemetry import RequestTracing; "
            "RequestTracing.from_env({}); "
            "print(any(m.startswith('opentelemetry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("env", "enabled", "ratio", "parent_based", "endpoint"),
    [
        pytest.param({}, False, DEFAULT_RATIO, True, "http://localhost:4318/v1/traces", id="unset"),
        pytest.param({"OTEL_TRACES_EXPORTER": "none"}, False, DEFAULT_RATIO, True,
                     "http://localhost:4318/v1/traces", id="none"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
                     True, DEFAULT_RATIO, True, "http://c:4318/v1/traces", id="base-endpoint"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp",
                      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"},
                     True, DEFAULT_RATIO, True, "http://t:1/x", id="traces-endpoint-wins"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio",
                      "OTEL_TRACES_SAMPLER_ARG": "0.25"},
                     True, 0.25, False, "http://localhost:4318/v1/traces", id="ratio"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"},
                     True, 1.0, False, "http://localhost:4318/v1/traces", id="always-on"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_off"},
                     False, 0.0, False, "http://localhost:4318/v1/traces", id="always-off"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "junk"},
                     True, DEFAULT_RATIO, True, "http://localhost:4318/v1/traces", id="bad-arg"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
                     False, DEFAULT_RATIO, True, "http://localhost:4318/v1/traces", id="sdk-off"),
    ],
)
def test_settings_from_env(env: dict[str, str], enabled: bool, ratio: float,
                           parent_based: bool, endpoint: str) -> None:
    """The standard OTEL_* variables map onto settings; tracing stays off unless asked for."""
    s = TracingSettings.from_env(env)
    assert (s.enabled, s.ratio, s.parent_based, s.endpoint) == (
        enabled, ratio, parent_based, endpoint)


def test_server_span_has_genai_and_gateway_attributes(exporter: InMemorySpanExporter) -> None:
    """One SERVER span per request with gen_ai.* and gateway.* attributes and a first-token
    event at the context's first-token time."""
    tr = tracing(exporter)
    ctx = now_ctx()
    span = tr.start([(b"host", b"gw.example:8443")], ctx)
    span.end(ctx, FakeUsage(), payload={"model": "chat-model", "max_tokens": 64,
                                        "temperature": 0.2, "top_p": 0.9,
                                        "messages": [{"role": "user", "content": "hi"}]},
             tenant="acme", quota="allowed", queue_wait_ms=1.5, finish_reasons=["stop"])
    (server,) = by_kind(exporter, SpanKind.SERVER)
    a = dict(server.attributes or {})
    assert server.name == "chat chat-model"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "chat-model"
    assert a["gen_ai.response.model"] == "chat-model-v2"
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (35, 31)
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"]) == (64, 0.2, 0.9)
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert (a["server.address"], a["server.port"]) == ("gw.example", 8443)
    assert a["http.response.status_code"] == 200
    assert (a["gateway.tenant"], a["gateway.key_id"], a["gateway.class"], a["gateway.pool"],
            a["gateway.backend"]) == ("acme", "key-1", "interactive", "gpu-a", "b1")
    assert (a["gateway.tokens.history"], a["gateway.tokens.new"], a["gateway.tokens.system"],
            a["gateway.tokens.cached"]) == (20, 5, 10, 8)
    assert (a["gateway.attempts"], a["gateway.quota.decision"], a["gateway.queue_wait_ms"]) == (
        1, "allowed", 1.5)
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    (event,) = server.events
    assert event.name == "gen_ai.first_token"
    assert server.start_time is not None and server.end_time is not None
    assert event.timestamp - server.start_time == pytest.approx(200e6, abs=1e6)
    assert server.end_time - server.start_time == pytest.approx(ctx.finished_ns - ctx.started_ns,
                                                                abs=1e6)
    assert server.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize(("endpoint", "op"), [
    pytest.param("/v1/completions", "text_completion", id="completions"),
    pytest.param("/v1/embeddings", "embeddings", id="embeddings"),
])
def test_operation_follows_endpoint(exporter: InMemorySpanExporter, endpoint: str, op: str) -> None:
    tr = tracing(exporter)
    ctx = now_ctx(endpoint=endpoint)
    tr.start([], ctx).end(ctx)
    (server,) = exporter.get_finished_spans()
    assert (server.attributes or {})["gen_ai.operation.name"] == op


def test_content_recorded_only_when_policy_allows(exporter: InMemorySpanExporter) -> None:
    """Prompt and completion text appear only with record_content=True."""
    tr = tracing(exporter)
    payload = {"messages": [{"role": "user", "content": "secret plan"}]}
    for allowed in (False, True):
        ctx = now_ctx()
        tr.start([], ctx).end(ctx, payload=payload, completion="the answer",
                              record_content=allowed)
    off, on = (dict(s.attributes or {}) for s in exporter.get_finished_spans())
    assert not any("secret plan" in str(v) or "the answer" in str(v) for v in off.values())
    assert "secret plan" in on["gen_ai.input.messages"]
    assert on["gen_ai.output.messages"] == "the answer"


def test_attempts_are_client_children_with_outcomes(exporter: InMemorySpanExporter) -> None:
    """Each upstream attempt is a CLIENT child span: error (with type), then ok."""

    class BackendFailure(Exception):
        pass

    class Failed(Exception):  # the retry loop's wrapper carries the client-facing error
        def __init__(self, error: Exception) -> None:
            self.error = error

    tr = tracing(exporter)
    ctx = now_ctx(attempts=0)
    span = tr.start([], ctx)
    ctx.attempts = 1
    with pytest.raises(Failed), span.attempt("b1", "gpu-a", "http://10.0.0.1:8000/v1/x") as a:
        a.response(503)
        raise Failed(BackendFailure("503"))
    ctx.attempts = 2
    with span.attempt("b2", "gpu-a", "http://[::1]:9000/v1/x") as a:
        a.response(200)
    ctx.attempts = 3
    with pytest.raises(asyncio.CancelledError), span.attempt("b3", "gpu-a"):
        raise asyncio.CancelledError
    span.end(ctx)
    first, second, third = by_kind(exporter, SpanKind.CLIENT)
    (server,) = by_kind(exporter, SpanKind.SERVER)
    for child in (first, second, third):
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert child.context.trace_id == server.context.trace_id
        assert child.name == "chat chat-model-v2"
    a1, a2, a3 = (dict(s.attributes or {}) for s in (first, second, third))
    assert (a1["gateway.attempt.outcome"], a1["error.type"], a1["http.response.status_code"],
            a1["server.address"], a1["server.port"], a1["gateway.attempt"]) == (
        "error", "BackendFailure", 503, "10.0.0.1", 8000, 1)
    assert first.status.status_code == StatusCode.ERROR
    assert (a2["gateway.attempt.outcome"], a2["server.address"], a2["server.port"]) == (
        "ok", "::1", 9000)
    assert a3["gateway.attempt.outcome"] == "cancelled"


def test_client_traceparent_is_parent_and_propagated(exporter: InMemorySpanExporter) -> None:
    """The client's trace continues: our span is its child; upstream gets our span id."""
    tr = tracing(exporter, ratio=0.0)  # root requests never sampled; the sampled parent wins
    ctx = now_ctx()
    span = tr.start([(b"traceparent", PARENT), (b"tracestate", b"vendor=abc")], ctx)
    assert span.sampled
    upstream = span.propagate([(b"traceparent", PARENT), (b"tracestate", b"vendor=abc"),
                               (b"x-other", b"1")])
    span.end(ctx)
    (server,) = exporter.get_finished_spans()
    assert server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331
    assert server.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    expected = b"00-0af7651916cd43dd8448eb211c80319c-%016x-01" % server.context.span_id
    assert span.traceparent() == expected
    assert upstream == [(b"x-other", b"1"), (b"traceparent", expected),
                        (b"tracestate", b"vendor=abc")]
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"


def test_unsampled_parent_and_ratio_zero_make_nothing(exporter: InMemorySpanExporter) -> None:
    """An unsampled client parent, or a root request losing the draw, gets the no-op span."""
    tr = tracing(exporter, ratio=0.0)
    assert tr.start([(b"traceparent", PARENT_UNSAMPLED)], now_ctx()) is NOOP_SPAN
    assert tr.start([], now_ctx()) is NOOP_SPAN
    assert tr.start([(b"traceparent", b"garbage")], now_ctx()) is NOOP_SPAN
    assert exporter.get_finished_spans() == ()


def test_ratio_samples_about_that_share(exporter: InMemorySpanExporter) -> None:
    tr = tracing(exporter, ratio=0.2)
    sampled = sum(tr.start([], FakeContext()) is not NOOP_SPAN for _ in range(5000))
    assert 800 < sampled < 1200


def test_failed_request_marks_error(exporter: InMemorySpanExporter) -> None:
    tr = tracing(exporter)
    ctx = now_ctx(status=502, outcome="failed", error="backend 'b1' answered 502: sk-secret123456")
    tr.start([], ctx).end(ctx)
    (server,) = exporter.get_finished_spans()
    a = dict(server.attributes or {})
    assert server.status.status_code == StatusCode.ERROR
    assert a["error.type"] == "502"
    assert not any("sk-secret" in str(v) for v in a.values())  # error text is never recorded


def test_explicit_first_token_recorded_once(exporter: InMemorySpanExporter) -> None:
    tr = tracing(exporter)
    ctx = now_ctx()
    span = tr.start([], ctx)
    span.first_token()
    span.first_token()
    span.end(ctx)
    (server,) = exporter.get_finished_spans()
    assert [e.name for e in server.events] == ["gen_ai.first_token"]


def test_reads_tenant_usage_quota_from_the_context(exporter: InMemorySpanExporter) -> None:
    tr = tracing(exporter)
    ctx = now_ctx()
    ctx.tenant, ctx.usage, ctx.quota = "acme", FakeUsage(), "admitted"  # type: ignore[attr-defined]
    tr.start([], ctx).end(ctx)
    (server,) = exporter.get_finished_spans()
    a = dict(server.attributes or {})
    assert (a["gateway.tenant"], a["gen_ai.usage.output_tokens"], a["gateway.quota.decision"]) == (
        "acme", 31, "admitted")
