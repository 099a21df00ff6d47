"""The gateway's live state for one process, built from a policy by ``create_app``.

``Gateway`` is process-wide (the upstream client, the current ``Runtime``, background tasks);
a ``Runtime`` is one policy's state (keys, models, router). A reload builds a new Runtime and
swaps it in one assignment: a request reads ``gateway.runtime`` once when it starts and keeps
that snapshot, so in-flight requests finish under the policy they started with. Backend state
(load, health, latency) carries over to the new router for backends that stay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.accounting import PromptCounter
from gateway.alerts import BudgetAlerts, WebhookSender
from gateway.app.workers import Siblings, workers_dir
from gateway.auth.keystore import KeyStore
from gateway.auth.manage import open_keystore
from gateway.batch import BatchRunner, make_batch_jobs
from gateway.config import PolicyError, load_policy
from gateway.dialects.shape import ENDPOINTS
from gateway.http.base import make_upstream
from gateway.ledger import LedgerSettings
from gateway.ledger.journal import filesystem_of, journal_is_local
from gateway.ledger.sql import open_ledger
from gateway.ledger.sql.stored_responses import ResponseStore
from gateway.pipeline import Inbound, LineAnswer, Pipeline, Services
from gateway.quota import FailoverQuotaStore, MemoryQuotaStore, QuotaStore, RedisQuotaStore
from gateway.rollouts import Rollouts, make_rollout_store
from gateway.runtime import Runtime
from gateway.telemetry import (
    FinishedRequests,
    LogSettings,
    Metrics,
    RequestTracing,
    setup_logging,
)
from gateway.upstream.monitors import Monitors
from gateway.upstream.shadow import Mirror

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from gateway.batch import Execute, LineCall
    from gateway.config import Policy, Store
    from gateway.ledger.sql.store import SqlLedger
    from gateway.quota.alerts import AlertSink
    from gateway.rollouts import AgreementSource
    from gateway.routing.pool import PoolState

__all__ = ["METRICS_TOKEN_ENV", "SIBLING_RELOAD_TIMEOUT", "Gateway"]

_log = logging.getLogger("gateway.app.state")
#: when set, ``/metrics`` needs ``Authorization: Bearer <it>`` and exports per-tenant series
METRICS_TOKEN_ENV = "GATEWAY_METRICS_TOKEN"
#: how long shutdown waits for quota settles still running (each is bounded by the store's own
#: Redis timeout; this is the backstop)
SETTLE_DRAIN_S = 5.0
#: how long a reload waits for each sibling worker to confirm
SIBLING_RELOAD_TIMEOUT = 10.0


def _secrets(policy: Policy) -> tuple[str, ...]:
    """Values the logs must never show: backend keys, the admin token, the key secret."""
    names = {b.api_key_env for p in policy.pools for b in p.backends if b.api_key_env}
    names |= {"GATEWAY_ADMIN_TOKEN", METRICS_TOKEN_ENV, policy.auth.key_secret_env,
              policy.store.redis_url_env, policy.store.ledger_url_env}
    for alerts in (policy.alerts, *(o.alerts for o in policy.organizations if o.alerts)):
        names |= {n for n in (alerts.webhook_url_env, alerts.webhook_secret_env) if n}
    for model in policy.models:
        for version in model.versions:
            if (p := version.progressive) is not None:
                names |= {n for n in (p.webhook_url_env, p.webhook_secret_env) if n}
    return tuple(v for n in sorted(names) if (v := os.environ.get(n)) and len(v) >= 6)


def ledger_url(store: Store) -> str:
    """The ledger database: the URL in ``store.ledger_url_env``, else SQLite in the data
    directory (a single host keeps its records across restarts)."""
    url = os.environ.get(store.ledger_url_env)
    if url:
        return url
    return f"sqlite:///{(Path(store.data_dir) / 'ledger.db').resolve()}"


def make_ledger(store: Store) -> SqlLedger:
    """The ledger of record (PostgreSQL or SQLite), spooling locally when it is away."""
    settings = LedgerSettings(retention_days=store.usage_retention_days)
    ledger = open_ledger(ledger_url(store), spool_dir=store.spool_dir, settings=settings,
                         migrate=store.ledger_migrate, deadline=store.ledger_timeout)
    if journal_is_local(store.spool_dir):
        ledger.auto_mode = "process"
    elif store.ledger_durability == "auto":
        _log.warning("ledger: spool_dir %s is on a network file system (%s); "
                    "ledger_durability auto waits for the database's commit",
                    store.spool_dir, filesystem_of(store.spool_dir))
    return ledger


def make_quota_store(store: Store, alerts: AlertSink | None = None) -> QuotaStore:
    """Redis (exact across replicas, with the policy's outage mode) or this process only;
    budget threshold alerts go to ``alerts``."""
    url = os.environ.get(store.redis_url_env)
    if not url:
        return MemoryQuotaStore(alerts=alerts)
    primary = RedisQuotaStore.from_url(url, cluster=store.cluster, timeout=store.timeout,
                                       alerts=alerts)

    def on_change(degraded: bool) -> None:
        if degraded:
            _log.error("quota store: Redis unreachable, failing %s", store.outage)
        else:
            _log.info("quota store: Redis is back")

    return FailoverQuotaStore(primary, mode=store.outage, local_share=1 / store.processes,
                              on_change=on_change)


def line_executor(pipeline: Pipeline) -> Execute:
    """Run a batch line through the pipeline, as a request of the key that made the batch."""

    async def execute(line: LineCall) -> LineAnswer:
        body = line.body

        async def read(limit: int) -> bytes:
            return body

        return await pipeline.run_line(Inbound(
            method="POST", endpoint=ENDPOINTS[line.endpoint],
            headers=[(b"content-length", str(len(body)).encode())], read_body=read,
            identity=line.identity, request_class="batch", request_id=line.request_id,
            batch_id=line.batch_id))

    return execute


class Gateway:
    """Process-wide state: the upstream client, the current runtime, background work."""

    def __init__(self, policy: Policy, source: str | None = None) -> None:
        server = policy.server
        self.upstream = make_upstream(
            server.upstream_client, server.timeouts, server.keepalive_per_backend
        )
        self.ledger = make_ledger(policy.store)
        #: stored responses (Responses API), in the ledger's database; its expiry runs in the
        #: ledger's maintenance task
        self.responses = ResponseStore(self.ledger)
        self.tracing = RequestTracing.from_env()
        self.metrics = Metrics(
            enabled=os.environ.get("GATEWAY_METRICS", "on").lower() not in ("off", "0", "false"),
            tenant_label=False, tenant_cap=100,
            # tenants and their spend only on a protected /metrics
            tenant_series=bool(os.environ.get(METRICS_TOKEN_ENV)),
        )
        # budget alerts: log, metric and webhook, with the settings of the policy in force
        self.alerts = BudgetAlerts(
            lambda org: self.runtime.alerts_for(org),
            WebhookSender(on_outcome=self.metrics.budget_webhook), metrics=self.metrics,
            currency=lambda: self.runtime.policy.prices.currency)
        self.quota = make_quota_store(policy.store, self.alerts)
        self.access_log = setup_logging(LogSettings.from_env(secrets=_secrets(policy)))
        self.finished = FinishedRequests(self.metrics, self.access_log)
        self._gauges: asyncio.Task[None] | None = None
        #: each backend's ``ejected_total`` as last reported (``report_ejections``)
        self._ejections_seen: dict[int, int] = {}
        self.keystore: KeyStore | None = None
        if policy.store.keys_file is not None or os.environ.get(policy.store.redis_url_env):
            self.keystore = open_keystore(policy)
        self.runtime = Runtime(policy, keystore=self.keystore)
        # progressive canaries (issue 19): the router reads their weights, the pipeline feeds
        # their counts; ``shadow_compare`` (an AgreementSource: the mirror's comparisons)
        # feeds the shadow_agreement gate
        self.shadow_compare: AgreementSource | None = None  # set with the mirror below
        self.rollouts = Rollouts(
            make_rollout_store(policy.store, os.environ.get(policy.store.redis_url_env)),
            metrics=self.metrics, webhooks=WebhookSender(),
            agreement=lambda: self.shadow_compare)
        self.rollouts.configure(policy)
        self.runtime.router.weights = self.rollouts.weights
        self.source = source  # the policy path, for reloads
        # per-encoding counters with their history caches, kept across policy reloads
        self.counters: dict[str, PromptCounter] = {}
        self.draining = False
        self.reloads = 0
        self.tasks: set[asyncio.Task[Any]] = set()  # background tasks kept referenced
        self.settles: set[asyncio.Task[None]] = set()  # quota settles still running
        self.mirror = Mirror(self.upstream, self.metrics)  # shadow traffic and its stats
        self.shadow_compare = self.mirror.comparisons  # the shadow_agreement gate's source
        self._monitors: Monitors | None = None
        self._reload_lock = asyncio.Lock()
        # the other workers of this server (--workers N), for reloads and scrapes that must
        # reach all of them; None in a single process
        self.siblings: Siblings | None = None
        # --- batch jobs (issue 9): files and state here; the runner is set by create_app,
        # which knows the proxy routes its lines go through
        self.batches = make_batch_jobs(policy.batch, os.environ.get(policy.store.redis_url_env))
        #: the request pipeline, with the services it uses (and nothing else of this object)
        self.pipeline = Pipeline(Services(
            current=self.current, draining=lambda: self.draining,
            upstream=self.upstream, quota=self.quota, ledger=self.ledger,
            tracing=self.tracing, metrics=self.metrics, mirror=self.mirror,
            counter=self.counter, finished=self.finished, settle_later=self.settle_later,
            responses=self.responses, rollouts=self.rollouts.observe,
        ))
        #: batch lines run through the same pipeline as live requests
        self.batch_runner = BatchRunner(self, self.batches, line_executor(self.pipeline))

    def current(self) -> Runtime:
        """The policy snapshot in force (a reload swaps it; a request keeps the one it read)."""
        return self.runtime

    def counter(self, encoding: str) -> PromptCounter:
        counter = self.counters.get(encoding)
        if counter is None:
            counter = self.counters[encoding] = PromptCounter(encoding)
        return counter

    def load_encodings(self, policy: Policy) -> None:
        """Build the prompt counters of every encoding ``policy``'s models use, now. Loading
        one is ~0.4 s of CPU: left to the first request that needs it, it would stall the event
        loop with every other request behind it, and release them to the engines in a burst."""
        for encoding in sorted({model.encoding for model in policy.models}):
            self.counter(encoding)

    async def start(self) -> None:
        self.load_encodings(self.runtime.policy)  # before the first request, not on it
        shared = workers_dir()
        if shared is not None:
            self.siblings = Siblings(shared, {"reload": self._reload_for_sibling,
                                              "flush": self._flush_for_sibling,
                                              "ledger": self._flush_ledger})
            await self.siblings.start()
        await self.upstream.start()
        await self.ledger.start()
        self.alerts.start()
        await self.batches.open()  # batch jobs (issue 9)
        if self.runtime.policy.batch.run:
            self.batch_runner.start()
        self._gauges = asyncio.create_task(self._gauge_loop())
        await self.rollouts.start()
        self._monitors = Monitors(list(self.runtime.router.pools.values()), self.upstream)
        self._monitors.start()
        interval = self.runtime.policy.server.watch_interval
        if self.source is not None and interval > 0:
            self.tasks.add(asyncio.create_task(self._watch_policy(interval)))

    def _policy_mtime(self) -> float:
        assert self.source is not None
        path = Path(self.source)
        try:
            if path.is_dir():
                return max((p.stat().st_mtime for p in path.iterdir()
                            if p.suffix in (".yaml", ".yml")), default=0.0)
            return path.stat().st_mtime
        except OSError:
            return 0.0

    async def _watch_policy(self, interval: float) -> None:
        """Reload when the policy file (or a file of the policy directory) changes."""
        seen = self._policy_mtime()
        while True:
            await asyncio.sleep(interval)
            mtime = self._policy_mtime()
            if mtime != seen:
                seen = mtime
                await self.reload_logged("file change", propagate=False)  # each one watches

    async def _reload_for_sibling(self) -> dict[str, Any]:
        """Another worker reloaded (admin call, SIGHUP): re-read the policy here too."""
        return await self.reload_logged("a sibling worker", propagate=False)

    async def ledger_caught_up(self) -> None:
        """Every usage record of an answer already given is in the ledger (or its spool):
        this worker's buffer flushed, and its siblings' (a usage read right after an answer
        sees it whatever the durability mode). Bounded by ``store.ledger_timeout``; a read
        after a timeout answers from what is there."""
        bound = self.runtime.policy.store.ledger_timeout
        if self.siblings is not None:
            await self.siblings.broadcast("ledger", bound)
        await self._flush_ledger()

    async def _flush_ledger(self) -> dict[str, Any]:
        try:
            async with asyncio.timeout(self.runtime.policy.store.ledger_timeout):
                await self.ledger.flush()
        except Exception:  # a read goes on with what is stored: the failure is logged once
            return {"flushed": False}
        return {"flushed": True}

    async def _flush_for_sibling(self) -> dict[str, Any]:
        """Another worker is answering ``/metrics``: put what waits here into the shared
        files first, so the scrape counts every request this worker has answered."""
        self.finished.flush()
        self.metrics.flush()
        return {"flushed": True}

    def settle_later(self, settle: Coroutine[Any, Any, None]) -> None:
        """Run a request's quota settle without the request waiting for it.

        The response is complete by then; the settle only returns unused tokens to the
        tenant's windows. Awaiting it under ``asyncio.shield`` (so a cancelled request still
        settles) cost an extra future, two callbacks and a suspension per request; here the
        task is kept referenced until done and :meth:`close` waits for those still running.
        """
        task = asyncio.get_running_loop().create_task(settle)
        self.settles.add(task)
        task.add_done_callback(self.settles.discard)

    async def close(self) -> None:
        if self.siblings is not None:
            await self.siblings.close()
        # batch lines in flight finish and are recorded while upstream and ledger are open
        await self.batch_runner.stop()
        if self._monitors is not None:
            await self._monitors.stop()
        for task in [*self.tasks, *self.mirror.tasks]:
            task.cancel()
        if self.settles:  # every admitted request's settle reaches the store before it closes
            await asyncio.wait(set(self.settles), timeout=SETTLE_DRAIN_S)
        await self.upstream.close()
        if self.keystore is not None:
            await self.keystore.aclose()
        await self.quota.aclose()
        await self.rollouts.aclose()
        await self.alerts.aclose()  # webhooks still queued get a short drain
        if self._gauges is not None:
            self._gauges.cancel()
        await self.ledger.close()  # drains buffered usage records to the database or the spool
        await self.batches.close()  # batch jobs (issue 9)
        self.tracing.shutdown()
        self.finished.flush()
        self.metrics.flush()
        self.access_log.close()

    def _report_ledger(self) -> None:
        ledger, st = self.ledger, self.ledger.stats
        spool = getattr(ledger, "spool", None)
        segments = len(spool.segment_paths()) if spool is not None else 0
        journal = ledger.journal
        self.metrics.set_ledger(
            ledger.pending, segments,
            {"stored": st.stored, "duplicate": st.duplicates, "spooled": st.spooled,
             "replayed": st.replayed, "unparseable": st.spool_bad_lines}, st.max_lag_ms,
            journaled=journal.unstored if journal is not None else 0,
            journal_failed=journal is not None and journal.broken,
            durable=ledger.durability.ok, database_up=getattr(ledger, "database_up", True))
        st.max_lag_ms = 0.0  # the gauge reports the worst lag of each second

    def report_ejections(self, pool: PoolState) -> None:
        """Ejections since the last report, wherever they were decided (a failed request, a
        stream that broke after its first byte, a health probe), into
        ``gateway_ejections_total`` (the gauge loop each second, and every scrape)."""
        seen = self._ejections_seen
        for b in pool.backends:
            new = b.ejected_total - seen.get(id(b), 0)
            if new > 0:
                seen[id(b)] = b.ejected_total
                self.metrics.ejection(pool.name, b.label, new)

    async def _gauge_loop(self) -> None:
        """In-flight, queue depth, health and Redis reachability, once a second."""
        while True:
            now = time.monotonic()
            for pool in self.runtime.router.pools.values():
                self.metrics.set_queue_depth(pool.name, pool.queued)
                started, pool.headroom_started = pool.headroom_started, 0
                self.metrics.set_headroom(pool.name, pool.headroom_in_use, started)
                self.report_ejections(pool)
                for b in pool.backends:
                    self.metrics.set_inflight(pool.name, b.label, b.in_flight)
                    self.metrics.set_backend_health(pool.name, b.label, b.healthy(now))
                    if pool.config.signals is not None:
                        self.metrics.set_signals_missing(pool.name, b.label, b.signals_missing)
            self._report_ledger()
            degraded = getattr(self.quota, "degraded", None)
            if degraded is not None:
                self.metrics.set_redis_up(not degraded)
            self.metrics.flush()  # with several workers, /metrics reads what each flushed
            await asyncio.sleep(1.0)

    async def reload_logged(self, trigger: str, *, propagate: bool = True) -> dict[str, Any]:
        """Reload the policy; log and return what happened (an invalid file keeps the old one).

        With ``propagate`` (an admin call, SIGHUP), every other worker of this server reloads too
        and the answer counts them: ``workers`` is how many processes now run the new policy,
        ``unconfirmed`` the pids that did not say so in time, ``failed`` the ones that refused.
        """
        try:
            runtime = await self.reload()
        except PolicyError as exc:
            _log.error("policy reload (%s) rejected, keeping the old policy: %s", trigger, exc)
            return {"reloaded": False, "error": str(exc)}
        except Exception as exc:
            _log.error("policy reload (%s) failed, keeping the old policy: %s: %s", trigger,
                       type(exc).__name__, exc)
            return {"reloaded": False, "error": f"{type(exc).__name__}: {exc}"}
        _log.info("policy reloaded by %s", trigger)
        result: dict[str, Any] = {
            "reloaded": True,
            "workers": 1,
            "pools": sorted(runtime.router.pools),
            "models": sorted(runtime.models),
            "reloads": self.reloads,
        }
        if propagate and self.siblings is not None:
            replies = await self.siblings.broadcast("reload", SIBLING_RELOAD_TIMEOUT)
            done = [pid for pid, r in replies.items() if r is not None and r.get("reloaded")]
            failed = {str(pid): r.get("error", "refused") for pid, r in replies.items()
                      if r is not None and not r.get("reloaded")}
            unconfirmed = sorted(pid for pid, r in replies.items() if r is None)
            result["workers"] = 1 + len(done)
            if failed or unconfirmed:
                result.update(reloaded=False, failed=failed, unconfirmed=unconfirmed)
                _log.error("policy reload (%s): %d of %d workers reloaded; failed %s, no answer "
                           "from %s", trigger, 1 + len(done), 1 + len(replies), failed, unconfirmed)
        return result

    async def reload(self, policy: Policy | None = None) -> Runtime:
        """Swap in a new policy (re-read from ``source`` when none is given).

        Raises ``PolicyError`` and keeps the old runtime when the new policy is invalid.
        """
        async with self._reload_lock:
            if policy is None:
                if self.source is None:
                    raise RuntimeError("no policy source to reload from")
                policy = load_policy(self.source)
            runtime = Runtime(policy, self.runtime, self.keystore)
            # a new encoding loads beside the loop, before the swap makes requests need it
            await asyncio.to_thread(self.load_encodings, policy)
            self.rollouts.configure(policy)  # before the swap: the router reads its weights
            monitors = Monitors(list(runtime.router.pools.values()), self.upstream)
            old = self._monitors
            self.runtime = runtime  # the atomic swap
            self._monitors = monitors
            monitors.start()
            if old is not None:
                await old.stop()
            self.reloads += 1
            await self.rollouts.sync()  # a changed rollout definition restarts, logged
            _log.info("policy reloaded (%d pools, %d models)", len(runtime.router.pools),
                      len(runtime.models))
            return runtime

    def __repr__(self) -> str:
        return f"<Gateway {self.runtime!r} [reloads: {self.reloads} | draining: {self.draining}]>"
