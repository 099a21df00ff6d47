"""The in-process quota store: the same semantics as the Redis store, for one process.

Used when no Redis URL is configured (demo, small installs) and, with each limit scaled to the
process's share, as the fail-open fallback of ``FailoverQuotaStore``. Everything runs on the
event loop thread with no ``await`` between check and reserve, so each step is atomic.
Counters are kept per (owner, scope name), the owner being the tenant or the organization
(``Partition.tag``), as the Redis store's hash tags are; budget alerts are deduplicated here,
per process (``alerts.py``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.quota.alerts import BudgetAlert, due, emit, make_alert
from gateway.quota.base import (
    WINDOW,
    Alerted,
    Decision,
    QuotaStore,
    RateLimitState,
    Reservation,
    Usage,
    partition_of,
)
from gateway.quota.limits import period_ids, seconds_to_next_day, seconds_to_next_month

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.quota.alerts import AlertSink, Kind
    from gateway.quota.base import QuotaRequest
    from gateway.quota.limits import LimitName, Limits, Partition, Scope

__all__ = ["RECORD_TTL", "MemoryQuotaStore"]

RECORD_TTL = 3600.0
"""Seconds a reservation stays settleable without renew; past it settle is a no-op."""

CONCURRENCY_RETRY_HINT = 1.0
"""Cap of ``retry_after`` for concurrency: requests usually end well before their lease expires."""

RETRY_SCAN = 100
"""Window entries scanned to compute a tpm ``retry_after``; beyond it the hint is a lower bound."""

_SWEEP_EVERY = 4096


@dataclass(slots=True)
class _ScopeState:
    """Counters of one scope; each structure is used only when its limit is set."""

    rpm_log: deque[tuple[float, str]] = field(default_factory=deque)
    tpm_log: deque[tuple[float, str]] = field(default_factory=deque)
    tpm_tokens: dict[str, int] = field(default_factory=dict)
    tpm_total: int = 0
    leases: dict[str, float] = field(default_factory=dict)
    days: dict[int, int] = field(default_factory=dict)
    months: dict[int, int] = field(default_factory=dict)
    #: thresholds that alerted: ("day" | "month", period id, percent)
    alerted: set[tuple[str, int, int]] = field(default_factory=set)

    def prune(self, now: float, window: float) -> None:
        """Drop window entries that are ``window`` seconds old (amortised O(1) per request)."""
        cutoff = now - window
        while self.rpm_log and self.rpm_log[0][0] <= cutoff:
            self.rpm_log.popleft()
        while self.tpm_log and self.tpm_log[0][0] <= cutoff:
            _, rid = self.tpm_log.popleft()
            self.tpm_total -= self.tpm_tokens.pop(rid, 0)

    def prune_leases(self, now: float) -> None:
        for rid in [rid for rid, expiry in self.leases.items() if expiry <= now]:
            del self.leases[rid]

    @property
    def empty(self) -> bool:
        return not (self.rpm_log or self.tpm_log or self.leases or self.days or self.months
                    or self.alerted)


def _reset(limit: int | None, log: deque[tuple[float, str]] | None, now: float,
           window: float) -> float:
    """Seconds until the oldest entry of ``log`` leaves the window: 0 for an empty window or
    an unset limit, the whole window for a limit of 0 (it never frees)."""
    if limit == 0:
        return window
    if limit is None or not log:
        return 0.0
    return max(0.0, log[0][0] + window - now)


@dataclass(slots=True)
class _Record:
    reservation: Reservation
    day: int
    month: int
    expires: float


def _owner(tenant: str, partition: Partition | None) -> str:
    """Whose counters: the tenant's, or its organization's (the Redis store's hash tag)."""
    return tenant if partition is None else partition.tag


class MemoryQuotaStore(QuotaStore):
    """Exact limits for a single process, without Redis.

    Args:
        clock: epoch seconds; injected by tests.
        window: length of the rolling rpm/tpm window (60 s; shorter in tests).
        record_ttl: how long an unrenewed reservation stays settleable.
        alerts: where budget threshold alerts go (``alerts.py``); None: nowhere.
    """

    __slots__ = ("_alerts", "_clock", "_ops", "_record_ttl", "_records", "_scopes", "_window")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        window: float = WINDOW,
        record_ttl: float = RECORD_TTL,
        alerts: AlertSink | None = None,
    ) -> None:
        self._clock = clock
        self._window = window
        self._record_ttl = record_ttl
        self._alerts = alerts
        self._scopes: dict[tuple[str, str], _ScopeState] = {}
        self._records: dict[tuple[str, str], _Record] = {}
        self._ops = 0

    def __repr__(self) -> str:
        scopes, records = len(self._scopes), len(self._records)
        return f"<MemoryQuotaStore [Scopes: {scopes} | Reservations: {records}]>"

    async def reserve(self, request: QuotaRequest) -> Decision:
        now = self._clock()
        self._maybe_sweep(now)
        existing = self._records.get((request.tenant, request.request_id))
        if existing is not None and existing.expires > now:
            return Decision(admitted=True, reservation=existing.reservation)
        owner = _owner(request.tenant, partition_of(request.scopes))
        states = [self._state(owner, s.name) for s in request.scopes]
        day, month = period_ids(now, request.scopes[0].timezone) if request.scopes else (0, 0)
        worst = self._check(request, states, now, day, month)
        if worst is not None:  # nothing reserved: the figures as they stand
            return Decision(admitted=False, scope=worst[1], limit=worst[2],
                            retry_after=worst[0],
                            ratelimit=self._ratelimit(request.scopes, states, now))
        reservation = self._apply(request, states, now, day, month)
        return Decision(admitted=True, reservation=reservation,
                        ratelimit=self._ratelimit(request.scopes, states, now))

    async def renew(self, reservation: Reservation) -> bool:
        now = self._clock()
        record = self._records.get((reservation.tenant, reservation.request_id))
        if record is None or record.expires <= now:
            return False
        record.expires = now + max(self._record_ttl, 2 * reservation.lease_ttl)
        held = True
        owner = _owner(reservation.tenant, partition_of(reservation.scopes))
        for scope in reservation.scopes:
            if scope.limits.concurrency is None:
                continue
            leases = self._state(owner, scope.name).leases
            if leases.get(reservation.request_id, 0.0) > now:
                leases[reservation.request_id] = now + reservation.lease_ttl
            else:
                leases.pop(reservation.request_id, None)
                held = False
        return held

    async def settle(
        self, reservation: Reservation, actual_tokens: int, actual_cost: int | None = None
    ) -> bool:
        now = self._clock()
        record = self._records.pop((reservation.tenant, reservation.request_id), None)
        if record is None or record.expires <= now:
            return False
        delta = max(0, actual_tokens) - record.reservation.estimated_tokens
        delta_cost = (
            0 if actual_cost is None else max(0, actual_cost) - record.reservation.estimated_cost
        )
        rid = reservation.request_id
        scopes = record.reservation.scopes
        owner = _owner(reservation.tenant, partition_of(scopes))
        fired: list[BudgetAlert] = []
        for scope in scopes:
            state = self._state(owner, scope.name)
            d = delta_cost if scope.unit == "cost" else delta
            self._settle_scope(state, scope.limits, record, rid, d, now)
            if scope.alerts is not None:
                if scope.limits.tokens_per_day is not None and record.day in state.days:
                    self._alert(fired, scope, state, reservation.tenant, "day", record.day,
                                False, now)
                if scope.limits.tokens_per_month is not None and record.month in state.months:
                    self._alert(fired, scope, state, reservation.tenant, "month", record.month,
                                False, now)
        emit(self._alerts, fired)
        return True

    async def usage(self, tenant: str, scope: str, partition: Partition | None = None) -> Usage:
        now = self._clock()
        state = self._scopes.get((_owner(tenant, partition), scope))
        if state is None:
            return Usage()
        state.prune(now, self._window)
        day, month = period_ids(now, "UTC" if partition is None else partition.timezone)
        return Usage(
            requests=len(state.rpm_log),
            tokens=state.tpm_total,
            in_flight=sum(1 for expiry in state.leases.values() if expiry > now),
            tokens_today=state.days.get(day, 0),
            tokens_this_month=state.months.get(month, 0),
        )

    async def alerted(self, tenant: str, scope: str,
                      partition: Partition | None = None) -> Alerted:
        state = self._scopes.get((_owner(tenant, partition), scope))
        if state is None or not state.alerted:
            return Alerted()
        day, month = period_ids(self._clock(), "UTC" if partition is None else partition.timezone)
        return Alerted(
            day=tuple(sorted(t for kind, p, t in state.alerted if kind == "day" and p == day)),
            month=tuple(sorted(t for kind, p, t in state.alerted
                               if kind == "month" and p == month)))

    # -- the steps ------------------------------------------------------------------------

    def _state(self, tenant: str, scope: str) -> _ScopeState:
        state = self._scopes.get((tenant, scope))
        if state is None:
            state = self._scopes[(tenant, scope)] = _ScopeState()
        return state

    def _check(
        self, request: QuotaRequest, states: list[_ScopeState], now: float, day: int, month: int
    ) -> tuple[float, str, LimitName] | None:
        """The failing limit with the longest wait (seconds, scope, limit), or None if all pass.

        Prunes every scope's window on the way, which ``_ratelimit`` relies on. A budget that
        refuses in a watched scope reaches its 100 % alert (``alerts.py``)."""
        worst: tuple[float, str, LimitName] | None = None
        refused: list[BudgetAlert] = []
        for scope, state in zip(request.scopes, states, strict=True):
            state.prune(now, self._window)
            failures = self._failures(scope, state, request, now, day, month)
            for name, wait in failures:
                if worst is None or wait > worst[0]:
                    worst = (wait, scope.name, name)
                if scope.alerts is None or not request.refusal_alerts:
                    continue
                if name == "tokens_per_day":
                    self._alert(refused, scope, state, request.tenant, "day", day, True, now)
                elif name == "tokens_per_month":
                    self._alert(refused, scope, state, request.tenant, "month", month, True, now)
        emit(self._alerts, refused)
        return worst

    def _alert(self, out: list[BudgetAlert], scope: Scope, state: _ScopeState, tenant: str,
               kind: Kind, period: int, refused: bool, now: float) -> None:
        """Add the thresholds of one budget that are reached and have not alerted yet."""
        assert scope.alerts is not None
        limits = scope.limits
        limit = limits.tokens_per_day if kind == "day" else limits.tokens_per_month
        if limit is None:
            return
        used = (state.days if kind == "day" else state.months).get(period, 0)
        for threshold in due(scope.alerts.thresholds, used, limit, refused):
            mark = (kind, period, threshold)
            if mark not in state.alerted:
                state.alerted.add(mark)
                out.append(make_alert(scope, tenant, kind, period, threshold, used,
                                      "refusal" if refused else "usage", now))

    def _failures(
        self,
        scope: Scope,
        state: _ScopeState,
        request: QuotaRequest,
        now: float,
        day: int,
        month: int,
    ) -> list[tuple[LimitName, float]]:
        """Each failing limit of one scope with the seconds until it would pass."""
        limits = scope.limits
        est = request.estimated_cost if scope.unit == "cost" else request.estimated_tokens
        out: list[tuple[LimitName, float]] = []
        if limits.rpm is not None and len(state.rpm_log) >= limits.rpm:
            out.append(("rpm", self._rpm_wait(state, limits.rpm, now)))
        if limits.tpm is not None and state.tpm_total + est > limits.tpm:
            out.append(("tpm", self._tpm_wait(state, limits.tpm, est, now)))
        if limits.concurrency is not None and len(state.leases) >= limits.concurrency:
            state.prune_leases(now)
            if len(state.leases) >= limits.concurrency:
                first = min(state.leases.values(), default=now + CONCURRENCY_RETRY_HINT)
                out.append(("concurrency", min(first - now, CONCURRENCY_RETRY_HINT)))
        if limits.tokens_per_day is not None and (
            state.days.get(day, 0) + est > limits.tokens_per_day
        ):
            out.append(("tokens_per_day", seconds_to_next_day(now, scope.timezone)))
        if limits.tokens_per_month is not None and (
            state.months.get(month, 0) + est > limits.tokens_per_month
        ):
            out.append(("tokens_per_month", seconds_to_next_month(now, scope.timezone)))
        return out

    def _ratelimit(
        self, scopes: tuple[Scope, ...], states: list[_ScopeState], now: float
    ) -> RateLimitState | None:
        """The x-ratelimit figures of the tightest scopes (see ``RateLimitState``), from
        windows already pruned: fewest left wins, the first scope on a tie, as in Lua.
        Every admitted request runs this: plain locals, one pass, no helper per scope."""
        rpm: int | None = None
        tpm: int | None = None
        rpm_left = tpm_left = 0
        rpm_log: deque[tuple[float, str]] | None = None
        tpm_log: deque[tuple[float, str]] | None = None
        for scope, state in zip(scopes, states, strict=True):
            limits = scope.limits
            if limits.rpm is not None:
                left = limits.rpm - len(state.rpm_log)
                if rpm is None or left < rpm_left:
                    rpm, rpm_left, rpm_log = limits.rpm, left, state.rpm_log
            if limits.tpm is not None and scope.unit == "tokens":
                left = limits.tpm - state.tpm_total
                if tpm is None or left < tpm_left:
                    tpm, tpm_left, tpm_log = limits.tpm, left, state.tpm_log
        if rpm is None and tpm is None:
            return None
        window = self._window
        return RateLimitState(
            limit_requests=rpm,
            remaining_requests=max(0, rpm_left),
            reset_requests_s=_reset(rpm, rpm_log, now, window),
            limit_tokens=tpm,
            remaining_tokens=max(0, tpm_left),
            reset_tokens_s=_reset(tpm, tpm_log, now, window),
        )

    def _rpm_wait(self, state: _ScopeState, rpm: int, now: float) -> float:
        """When enough admissions leave the window for one more to fit."""
        if rpm == 0:
            return self._window
        t = state.rpm_log[len(state.rpm_log) - rpm][0]
        return t + self._window - now

    def _tpm_wait(self, state: _ScopeState, tpm: int, est: int, now: float) -> float:
        """When enough tokens leave the window for ``est`` more to fit (bounded scan)."""
        if est > tpm or not state.tpm_log:
            return self._window
        need = state.tpm_total + est - tpm
        at = now
        for i, (t, rid) in enumerate(state.tpm_log):
            need -= state.tpm_tokens.get(rid, 0)
            at = t
            if need <= 0 or i + 1 >= RETRY_SCAN:
                break
        return at + self._window - now

    def _apply(self, request: QuotaRequest, states: list[_ScopeState], now: float, day: int,
               month: int) -> Reservation:
        rid = request.request_id
        for scope, state in zip(request.scopes, states, strict=True):
            limits = scope.limits
            est = request.estimated_cost if scope.unit == "cost" else request.estimated_tokens
            if limits.rpm is not None:
                state.rpm_log.append((now, rid))
            if limits.tpm is not None:
                state.tpm_log.append((now, rid))
                state.tpm_tokens[rid] = est
                state.tpm_total += est
            if limits.concurrency is not None:
                state.leases[rid] = now + request.lease_ttl
            if limits.tokens_per_day is not None:
                state.days[day] = state.days.get(day, 0) + est
            if limits.tokens_per_month is not None:
                state.months[month] = state.months.get(month, 0) + est
        reservation = Reservation(
            request_id=rid,
            tenant=request.tenant,
            scopes=request.scopes,
            estimated_tokens=request.estimated_tokens,
            lease_ttl=request.lease_ttl,
            expires_at=now + request.lease_ttl,
            origin="memory",
            estimated_cost=request.estimated_cost,
        )
        expires = now + max(self._record_ttl, 2 * request.lease_ttl)
        self._records[(request.tenant, rid)] = _Record(reservation, day, month, expires)
        return reservation

    def _settle_scope(
        self, state: _ScopeState, limits: Limits, record: _Record, rid: str, delta: int, now: float
    ) -> None:
        state.leases.pop(rid, None)
        if limits.tpm is not None:
            state.prune(now, self._window)
            if rid in state.tpm_tokens:
                state.tpm_tokens[rid] += delta
                state.tpm_total += delta
            elif delta > 0:  # the estimate already left the window: charge the overshoot now
                state.tpm_log.append((now, rid))
                state.tpm_tokens[rid] = delta
                state.tpm_total += delta
        if limits.tokens_per_day is not None and record.day in state.days:
            state.days[record.day] += delta
        if limits.tokens_per_month is not None and record.month in state.months:
            state.months[record.month] += delta

    def _maybe_sweep(self, now: float) -> None:
        """Every few thousand calls forget expired records, old periods and idle scopes."""
        self._ops += 1
        if self._ops % _SWEEP_EVERY:
            return
        for k in [k for k, r in self._records.items() if r.expires <= now]:
            del self._records[k]
        # a zone's local day is within a day of UTC's: keep UTC's yesterday, today, tomorrow
        # (and the months around them), whatever the scope's zone
        days = {period_ids(now + shift)[0] for shift in (-86400, 0, 86400)}
        month = period_ids(now)[1]
        months = {d // 100 for d in days} | {
            month - 1 if month % 100 != 1 else month - 89}  # Jan -> Dec of last year
        for key, state in list(self._scopes.items()):
            state.prune(now, self._window)
            state.prune_leases(now)
            for d in [d for d in state.days if d not in days]:
                del state.days[d]
            for m in [m for m in state.months if m not in months]:
                del state.months[m]
            state.alerted = {a for a in state.alerted
                             if a[1] in (days if a[0] == "day" else months)}
            if state.empty:
                del self._scopes[key]
