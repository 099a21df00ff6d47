"""Prometheus exposition of one engine under vLLM's metric names.

A custom collector on a per-engine :class:`CollectorRegistry` (never the global one, so several
simulators in one test process do not collide) reads the engine's live state and
:class:`~gateway.sim.stats.EngineStats` at scrape time; nothing is recorded through
prometheus_client on the hot path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gateway.sim.engine import Engine
    from gateway.sim.stats import Histogram

__all__ = ["CONTENT_TYPE", "EngineCollector", "make_registry", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _le(bound: float) -> str:
    """Prometheus' spelling of a bucket bound (``0.005``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class EngineCollector(Collector):
    """Renders gauges, counters and histograms of one engine, labelled ``model_name``."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._model = model_name

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self._model], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self._model], value)
        return c

    def _histogram(self, name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=["model_name"])
        buckets = [(_le(le), float(n)) for le, n in hist.cumulative()]
        h.add_metric([self._model], buckets, hist.sum)
        return h

    def collect(self) -> Iterable[Metric]:
        eng, s = self._engine, self._engine.stats
        usage = eng.kv_usage
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the running batch.", eng.num_running
        )
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting.", eng.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100%.", usage)
        yield self._gauge(
            "vllm:gpu_cache_usage_perc", "Deprecated alias of vllm:kv_cache_usage_perc.", usage
        )
        # CounterMetricFamily appends _total itself.
        yield self._counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens_total
        )
        yield self._counter(
            "vllm:generation_tokens", "Generation tokens processed.", s.generation_tokens_total
        )
        yield self._counter("vllm:request_success", "Requests finished.", s.completed)
        cache = eng.prefix_cache
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            cache.queries if cache is not None else 0,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            cache.hits if cache is not None else 0,
        )
        yield self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token, seconds.", s.ttft
        )
        yield self._histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency, seconds.", s.itl
        )
        yield self._histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency, seconds.", s.e2e
        )
        yield self._histogram(
            "vllm:request_queue_time_seconds", "Time spent waiting, seconds.", s.queue_time
        )


def make_registry(engine: Engine, model_name: str) -> CollectorRegistry:
    """A fresh registry holding only this engine's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format of ``registry``."""
    return generate_latest(registry)
