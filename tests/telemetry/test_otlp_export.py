"""Spans reach a real OTLP/HTTP endpoint as protobuf, with the expected attributes."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gateway.telemetry.tracing import RequestTracing
from tests.telemetry.fakes import FakeUsage, finished


class Collector(ThreadingHTTPServer):
    """A minimal OTLP/HTTP trace receiver: decodes each request and keeps it."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.server.requests.append(message)
        self.server.paths.append(self.path)
        self.server.content_types.append(self.headers.get("Content-Type", ""))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind)


def test_spans_exported_over_otlp_http(collector: Collector) -> None:
    """from_env with OTEL_TRACES_EXPORTER=otlp sends batched spans to <endpoint>/v1/traces."""
    port = collector.server_address[1]
    tracing = RequestTracing.from_env({
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SERVICE_NAME": "gateway-under-test",
    })
    ctx = finished()
    shift = time.perf_counter_ns() - ctx.started_ns
    ctx.started_ns += shift
    ctx.first_token_ns += shift  # type: ignore[operator]
    ctx.last_chunk_ns += shift  # type: ignore[operator]
    ctx.finished_ns += shift  # type: ignore[operator]
    span = tracing.start([(b"host", b"gw:8080")], ctx)
    with span.attempt("b1", "gpu-a", "http://10.1.2.3:8000/v1/chat/completions") as attempt:
        attempt.response(200)
    span.end(ctx, FakeUsage(), tenant="acme", payload={"max_tokens": 16})
    try:
        assert tracing.force_flush(10_000)
    finally:
        tracing.shutdown()
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert set(collector.content_types) == {"application/x-protobuf"}
    spans = {}
    service = None
    for request in collector.requests:
        for rs in request.resource_spans:
            service = {a.key: _value(a.value) for a in rs.resource.attributes}["service.name"]
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans[s.kind] = s
    assert service == "gateway-under-test"
    server, client = spans[2], spans[3]  # SPAN_KIND_SERVER, SPAN_KIND_CLIENT
    attrs = {a.key: _value(a.value) for a in server.attributes}
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "chat-model"
    assert attrs["gen_ai.usage.input_tokens"] == 35
    assert attrs["gen_ai.usage.output_tokens"] == 31
    assert attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gateway.tenant"] == "acme"
    assert attrs["http.response.status_code"] == 200
    assert [e.name for e in server.events] == ["gen_ai.first_token"]
    assert client.parent_span_id == server.span_id and client.trace_id == server.trace_id
    client_attrs = {a.key: _value(a.value) for a in client.attributes}
    assert client_attrs["server.address"] == "10.1.2.3"
    assert client_attrs["gateway.attempt.outcome"] == "ok"
