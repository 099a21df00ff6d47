"""Prometheus metrics of the gateway: latency histograms, counters, gauges, and ``/metrics``.

One :class:`Metrics` per worker process, made by the app factory and passed in. Per request the
caller makes one :meth:`Metrics.observe_request` call. Label children are bound once per label
set and kept in a small dict, and a request only adds to plain ints there (~1 µs); the sums go
into prometheus_client at most once a second (``flush_interval``) and on every :meth:`render`.

Several workers: when ``PROMETHEUS_MULTIPROC_DIR`` is set (the CLI sets a fresh, empty temp dir
when ``--workers > 1``, before the workers start), values live in per-process mmap files and
:meth:`Metrics.render` merges every worker's files, so any worker answers ``/metrics`` for all.
The parent should call :func:`mark_process_dead` with a worker's pid when it exits.
Gauges are merged per their meaning:

==========================  ==========  =====================================================
gauge                       mode        why
==========================  ==========  =====================================================
``gateway_inflight``        livesum     each worker counts its own requests: add them up
``gateway_queue_depth``     livesum     each worker queues its own requests
``gateway_backend_healthy`` livemin     each worker judges health alone: 0 if any ejected it
``gateway_redis_up``        livemin     0 if any worker has lost Redis
==========================  ==========  =====================================================

``gateway_pool_headroom_in_use`` is a livesum too (each worker hands out its own headroom);
``gateway_engine_signals_missing`` a livemax (1 if any worker's last scrape of the backend's
metrics held none of its engine's names).

Label cardinality is bounded: model, pool, class and backend come from the policy, status from
the gateway. The optional tenant label takes the first ``tenant_cap`` tenants a worker sees;
the rest read ``other`` (per worker: with N workers up to N x cap names may appear in total).
``gateway_spend_total`` always has the (capped) tenant label - spend per tenant is its point;
so have ``gateway_tenant_queue_wait_seconds`` and ``gateway_tenant_dispatched_tokens_total``
(fair queuing: how long each tenant waits for a pool, and the share of it each is served).

Per-tenant values are for a protected endpoint: with ``tenant_series=False`` (the gateway's
choice when ``/metrics`` has no token, ``GATEWAY_METRICS_TOKEN`` unset) every tenant label
reads ``*`` (all tenants summed), so an open scrape shows neither tenant names nor their spend.
"""


from __future__ import annotations

import os
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client import multiprocess as _mp

from gateway.telemetry.families import (
    DURATION_BUCKETS,
    QUEUE_BUCKETS,
    RATIO_BUCKETS,
    SIMILARITY_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    MetricFamilies,
)
from gateway.telemetry.pending import Bound, Dispatched, observe

if TYPE_CHECKING:
    from gateway.telemetry.types import ContextView, UsageView

__all__ = [
    "ALL_TENANTS",
    "DURATION_BUCKETS",
    "QUEUE_BUCKETS",
    "RATIO_BUCKETS",
    "SIMILARITY_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "Metrics",
    "mark_process_dead",
]

