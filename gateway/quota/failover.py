"""Redis first, and a decision even when Redis is away.

``FailoverQuotaStore`` wraps a ``RedisQuotaStore``. When Redis stops answering it either
refuses to decide (fail-closed: ``QuotaUnavailable``, the gateway answers 503) or admits against
a ``MemoryQuotaStore`` whose limits are this process's share of the totals (fail-open). A
background probe pings Redis, at most every ``probe_interval`` seconds and backing off to
``probe_max_interval``, and switches back when it answers.

Reservations remember where they were made: a local one is renewed and settled locally; a
settle of a Redis one that fails is queued and replayed when Redis is back (settle is
idempotent by request id, so a replay never charges twice). Budget alerts come from the Redis
store only: the local counters are this process's share, so they alert nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING, Literal

import msgspec

from gateway.quota.base import QuotaRequest, QuotaStore
from gateway.quota.errors import QuotaUnavailable
from gateway.quota.limits import Limits
from gateway.quota.memory import MemoryQuotaStore

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gateway.quota.base import Alerted, Decision, Reservation, Usage
    from gateway.quota.limits import Partition
    from gateway.quota.redis import RedisQuotaStore

__all__ = ["FailoverMode", "FailoverQuotaStore"]

FailoverMode = Literal["open", "closed"]

log = logging.getLogger(__name__)

MAX_PENDING_SETTLES = 100_000
"""Settles kept for replay during an outage; beyond it the oldest are dropped (and logged)."""


class FailoverQuotaStore(QuotaStore):
    """A Redis store with an outage policy.

    Args:
        primary: the shared store.
        mode: ``"closed"`` raises ``QuotaUnavailable`` during an outage; ``"open"`` admits
            against local limits.
        local_share: this process's fraction of each limit in fail-open mode, usually
            ``1 / (replicas * workers)``; each limit becomes ``max(1, floor(limit * share))``.
        on_change: called with ``True`` when an outage starts and ``False`` when it ends
            (metrics, alerts); must not block.
        local: the fallback store (made here unless given, e.g. with a test clock).
    """

    __slots__ = (
        "_degraded",
        "_local",
        "_mode",
        "_on_change",
        "_pending",
        "_primary",
        "_probe_interval",
        "_probe_max_interval",
        "_probe_task",
        "_scaled",
        "_share",
        "outages",
    )

    def __init__(
        self,
        primary: RedisQuotaStore,
        *,
        mode: FailoverMode = "closed",
        local_share: float = 1.0,
        on_change: Callable[[bool], None] | None = None,
        probe_interval: float = 1.0,
        probe_max_interval: float = 8.0,
        local: MemoryQuotaStore | None = None,
    ) -> None:
        if mode not in ("open", "closed"):
            raise ValueError(f"mode must be 'open' or 'closed', got {mode!r}")
        if not 0.0 < local_share <= 1.0:
            raise ValueError(f"local_share must be in (0, 1], got {local_share}")
        self._primary = primary
        self._mode = mode
        self._share = local_share
        self._on_change = on_change
        self._probe_interval = probe_interval
        self._probe_max_interval = probe_max_interval
        self._local = local or MemoryQuotaStore()
        self._scaled: dict[Limits, Limits] = {}
        self._pending: deque[tuple[Reservation, int, int | None]] = deque(
            maxlen=MAX_PENDING_SETTLES
        )
        self._probe_task: asyncio.Task[None] | None = None
        self._degraded = False
        self.outages = 0

    def __repr__(self) -> str:
        state = "degraded" if self._degraded else "ok"
        return (
            f"<FailoverQuotaStore [fail-{self._mode} | {state} | outages: {self.outages} | "
            f"pending settles: {len(self._pending)}]>"
        )

    @property
    def degraded(self) -> bool:
        """True while Redis is considered down (fail-open: decisions are local)."""
        return self._degraded

    @property
    def local(self) -> MemoryQuotaStore:
        return self._local

    async def reserve(self, request: QuotaRequest) -> Decision:
        if self._degraded and self._mode == "open":
            return await self._reserve_locally(request)
        try:
            return await self._primary.reserve(request)
        except QuotaUnavailable as exc:
            self._enter_outage(exc)
            if self._mode == "closed":
                raise
        return await self._reserve_locally(request)

    async def _reserve_locally(self, request: QuotaRequest) -> Decision:
        """Fail-open admission; without ``ratelimit``: the local figures are this process's
        share of the limits, and a client told them would pace itself on wrong numbers."""
        decision = await self._local.reserve(self._local_request(request))
        if decision.ratelimit is None:
            return decision
        return msgspec.structs.replace(decision, ratelimit=None)

    async def renew(self, reservation: Reservation) -> bool:
        if reservation.origin == "memory":
            return await self._local.renew(reservation)
        try:
            return await self._primary.renew(reservation)
        except QuotaUnavailable as exc:
            self._enter_outage(exc)
            return False

    async def settle(
        self, reservation: Reservation, actual_tokens: int, actual_cost: int | None = None
    ) -> bool:
        """Settle where the reservation was made; during an outage queue it for replay.

        Returns True for a queued settle: it will be applied once when Redis answers.
        """
        if reservation.origin == "memory":
            return await self._local.settle(reservation, actual_tokens, actual_cost)
        try:
            return await self._primary.settle(reservation, actual_tokens, actual_cost)
        except QuotaUnavailable as exc:
            self._enter_outage(exc)
            if len(self._pending) == self._pending.maxlen:
                log.error("quota: settle queue full, dropping %s", self._pending[0][0].request_id)
            self._pending.append((reservation, actual_tokens, actual_cost))
            return True

    async def usage(self, tenant: str, scope: str, partition: Partition | None = None) -> Usage:
        if self._degraded and self._mode == "open":
            return await self._local.usage(tenant, scope, partition)
        return await self._primary.usage(tenant, scope, partition)

    async def alerted(self, tenant: str, scope: str,
                      partition: Partition | None = None) -> Alerted:
        """The shared store's marks: the local counters alert nobody."""
        return await self._primary.alerted(tenant, scope, partition)

    async def alerted_many(self, scopes: Sequence[tuple[str, str, Partition | None]]
                           ) -> list[Alerted]:
        return await self._primary.alerted_many(scopes)

    async def ping(self) -> None:
        await self._primary.ping()

    async def aclose(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        await self._primary.aclose()

    # -- outage bookkeeping ---------------------------------------------------------------

    def _local_request(self, request: QuotaRequest) -> QuotaRequest:
        scopes = tuple(
            dataclasses.replace(s, limits=self._local_limits(s.limits)) for s in request.scopes
        )
        return QuotaRequest(
            request_id=request.request_id,
            tenant=request.tenant,
            scopes=scopes,
            estimated_tokens=request.estimated_tokens,
            key_id=request.key_id,
            model=request.model,
            lease_ttl=request.lease_ttl,
            estimated_cost=request.estimated_cost,
            refusal_alerts=request.refusal_alerts,
        )

    def _local_limits(self, limits: Limits) -> Limits:
        scaled = self._scaled.get(limits)
        if scaled is None:
            if len(self._scaled) > 10_000:
                self._scaled.clear()
            scaled = self._scaled[limits] = limits.scaled(self._share)
        return scaled

    def _enter_outage(self, exc: QuotaUnavailable) -> None:
        if self._degraded:
            return
        self._degraded = True
        self.outages += 1
        log.warning("quota: Redis unavailable (%s); fail-%s", exc.__cause__ or exc, self._mode)
        self._notify(True)
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Ping Redis with growing pauses until it answers, then switch back."""
        delay = self._probe_interval
        while True:
            await asyncio.sleep(delay)
            try:
                await self._primary.ping()
            except QuotaUnavailable:
                delay = min(delay * 2, self._probe_max_interval)
                continue
            await self._leave_outage()
            return

    async def _leave_outage(self) -> None:
        self._degraded = False
        log.warning("quota: Redis answers again; %d settles to replay", len(self._pending))
        self._notify(False)
        while self._pending:
            reservation, tokens, cost = self._pending[0]
            try:
                await self._primary.settle(reservation, tokens, cost)
            except QuotaUnavailable as exc:
                self._probe_task = None  # let _enter_outage start a new probe
                self._enter_outage(exc)
                return
            self._pending.popleft()

    def _notify(self, degraded: bool) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(degraded)
        except Exception:  # a broken hook must not break admission
            log.exception("quota: on_change hook failed")
