"""What a worker's metrics gather between two flushes, per label set, before prometheus_client.

A request adds to plain ints and lists here (:class:`Bound` per route, status and tenant;
:class:`Dispatched` per pool and tenant; :class:`Hist` per histogram child); their ``flush``
moves the sums into the families' children, at most once per ``flush_interval``
(:class:`~gateway.telemetry.metrics.Metrics`).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from gateway.telemetry.families import DURATION_BUCKETS, QUEUE_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from gateway.telemetry.families import MetricFamilies
    from gateway.telemetry.types import UsageView

__all__ = ["KINDS", "Bound", "Dispatched", "Hist", "observe"]


def observe(hist: Hist, value: float) -> None:
    hist.counts[bisect_left(hist.bounds, value)] += 1  # first bound >= value: Prometheus' le
    hist.sum += value


class Hist:
    """Bucket counts and sum gathered since the last flush, for one histogram child.

    The child is made at the first flush with something to add: a label set that never saw a
    value (the TTFT of a 401 that has no model, pool or class) exports no all-zero series.
    """

    __slots__ = ("bounds", "child", "counts", "family", "labels", "sum")

    def __init__(self, family: Histogram, labels: tuple[str, ...],
                 bounds: tuple[float, ...]) -> None:
        self.family, self.labels, self.bounds = family, labels, bounds
        self.child: Any = None
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def flush(self) -> None:
        if not any(self.counts):
            return
        if self.child is None:
            self.child = self.family.labels(*self.labels)
        # prometheus_client has no bulk observe: add to its per-bucket values (non-cumulative
        # in both single and multiprocess mode; cumulated at collection) and to its sum
        buckets = self.child._buckets
        for i, n in enumerate(self.counts):
            if n:
                buckets[i].inc(n)
                self.counts[i] = 0
        if self.sum:
            self.child._sum.inc(self.sum)
            self.sum = 0.0


class Bound:
    """One label set's counts since the last flush, and its children once they have any.

    Per request the hot path adds to plain ints and keeps the request's usage for the flush to
    add up (~1.5 µs for all of a request's metrics); :meth:`flush` moves the sums into
    prometheus_client (~0.3-0.8 µs per value, paid once per label set per flush instead of per
    request). A child is bound the first time it has something to add, so no series is
    exported at zero (retries, tokens, TTFT of a request that had none).
    """

    __slots__ = ("duration", "failover_child", "failovers", "metrics", "request_child",
                 "requests", "retries", "retry_child", "route", "tenant", "token_children",
                 "tpot", "ttft", "usages")

    def __init__(self, m: MetricFamilies, model: str, pool: str, cls: str, status: str,
                 tenant: tuple[str, ...], api: str) -> None:
        route = (model, pool, cls, api)
        self.metrics, self.route, self.tenant = m, route, tenant
        self.request_child = m.requests.labels(*route, status, *tenant)
        self.retry_child: Any = None
        self.failover_child: Any = None
        self.token_children: list[Any] = [None] * len(KINDS)
        self.duration = Hist(m.duration, route, DURATION_BUCKETS)
        self.ttft = Hist(m.ttft, route, TTFT_BUCKETS)
        self.tpot = Hist(m.tpot, route, TPOT_BUCKETS)
        self.requests = self.retries = self.failovers = 0
        self.usages: list[UsageView] = []  # since the last flush; summed there, not per request

    def flush(self) -> None:
        m = self.metrics
        if self.requests:
            self.request_child.inc(self.requests)
            self.requests = 0
        if self.retries:
            if self.retry_child is None:
                self.retry_child = m.retries.labels(*self.route)
            self.retry_child.inc(self.retries)
            self.retries = 0
        if self.failovers:
            if self.failover_child is None:
                self.failover_child = m.failovers.labels(*self.route)
            self.failover_child.inc(self.failovers)
            self.failovers = 0
        if self.usages:
            usages, self.usages = self.usages, []
            prompt = system = history = new = tools = cached = output = 0
            for u in usages:
                prompt += u.prompt_total
                system += u.system
                history += u.history
                new += u.new
                tools += u.tools
                cached += u.cached
                output += u.output
            children = self.token_children
            for i, n in enumerate((prompt, system, history, new, tools, cached, output)):
                if n:
                    if children[i] is None:
                        children[i] = m.tokens.labels(*self.route, KINDS[i], *self.tenant)
                    children[i].inc(n)
        self.duration.flush()
        self.ttft.flush()
        self.tpot.flush()


KINDS = ("input", "system", "history", "new", "tools", "cached", "output")


class Dispatched:
    """One (pool, tenant)'s queue waits and dispatched tokens since the last flush."""

    __slots__ = ("labels", "metrics", "token_child", "tokens", "wait")

    def __init__(self, m: MetricFamilies, pool: str, tenant: str) -> None:
        self.metrics, self.labels = m, (pool, tenant)
        self.wait = Hist(m.tenant_queue_wait, self.labels, QUEUE_BUCKETS)
        self.tokens = 0
        self.token_child: Any = None

    def flush(self) -> None:
        self.wait.flush()
        if self.tokens:
            if self.token_child is None:
                self.token_child = self.metrics.tenant_tokens.labels(*self.labels)
            self.token_child.inc(self.tokens)
            self.tokens = 0