_APIS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_MICROS = 1_000_000
_CACHE_LIMIT = 4096  # label sets kept bound; past it the cache starts over (never grows unbounded)
_OTHER = "other"
#: the tenant label value of every tenant when per-tenant series are off
ALL_TENANTS = "*"


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (multiprocess mode); call from the parent process."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _mp.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class Metrics(MetricFamilies):
    """The gateway's metric families, on a registry of its own (never the global one).

    The families are declared by :class:`~gateway.telemetry.families.MetricFamilies`; the
    counts gathered between flushes are :mod:`gateway.telemetry.pending`'s."""

    def __init__(self, *, enabled: bool = True, tenant_label: bool = False,
                 tenant_cap: int = 100, flush_interval: float = 1.0,
                 tenant_series: bool = True) -> None:
        self.enabled = enabled
        self.tenant_series = tenant_series
        self.tenant_label = tenant_label
        self.tenant_cap = tenant_cap
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        if self.multiprocess and not getattr(values.ValueClass, "_multiprocess", False):
            # prometheus_client picks its value class at import; the variable came later
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        self._tenants: dict[str, str] = {}
        self._bound: dict[tuple[Any, ...], Bound] = {}
        self._dispatched: dict[tuple[str, str], Dispatched] = {}
        self._spend_pending: dict[tuple[str, str], int] = {}  # micro-units, not yet flushed
        self.flush_interval = flush_interval
        self._next_flush = time.monotonic() + flush_interval
        # no ``*_created`` series: they double /metrics for nothing
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        # process_resident_memory_bytes and friends, so soak runs can watch for leaks
        ProcessCollector(registry=self.registry)
        self._declare(tuple(["tenant"] if tenant_label else []))

    def __repr__(self) -> str:
        mode = "multiprocess" if self.multiprocess else "single"
        return (f"<Metrics {'on' if self.enabled else 'off'} {mode} "
                f"[label sets: {len(self._bound)} | tenants: {len(self._tenants)}]>")

    def tenant(self, tenant: str | None) -> str:
        """The label value for a tenant: itself while under the cap, else ``other``."""
        if tenant is None:
            return ""
        if not self.tenant_series:
            return ALL_TENANTS
        label = self._tenants.get(tenant)
        if label is None:
            label = tenant if len(self._tenants) < self.tenant_cap else _OTHER
            if label is not _OTHER:
                self._tenants[tenant] = label
        return label

    def observe_request(self, ctx: ContextView, usage: UsageView | None = None, *,
                        tenant: str | None = None, queue_wait_s: float | None = None) -> None:
        """Count one finished request: status, latency, TTFT/TPOT (streams), tokens, cost,
        retries and failovers (from ``ctx.attempts`` / ``ctx.failovers``). Call once, last.
        ``usage`` and ``tenant`` default to the context's attributes of those names.

        Counts gather in this object and reach prometheus_client at most ``flush_interval``
        seconds later (on a later call, or at :meth:`render` / :meth:`flush`).
        """
        if not self.enabled:
            return
        key = self.observe_one(ctx, usage, tenant)
        if queue_wait_s is not None:
            self.queue_wait.labels(*(v or "" for v in key[:3])).observe(queue_wait_s)
        self.flush_due()

    def observe_one(self, ctx: ContextView, usage: UsageView | None = None,
                    tenant: str | None = None) -> tuple[Any, ...]:
        """The counting part of :meth:`observe_request`, for callers that loop over many
        requests (:class:`~gateway.telemetry.finished.FinishedRequests`) and then call
        :meth:`flush_due` once; only while ``enabled``. Returns the request's label key."""
        if usage is None:
            usage = getattr(ctx, "usage", None)
        if tenant is None:
            tenant = getattr(ctx, "tenant", None)
        label = "" if tenant is None else self._tenants.get(tenant) or self.tenant(tenant)
        key = (ctx.request_model, ctx.pool, ctx.request_class, ctx.status, label, ctx.endpoint)
        bound = self._bound.get(key) or self._bind(key)
        bound.requests += 1
        started = ctx.started_ns
        finished = ctx.finished_ns
        if finished is not None:  # _observe, inlined: this runs once per request
            hist = bound.duration
            value = (finished - started) / 1e9
            hist.counts[bisect_left(hist.bounds, value)] += 1  # first bound >= value: le
            hist.sum += value
        first = ctx.first_token_ns
        if ctx.stream and first is not None:
            observe(bound.ttft, (first - started) / 1e9)
            out = usage.output if usage is not None else 0
            if out > 1 and ctx.last_chunk_ns is not None:
                observe(bound.tpot, (ctx.last_chunk_ns - first) / 1e9 / (out - 1))
        if ctx.attempts > 1:
            bound.retries += ctx.attempts - 1
        if ctx.failovers:
            bound.failovers += ctx.failovers
        if usage is not None:
            bound.usages.append(usage)  # its tokens are added up at the flush
            cost = usage.cost
            if cost is not None and cost.total:
                spend = self._spend_pending
                spend_key = (label, key[0] or "")
                spend[spend_key] = spend.get(spend_key, 0) + cost.total
        return key

    def dispatched(self, pool: str, tenant: str | None, waited_s: float, tokens: int) -> None:
        """A request of ``tenant`` got a backend of ``pool`` after ``waited_s`` in its queue;
        ``tokens`` is its estimated prompt + output (its cost to the tenant's fair share)."""
        if not self.enabled:
            return
        key = (pool, self.tenant(tenant) or "")
        entry = self._dispatched.get(key)
        if entry is None:
            if len(self._dispatched) >= _CACHE_LIMIT:
                self.flush()
                self._dispatched.clear()
            entry = self._dispatched[key] = Dispatched(self, *key)
        observe(entry.wait, waited_s)
        entry.tokens += tokens

    def flush_due(self) -> None:
        """Flush if the last flush is ``flush_interval`` old."""
        now = time.monotonic()
        if now >= self._next_flush:
            self._next_flush = now + self.flush_interval
            self.flush()

    def _bind(self, key: tuple[Any, ...]) -> Bound:
        if len(self._bound) >= _CACHE_LIMIT:
            self.flush()
            self._bound.clear()
        model, pool, cls, status, label, endpoint = key
        bound = Bound(self, model or "", pool or "", cls or "", str(status),
                       (label,) if self.tenant_label else (), _APIS.get(endpoint, ""))
        self._bound[key] = bound
        return bound

    def flush(self) -> None:
        """Move gathered counts into prometheus_client (in multiprocess mode: into this worker's
        files, where other workers' ``/metrics`` see them). Call at shutdown too."""
        for bound in self._bound.values():
            bound.flush()
        for entry in self._dispatched.values():
            entry.flush()
        if self._spend_pending:
            pending, self._spend_pending = self._spend_pending, {}
            for (tenant, model), micros in pending.items():
                self.spend.labels(tenant, model).inc(micros / _MICROS)

    def quota_rejected(self, limit: str, tenant: str | None = None) -> None:
        """A request refused by quota ``limit`` (e.g. ``rpm``, ``tpm``, ``budget``)."""
        if self.enabled:
            if self.tenant_label:
                self.quota_rejections.labels(limit, self.tenant(tenant)).inc()
            else:
                self.quota_rejections.labels(limit).inc()

    def budget_alert(self, level: str, threshold: int) -> None:
        """A budget crossed ``threshold`` percent at ``level`` (organization, team, ...)."""
        if self.enabled:
            self.budget_alerts.labels(level, str(threshold)).inc()

    def budget_webhook(self, outcome: str) -> None:
        """A budget alert webhook was delivered, retried, failed or dropped (queue full)."""
        if self.enabled:
            self.budget_webhooks.labels(outcome).inc()

    def shadow(self, status: str | int) -> None:
        """One shadow request finished (``status``: its HTTP status, or ``error`` / ``dropped``)."""
        if self.enabled:
            self.shadow_requests.labels(str(status)).inc()

    def shadow_compared(self, model: str, version: str, outcome: str,
                        similarity: float | None, ttft_ratio: float | None,
                        duration_ratio: float | None) -> None:
        """One shadow answer compared with the primary's (measures None for an error)."""
        if not self.enabled:
            return
        self.shadow_compared_total.labels(model, version, outcome).inc()
        if similarity is not None:
            self.shadow_similarity.labels(model, version).observe(similarity)
        if ttft_ratio is not None:
            self.shadow_latency_ratio.labels(model, version, "ttft").observe(ttft_ratio)
        if duration_ratio is not None:
            self.shadow_latency_ratio.labels(model, version, "duration").observe(duration_ratio)

    def shed_request(self, model: str, pool: str, cls: str, reason: str) -> None:
        """A request was refused by load shedding (answered 503 with Retry-After)."""
        if self.enabled:
            self.shed.labels(model, pool, cls, reason).inc()
    def set_rollout_step(self, model: str, version: str, share: float) -> None:
        """A canary's share of traffic now, percent."""
        if self.enabled:
            self.rollout_step.labels(model, version).set(share)

    def rollout_transition(self, model: str, version: str, reason: str) -> None:
        """A rollout moved (counted by the replica that moved it)."""
        if self.enabled:
            self.rollout_transitions.labels(model, version, reason).inc()

    def ejection(self, pool: str, backend: str, count: int = 1) -> None:
        """A backend was ejected (``count`` times since the last report); also marks it
        unhealthy."""
        if self.enabled:
            self.ejections.labels(pool, backend).inc(count)
            self.backend_healthy.labels(pool, backend).set(0)

    def client_stall(self, pool: str) -> None:
        """A response was cut off: its client stopped reading (``timeouts.client_stall``)."""
        if self.enabled:
            self.client_stalls.labels(pool).inc()

    def stream_continuation(self, pool: str, outcome: str) -> None:
        """A stream broke after its first byte: ``continued``, ``refused`` or ``failed``
        (``pools[].continuation``)."""
        if self.enabled:
            self.continuations.labels(pool, outcome).inc()

    def continuation_prompt(self, pool: str, tokens: int) -> None:
        """A continuation of a broken stream sent ``tokens`` prompt tokens (the prompt plus
        the text already sent)."""
        if self.enabled and tokens > 0:
            self.continuation_prompts.labels(pool).inc(tokens)

    def usage_rejected(self, pool: str, backend: str, reason: str) -> None:
        """A backend's answer carried usage the gateway did not believe (``reason``: the kind,
        ``accounting.usage_bounds.KINDS``); its record holds the gateway's estimate."""
        if self.enabled:
            self.usage_rejections.labels(pool, backend, reason).inc()

    def set_backend_health(self, pool: str, backend: str, healthy: bool) -> None:
        if self.enabled:
            self.backend_healthy.labels(pool, backend).set(1 if healthy else 0)

    def set_signals_missing(self, pool: str, backend: str, missing: bool) -> None:
        if self.enabled:
            self.signals_missing.labels(pool, backend).set(1 if missing else 0)

    def set_inflight(self, pool: str, backend: str, count: int) -> None:
        if self.enabled:
            self.inflight.labels(pool, backend).set(count)

    def set_queue_depth(self, pool: str, depth: int) -> None:
        if self.enabled:
            self.queue_depth.labels(pool).set(depth)

    def set_headroom(self, pool: str, in_use: int, started: int) -> None:
        """The pool's headroom slots in use, and ``started`` more requests that took one."""
        if self.enabled:
            self.headroom_in_use.labels(pool).set(in_use)
            if started:
                self.headroom_started.labels(pool).inc(started)

    def set_ledger(self, pending: int, spool_segments: int, outcomes: dict[str, int],
                   lag_ms: float, journaled: int = 0, journal_failed: bool = False,
                   durable: bool = True, database_up: bool = True) -> None:
        """The ledger's state, once a second: what waits, what spooled, how long commits took,
        what only the local journal holds."""
        if self.enabled:
            self.ledger_pending.set(pending)
            self.ledger_spool.set(spool_segments)
            for outcome, count in outcomes.items():
                self.ledger_records.labels(outcome).set(count)
            self.ledger_lag.set(lag_ms / 1000)
            self.ledger_journaled.set(journaled)
            self.ledger_journal_failed.set(int(journal_failed))
            self.ledger_durable.set(int(durable))
            self.ledger_database_up.set(int(database_up))

    def set_redis_up(self, up: bool) -> None:
        if self.enabled:
            if self.redis_up is None:
                self.redis_up = Gauge("gateway_redis_up", "1 if Redis answers, 0 if not.",
                                      multiprocess_mode="livemin", registry=self.registry)
            self.redis_up.set(1 if up else 0)

    def render(self) -> tuple[bytes, str]:
        """The ``/metrics`` body and its content type (all workers' values in multiprocess mode)."""
        self.flush()
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry(auto_describe=False)
        _mp.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        ProcessCollector(registry=registry)  # this worker's process figures
        return generate_latest(registry), CONTENT_TYPE_LATEST
