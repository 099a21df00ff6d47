"""The gateway's Prometheus metric families: names, help texts, labels, buckets, merge modes.

:class:`MetricFamilies` declares every family on a worker's own registry, and
:class:`~gateway.telemetry.metrics.Metrics` adds the counting on top: what ``/metrics``
exports reads in one place, apart from how requests are counted into it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DURATION_BUCKETS",
    "QUEUE_BUCKETS",
    "RATIO_BUCKETS",
    "SIMILARITY_BUCKETS",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "MetricFamilies",
]

#: time to first token, seconds: 10 ms (cache hit, tiny prompt) to a minute (long prefill, queued)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
                20.0, 30.0, 60.0)
#: time per output token, seconds: 1 ms (small model, big GPU) to 1 s (overloaded)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
#: whole request, seconds: embeddings in tens of ms to long generations over minutes
DURATION_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0,
                    300.0, 600.0)
#: ROUGE-1 F of a shadow answer and the primary's
SIMILARITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
#: shadow / primary latency: a quarter as long to four times as long
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)
#: waiting for a backend slot, seconds
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_ROUTE = ("model", "pool", "class")
#: a request's series also name the client API it spoke (chat, completions, embeddings,
#: responses, messages): the same model answers several, at different costs (translation)
_SERIES = (*_ROUTE, "api")


class MetricFamilies:
    """The metric families of one :class:`~gateway.telemetry.metrics.Metrics`, on its registry."""

    registry: CollectorRegistry

    def _declare(self, tenant: tuple[str, ...]) -> None:
        r = self.registry
        self.requests = Counter("gateway_requests", "Requests answered, by HTTP status.",
                                [*_SERIES, "status", *tenant], registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens by kind: input = system + history + "
                              "new + tools; cached is a subset of input.",
                              [*_SERIES, "kind", *tenant], registry=r)
        self.retries = Counter("gateway_retries", "Upstream attempts after the first.",
                               _SERIES, registry=r)
        self.failovers = Counter("gateway_failovers", "Moves to a fallback pool.", _SERIES,
                                 registry=r)
        self.spend = Counter("gateway_spend", "Cost charged, in currency units.",
                             ["tenant", "model"], registry=r)
        self.ejections = Counter("gateway_ejections", "Backends ejected from their pool.",
                                 ["pool", "backend"], registry=r)
        self.usage_rejections = Counter(
            "gateway_backend_usage_rejected", "Answers whose usage figures were not believed "
            "(billed at the gateway's own estimate instead), by backend and reason: missing, "
            "null, not_integer, negative, too_large, malformed.",
            ["pool", "backend", "reason"], registry=r)
        self.client_stalls = Counter("gateway_client_stalls", "Responses cut off because the "
                                     "client read nothing for timeouts.client_stall (backend "
                                     "connection closed, slot released).", ["pool"], registry=r)
        self.continuations = Counter(
            "gateway_stream_continuations", "Streams broken after their first byte, by pool "
            "and what followed: continued (on another backend), refused (continuation off, "
            "past its bounds, or a stream it cannot continue), failed (no backend took it).",
            ["pool", "outcome"], registry=r)
        self.continuation_prompts = Counter(
            "gateway_stream_continuation_prompt_tokens", "Prompt tokens sent to continue "
            "broken streams (the prompt plus the text already sent), by pool: the operator's "
            "cost of continuing (usage records: continuation_cost).", ["pool"], registry=r)
        self.quota_rejections = Counter("gateway_quota_rejections",
                                        "Requests refused by a quota limit.",
                                        ["limit", *tenant], registry=r)
        self.budget_alerts = Counter("gateway_budget_alerts",
                                     "Budget threshold alerts fired (once per budget, period "
                                     "and threshold across replicas).", ["level", "threshold"],
                                     registry=r)
        self.budget_webhooks = Counter("gateway_budget_alert_webhooks",
                                       "Budget alert webhook deliveries by outcome (delivered, "
                                       "retried, failed, dropped).", ["outcome"], registry=r)
        self.shed = Counter("gateway_shed", "Requests refused at once because their pool "
                            "predicted they would start too late (load shedding), by reason: "
                            "deadline, priority.", [*_ROUTE, "reason"], registry=r)
        self.shadow_requests = Counter("gateway_shadow_requests",
                                       "Shadow (mirrored) requests, by outcome.", ["status"],
                                       registry=r)
        self.rollout_step = Gauge("gateway_rollout_step", "A progressive canary's share of "
                                  "its model's traffic, percent (0 after a rollback or abort, "
                                  "100 once promoted).", ["model", "version"],
                                  multiprocess_mode="livemax", registry=r)
        self.rollout_transitions = Counter("gateway_rollout_transitions",
                                           "Rollout transitions, by reason (started, advanced, "
                                           "promoted, gate:<name>, operator:<action>, "
                                           "definition_changed).",
                                           ["model", "version", "reason"], registry=r)
        self.shadow_compared_total = Counter(
            "gateway_shadow_compared", "Shadow answers compared with the primary's, by outcome "
            "(agree, disagree, error: either side not a complete 2xx answer).",
            ["model", "version", "outcome"], registry=r)
        self.shadow_similarity = Histogram(
            "gateway_shadow_similarity", "ROUGE-1 F of a shadow answer and the primary's "
            "(1: the same words).", ["model", "version"], buckets=SIMILARITY_BUCKETS,
            registry=r)
        self.shadow_latency_ratio = Histogram(
            "gateway_shadow_latency_ratio", "Shadow / primary latency of one mirrored request "
            "(kind: ttft, duration).", ["model", "version", "kind"],
            buckets=RATIO_BUCKETS, registry=r)
        self.ttft = Histogram("gateway_ttft_seconds", "Time to first token (streams).",
                              _SERIES, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("gateway_tpot_seconds", "Time per output token after the first "
                              "(streams).", _SERIES, buckets=TPOT_BUCKETS, registry=r)
        self.duration = Histogram("gateway_request_duration_seconds", "End-to-end latency.",
                                  _SERIES, buckets=DURATION_BUCKETS, registry=r)
        self.queue_wait = Histogram("gateway_queue_wait_seconds",
                                    "Time waiting for a backend slot.", _ROUTE,
                                    buckets=QUEUE_BUCKETS, registry=r)
        self.tenant_queue_wait = Histogram(
            "gateway_tenant_queue_wait_seconds", "Time a request waited for a backend slot of "
            "its pool (0 when one was free), by tenant.", ["pool", "tenant"],
            buckets=QUEUE_BUCKETS, registry=r)
        self.tenant_tokens = Counter(
            "gateway_tenant_dispatched_tokens", "Estimated prompt + output tokens handed to a "
            "pool's backends, by tenant (each attempt): the share of the pool each is served.",
            ["pool", "tenant"], registry=r)
        self.inflight = Gauge("gateway_inflight", "Requests in flight per backend.",
                              ["pool", "backend"], multiprocess_mode="livesum", registry=r)
        self.backend_healthy = Gauge("gateway_backend_healthy", "1 if the backend takes "
                                     "traffic, 0 if ejected.", ["pool", "backend"],
                                     multiprocess_mode="livemin", registry=r)
        self.signals_missing = Gauge(
            "gateway_engine_signals_missing", "1 if the backend's last metrics scrape (pool "
            "signals) held none of its engine's metric names, so its queue and KV cache are "
            "not read.", ["pool", "backend"], multiprocess_mode="livemax", registry=r)
        self.queue_depth = Gauge("gateway_queue_depth", "Requests waiting for a backend slot.",
                                 ["pool"], multiprocess_mode="livesum", registry=r)
        self.headroom_in_use = Gauge(
            "gateway_pool_headroom_in_use", "Slots in use above the backends' max_in_flight: "
            "fair_headroom taken by tenants below their share of the pool.", ["pool"],
            multiprocess_mode="livesum", registry=r)
        self.headroom_started = Counter(
            "gateway_pool_headroom_dispatches", "Requests started on a pool's fair_headroom "
            "(their tenant below its share, every slot busy).", ["pool"], registry=r)
        # made on first report: an unlabelled gauge exists (as 0) from creation, which would
        # read "Redis down" for a gateway without Redis, or before its first check
        self.redis_up: Gauge | None = None
        self.ledger_pending = Gauge("gateway_ledger_pending", "Usage records written but not "
                                    "yet durable.", multiprocess_mode="livesum", registry=r)
        self.ledger_spool = Gauge("gateway_ledger_spool_segments", "Spool files waiting for "
                                  "the ledger database (0 when it keeps up).",
                                  multiprocess_mode="livemax", registry=r)
        self.ledger_records = Gauge("gateway_ledger_records", "Usage records since start, by "
                                    "what became of them: stored, duplicate (a replay), spooled "
                                    "(the database was away), replayed, unparseable (spool lines "
                                    "a replay skipped).", ["outcome"],
                                    multiprocess_mode="livesum", registry=r)
        self.ledger_lag = Gauge("gateway_ledger_commit_lag_seconds", "Longest wait from a "
                                "record's write to its commit since the last report.",
                                multiprocess_mode="livemax", registry=r)
        self.ledger_journaled = Gauge("gateway_ledger_journal_records", "Usage records durable "
                                      "in the local journal (ledger_durability: journal) and "
                                      "not yet in the database.",
                                      multiprocess_mode="livesum", registry=r)
        self.ledger_durable = Gauge("gateway_ledger_durable", "1 while usage records can be "
                                    "made durable (committed or spooled), 0 while both fail "
                                    "(/readyz answers 503 then).",
                                    multiprocess_mode="livemin", registry=r)
        self.ledger_database_up = Gauge("gateway_ledger_database_up", "1 while flushes go to "
                                        "the ledger database, 0 while they go to the spool "
                                        "(probed in the background).",
                                        multiprocess_mode="livemin", registry=r)
        self.ledger_journal_failed = Gauge("gateway_ledger_journal_failed", "1 once the local "
                                           "journal failed to write: responses then wait for "
                                           "the database's commit.",
                                           multiprocess_mode="livemax", registry=r)
