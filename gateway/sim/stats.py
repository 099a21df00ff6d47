"""Counters and histograms the engine updates on its hot path.

Plain attributes and lists instead of prometheus_client objects: one step emits a token to every
running sequence, and a histogram that can record ``n`` equal observations in one call keeps that
O(1) per step instead of O(running) locked ``observe`` calls. ``metrics.py`` renders these.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

__all__ = [
    "APIS",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "QUEUE_BUCKETS",
    "TTFT_BUCKETS",
    "ApiCounters",
    "EngineStats",
    "Histogram",
]

# vLLM's buckets (vllm/v1/metrics/loggers.py), ITL with a finer low end for fast profiles.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
QUEUE_BUCKETS = E2E_BUCKETS


class Histogram:
    """A cumulative-on-render histogram that takes weighted observations."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value`` (le-bucketed like Prometheus)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs ending with ``inf``, as Prometheus exposes them."""
        out: list[tuple[float, int]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((bound, acc))
        out.append((float("inf"), acc + self.counts[-1]))
        return out


@dataclass(slots=True)
class EngineStats:
    """Totals since start; seconds are wall-clock (i.e. already divided by the speed-up)."""

    prompt_tokens_total: int = 0
    #: prompt tokens actually computed (the prompt minus what the prefix caches skipped)
    prefill_tokens_total: int = 0
    generation_tokens_total: int = 0
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    steps: int = 0
    #: Sum of how late each step's wake-up was, seconds: a large mean means the process, not the
    #: model, sets the pace.
    step_lag_total: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))


#: The APIs ``/sim/stats`` counts, in the order it lists them.
APIS = ("chat", "completions", "responses", "messages", "embeddings")


@dataclass(slots=True)
class ApiCounters:
    """Requests and the usage answered on one API (what its answers' ``usage`` reported).

    ``requests`` counts every request that reached the API (a valid JSON object past fault
    injection); ``answered`` those that got a whole answer with usage (a refused request or a
    stream cut short is not answered). The token sums are over answered
    requests: ``prompt_tokens`` includes the cache read and write parts.
    """

    requests: int = 0
    answered: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def add(self, prompt: int, output: int, cache_read: int = 0, cache_write: int = 0) -> None:
        """Count one answered request and its usage."""
        self.answered += 1
        self.prompt_tokens += prompt
        self.output_tokens += output
        self.cache_read_tokens += cache_read
        self.cache_write_tokens += cache_write
