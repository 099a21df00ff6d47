"""Telemetry cost per request: span start/attempt/end + metrics observe + access line.

``python -m loadtest.bench.telemetry_bench`` runs the per-request telemetry calls the proxy
makes, in a tight loop over pre-built finished request contexts, under several set-ups, and
prints µs per request two ways:

* ``thread``: CPU time of the calling thread (what the event loop pays per request);
* ``process``: process CPU time, including the background threads (span export with protobuf
  encoding, the log writer): what a worker's core pays in total;
* ``wall``: elapsed time (noisy on a shared machine; CPU time is the figure to quote).

Spans are exported through the real ``BatchSpanProcessor`` to an exporter that encodes them to
OTLP protobuf and drops the bytes (no network); access lines go to ``/dev/null`` through the
real buffered writer. Context construction is outside the timed loop.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.accounting.prices import CostBreakdown
from gateway.accounting.tokens import TokenUsage
from gateway.context import RequestContext
from gateway.telemetry import LogSettings, Metrics, RequestTracing, TracingSettings
from gateway.telemetry.logging import setup_logging
from gateway.telemetry.tracing import DEFAULT_RATIO

__all__ = ["Scenario", "main", "run"]

HEADERS = [
    (b"host", b"gateway.example:8080"),
    (b"user-agent", b"OpenAI/Python 1.40.0"),
    (b"accept", b"application/json"),
    (b"content-type", b"application/json"),
    (b"authorization", b"Bearer sk-test-0123456789abcdef"),
    (b"x-stainless-lang", b"python"),
    (b"x-stainless-os", b"Linux"),
    (b"x-stainless-runtime", b"CPython"),
    (b"content-length", b"512"),
    (b"connection", b"keep-alive"),
]
UPSTREAM = [(b"content-type", b"application/json"), (b"x-request-id", b"r")]
PAYLOAD = {"model": "chat-model", "max_tokens": 256, "temperature": 0.7, "stream": True}
USAGE = TokenUsage(system=120, history=800, new=40, cached=600, output=180, prompt_total=960,
                   cost=CostBreakdown(total=4200))


@dataclass(frozen=True)
class Scenario:
    name: str
    tracing: bool = False
    ratio: float = DEFAULT_RATIO
    metrics: bool = False
    access: bool = False


SCENARIOS = (
    Scenario("all off"),
    Scenario("metrics only", metrics=True),
    Scenario("access log only", access=True),
    Scenario("tracing only, default ratio", tracing=True),
    Scenario("all on, default ratio", tracing=True, metrics=True, access=True),
    Scenario("all on, 100% sampled", tracing=True, ratio=1.0, metrics=True, access=True),
)


_EXPORTED = [0]


class _EncodingExporter:
    """Encodes each batch to OTLP protobuf (the real exporter's CPU work), sends nothing."""

    def __init__(self) -> None:
        from gateway.telemetry.otlp import encode_spans

        self._encode = encode_spans  # the gateway's encoder, as OTLPExporter uses it
        self.bytes = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.bytes += len(self._encode(spans))
        _EXPORTED[0] += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _contexts(n: int) -> list[RequestContext]:
    out = []
    for i in range(n):
        ctx = RequestContext(f"req-{i}", "/v1/chat/completions")
        ctx.key_id, ctx.request_model, ctx.upstream_model = "key-1", "chat-model", "chat-model"
        ctx.stream, ctx.request_class, ctx.pool, ctx.backend = True, "interactive", "gpu-a", "b1"
        ctx.attempts, ctx.status, ctx.outcome = 1, 200, "completed"
        ctx.first_token_ns = ctx.started_ns + 150_000_000
        ctx.last_chunk_ns = ctx.first_token_ns + 179 * 20_000_000
        ctx.finished_ns = ctx.last_chunk_ns + 1_000_000
        out.append(ctx)
    return out


def _request_loop(s: Scenario, devnull: Any) -> tuple[Callable[[list[RequestContext]], None],
                                                       Callable[[], None]]:
    processor = None
    if s.tracing:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        processor = BatchSpanProcessor(_EncodingExporter())  # type: ignore[arg-type]
    tracing = RequestTracing(TracingSettings(enabled=s.tracing, ratio=s.ratio),
                             processor=processor)
    metrics = Metrics(enabled=s.metrics)
    access = setup_logging(LogSettings(access=s.access), stream=devnull)
    url = "http://10.0.0.7:8000/v1/chat/completions"

    def loop(contexts: list[RequestContext]) -> None:
        start, observe = tracing.start, metrics.observe_request
        for ctx in contexts:
            span = start(HEADERS, ctx)
            span.propagate(UPSTREAM)
            with span.attempt("b1", "gpu-a", url) as attempt:
                attempt.response(200)
            span.first_token()
            span.end(ctx, USAGE, payload=PAYLOAD, tenant="acme")
            observe(ctx, USAGE, tenant="acme")
            access(ctx, USAGE, tenant="acme", span=span)

    def close() -> None:
        tracing.shutdown()
        access.close()

    return loop, close


def run(scenario: Scenario, requests: int, repeats: int) -> tuple[float, float, float]:
    """Median (thread, process, wall) µs per request over ``repeats`` runs."""
    threads, cpus, walls = [], [], []
    with open(os.devnull, "wb") as devnull:
        loop, close = _request_loop(scenario, devnull)
        loop(_contexts(2000))  # warm up: bind label children, first logger use
        for _ in range(repeats):
            contexts = _contexts(requests)
            gc.collect()
            wall0, cpu0 = time.perf_counter_ns(), time.process_time_ns()
            thread0 = time.thread_time_ns()
            loop(contexts)
            thread1, cpu1 = time.thread_time_ns(), time.process_time_ns()
            walls.append((time.perf_counter_ns() - wall0) / requests / 1e3)
            cpus.append((cpu1 - cpu0) / requests / 1e3)
            threads.append((thread1 - thread0) / requests / 1e3)
        close()
    return statistics.median(threads), statistics.median(cpus), statistics.median(walls)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.telemetry_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{'µs per request':30} {'thread':>8} {'process':>8} {'wall':>8}  spans exported")
    for scenario in SCENARIOS:
        _EXPORTED[0] = 0
        thread, cpu, wall = run(scenario, args.requests, args.repeats)
        print(f"{scenario.name:30} {thread:8.2f} {cpu:8.2f} {wall:8.2f}  {_EXPORTED[0]}")
    print(f"default ratio = {DEFAULT_RATIO}; process CPU includes the export and log threads")


if __name__ == "__main__":
    main()
