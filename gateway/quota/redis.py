"""The Redis quota store: exact limits shared by every replica, one round trip per step.

``reserve``, ``renew`` and ``settle`` each run one Lua script (``scripts.py``) with one
``EVALSHA``; the scripts are hashed once here, loaded together at the first call and again
on a ``NOSCRIPT`` (after a Redis restart). The client is any ``gateway.redis.RedisLike`` (the
pipelined client on one node, redis-py for TLS, unix sockets and Cluster; ``from_url`` builds
it with ``gateway.redis.open_redis``); every command goes to it in RESP, its fixed parts encoded
once (``_Parts``). All keys of a call share one hash tag (the tenant's, or its organization's:
``keys.py``), so they live in one slot. Budget alerts that a settle or a refusal fires come
back in the same reply and go to the store's sink (``alerts.py``).

Failure handling: every call is bounded by ``deadline`` (with redis-py's own retries switched
off by the factory), and after a failure the store backs off (``gateway.timers.backoff``)
and raises ``QuotaBackingOff`` at once instead of waiting on a dead server. Every Redis failure
leaves as a ``QuotaError`` (``map_redis_error``, the shared mapping of ``gateway/redis/errors.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from gateway.quota.alerts import BudgetAlert, emit, make_alert
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
from gateway.quota.errors import (
    QuotaBackingOff,
    QuotaConnectError,
    QuotaError,
    QuotaStoreError,
    QuotaTimeout,
)
from gateway.quota.keys import record_key, record_prefix, scope_key
from gateway.quota.limits import LIMIT_NAMES, calendar_candidates, day_period, period_ids
from gateway.quota.memory import RECORD_TTL
from gateway.quota.scripts import RENEW, RESERVE, SETTLE, USAGE
from gateway.redis.client import Timeouts, open_redis
from gateway.redis.encoding import BULK, array_head, bulk, encode_command
from gateway.redis.errors import FAILURES, ErrorMap, is_no_script, is_outage
from gateway.timers.backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gateway.quota.alerts import AlertSink
    from gateway.quota.base import QuotaRequest
    from gateway.quota.limits import Partition, Scope
    from gateway.redis.base import RedisLike

__all__ = ["RedisQuotaStore", "map_redis_error"]

#: the quota error for a Redis failure (timeout, connect, refused: ``gateway/redis/errors.py``)
map_redis_error: ErrorMap[QuotaError] = ErrorMap(
    timeout=QuotaTimeout, connect=QuotaConnectError, refused=QuotaStoreError)

#: a reserve or settle: head, record key, scope keys, request id, first, middle, last, tail
_COMMAND = b"%b" + BULK + b"%b" + BULK + BULK + b"%b" + BULK + b"%b"
#: ``calendar`` of a UTC partition: the script's own arithmetic
_UTC_CALENDAR = bulk("")


@dataclass(frozen=True, slots=True)
class _Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> _Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


@dataclass(frozen=True, slots=True)
class _Parts:
    """The RESP of what a (tenant, scopes, lease) sends on every reserve and settle: the
    commands' heads, the scope keys and the limits. Encoding them per request was ~5 µs of
    the event loop per request; ``tests/quota/test_redis_encoding.py`` checks the assembled
    commands equal the generic encoding byte for byte."""

    scopes: tuple[Scope, ...]
    record: str
    keys: bytes
    reserve_head: bytes
    reserve_limits: bytes
    settle_head: bytes
    window: bytes
    settle_tail: bytes
    #: the reserve's ``thresholds`` argument: the scopes' own, and only commas (no alerts)
    alerting: bytes
    silent: bytes

    @classmethod
    def build(cls, store: RedisQuotaStore, tenant: str, scopes: tuple[Scope, ...],
              lease_ttl: float) -> _Parts:
        nkeys = 1 + len(scopes)
        partition = partition_of(scopes)
        keys = b"".join(bulk(scope_key(tenant, s.name, partition)) for s in scopes)

        def head(script: _Script, nargs: int) -> bytes:
            return (array_head(3 + nkeys + nargs) + bulk("EVALSHA") + bulk(script.sha)
                    + bulk(nkeys))

        limits = b"".join(bulk(v) for v in (round(lease_ttl * 1e6), store._window_us,
                                              store._record_ttl_ms(lease_ttl), _wire(scopes)))
        return cls(scopes, record_prefix(tenant, partition), keys, head(store._reserve, 9),
                   limits, head(store._settle, 6), bulk(store._window_us),
                   bulk(_wire(scopes)) + bulk(_thresholds(scopes)),
                   bulk(_thresholds(scopes)), bulk("," * len(scopes)))

    def command(self, head: bytes, request_id: str, first: int, middle: bytes, last: int,
                tail: bytes) -> bytes:
        """``head``, the request's record key, the scope keys, then the arguments: the request
        id, ``first``, the cached ``middle``, ``last`` and the encoded ``tail`` (the shape
        reserve and settle share)."""
        record = f"{self.record}{request_id}".encode()
        rid = request_id.encode()
        one, two = b"%d" % first, b"%d" % last
        return _COMMAND % (head, len(record), record, self.keys, len(rid), rid, len(one), one,
                           middle, len(two), two, tail)


@lru_cache(maxsize=4096)
def _wire(scopes: tuple[Scope, ...]) -> str:
    """The limits of all scopes as one script argument: ``r,t,c,d,m,u,`` per scope, -1 = unset,
    ``u`` the scope's unit (0 tokens, 1 cost).

    One argument rather than five per scope: encoding arguments is most of redis-py's cost.
    """
    return "".join(
        "".join(f"{-1 if v is None else v}," for v in s.limits.values())
        + ("1," if s.unit == "cost" else "0,")
        for s in scopes
    )


@lru_cache(maxsize=4096)
def _thresholds(scopes: tuple[Scope, ...]) -> str:
    """The alert thresholds of all scopes as one script argument: ``50.80.100,`` per scope
    that alerts on a day or month budget, ``,`` per other scope."""
    out = []
    for s in scopes:
        rule, lim = s.alerts, s.limits
        watched = rule is not None and (lim.tokens_per_day is not None
                                        or lim.tokens_per_month is not None)
        out.append(".".join(map(str, rule.thresholds)) + "," if watched and rule else ",")
    return "".join(out)


def _calendar_text(partition: Partition | None, now: float) -> str:
    """The ``calendar`` argument (``scripts.py``): empty for UTC, else the local days and
    months around ``now`` as ``id,start_us,end_us,`` each."""
    if partition is None or partition.timezone == "UTC":
        return ""
    days, months = calendar_candidates(now, partition.timezone)
    return "".join(f"{p.id},{round(p.start * 1e6)},{round(p.end * 1e6)},"
                   for p in (*days, *months))


class _Calendars:
    """The ``calendar`` argument per time zone (``scripts.py``), encoded once per local day."""

    __slots__ = ("_clock", "_made")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._made: dict[str, tuple[float, float, bytes]] = {}

    def of(self, partition: Partition | None) -> bytes:
        if partition is None or partition.timezone == "UTC":
            return _UTC_CALENDAR
        now = self._clock()
        made = self._made.get(partition.timezone)
        if made is not None and made[0] <= now < made[1]:
            return made[2]
        day = day_period(now, partition.timezone)
        encoded = bulk(_calendar_text(partition, now))
        self._made[partition.timezone] = (day.start, day.end, encoded)
        return encoded


def _ratelimit(reply: list[int], at: int) -> RateLimitState | None:
    """The x-ratelimit figures at ``reply[at:at + 6]`` (``scripts.py``: limit -1 = unset;
    resets in microseconds); None when no scope sets rpm or a token tpm."""
    requests, tokens = reply[at], reply[at + 3]
    if requests < 0 and tokens < 0:
        return None
    return RateLimitState(
        limit_requests=requests if requests >= 0 else None,
        remaining_requests=reply[at + 1],
        reset_requests_s=reply[at + 2] / 1e6,
        limit_tokens=tokens if tokens >= 0 else None,
        remaining_tokens=reply[at + 4],
        reset_tokens_s=reply[at + 5] / 1e6,
    )


class RedisQuotaStore(QuotaStore):
    """Quota counters in Redis (or Redis Cluster), exact across processes and replicas.

    Args:
        client: any Redis client of ``gateway.redis`` (``open_redis``: bounded timeouts, no
            hidden retries); ``from_url`` builds one.
        deadline: upper bound of one call, seconds, whatever the client does.
        window: rolling window of rpm/tpm in seconds (60; shorter in tests).
        record_ttl: how long an unrenewed reservation stays settleable.
        backoff: pause policy after failures.
        owns_client: close the client in ``aclose``.
        alerts: where budget threshold alerts go (``alerts.py``); None: nowhere.
    """

    __slots__ = (
        "_alerts",
        "_backoff",
        "_calendars",
        "_client",
        "_deadline",
        "_owns_client",
        "_record_ttl",
        "_renew",
        "_reserve",
        "_settle",
        "_usage",
        "_window",
        "_window_us",
    )

    def __init__(
        self,
        client: RedisLike,
        *,
        deadline: float = 0.25,
        window: float = WINDOW,
        record_ttl: float = RECORD_TTL,
        backoff: Backoff | None = None,
        owns_client: bool = False,
        alerts: AlertSink | None = None,
    ) -> None:
        self._client = client
        self._alerts = alerts
        self._calendars = _Calendars(time.time)
        self._deadline = deadline
        self._window = window
        self._window_us = round(window * 1e6)
        self._record_ttl = record_ttl
        self._backoff = backoff or Backoff()
        self._owns_client = owns_client
        self._parts: dict[tuple[str, int, float], _Parts] = {}
        self._scripts_loaded = False
        self._reserve = _Script.of(RESERVE)
        self._settle = _Script.of(SETTLE)
        self._renew = _Script.of(RENEW)
        self._usage = _Script.of(USAGE)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        timeout: float = 0.25,
        connect_timeout: float = 0.2,
        socket_timeout: float | None = None,
        max_connections: int = 256,
        pipelined: bool = True,
        **kwargs: Any,
    ) -> RedisQuotaStore:
        """A store with its own client: bounded calls, no retries inside a call.

        Args:
            timeout: bound of one whole call (connect + EVALSHA, + SCRIPT LOAD after a
                restart); becomes the store's ``deadline``.
            connect_timeout: the socket connect timeout.
            socket_timeout: redis-py's per-read/write timeout. Off by default: ``timeout``
                already bounds the call, and redis-py implements this one with a task per
                write (``asyncio.wait_for``), a fifth of the client's CPU per call.
            pipelined: talk to a single node (``redis://``) with the lean auto-pipelining
                client (``gateway/redis/pipelined.py``); Cluster, TLS and unix sockets always
                use redis-py.
            kwargs: passed to the store.

        redis-py's default retries would multiply the wait on a dead server; the store's
        back-off replaces them. A cancelled call drops its connection (redis-py does that), so
        a late reply can never be read by the next caller.
        """
        client = open_redis(url, cluster=cluster, pipelined=pipelined,
                            timeouts=Timeouts(connect=min(connect_timeout, timeout),
                                              socket=socket_timeout),
                            max_connections=max_connections)
        kwargs.setdefault("deadline", timeout)
        return cls(client, owns_client=True, **kwargs)

    def __repr__(self) -> str:
        return f"<RedisQuotaStore [{self._client.kind} | {self._backoff!r}]>"

    @property
    def client(self) -> RedisLike:
        return self._client

    # -- the steps ------------------------------------------------------------------------

    def _reserve_args(self, request: QuotaRequest) -> tuple[list[str], list[Any]]:
        """The reserve's keys and arguments (the tests' reference for ``_reserve_encoded``)."""
        keys = self._keys(request.tenant, request.request_id, request.scopes)
        calendar = _calendar_text(partition_of(request.scopes), time.time())
        thresholds = (_thresholds(request.scopes) if request.refusal_alerts
                      else "," * len(request.scopes))
        return keys, [request.request_id, request.estimated_tokens,
                      round(request.lease_ttl * 1e6), self._window_us,
                      self._record_ttl_ms(request.lease_ttl), _wire(request.scopes),
                      request.estimated_cost, thresholds, calendar]

    def _settle_args(self, reservation: Reservation, tokens: int, cost: int
                     ) -> tuple[list[str], list[Any]]:
        """The settle's keys and arguments (the tests' reference for ``_settle_encoded``)."""
        keys = self._keys(reservation.tenant, reservation.request_id, reservation.scopes)
        return keys, [reservation.request_id, tokens, self._window_us, cost,
                      _wire(reservation.scopes), _thresholds(reservation.scopes)]

    def _reserve_encoded(self, request: QuotaRequest) -> bytes:
        """The reserve's EVALSHA in RESP, from the cached parts of its tenant and scopes."""
        parts = self._parts_of(request.tenant, request.scopes, request.lease_ttl)
        return parts.command(parts.reserve_head, request.request_id, request.estimated_tokens,
                             parts.reserve_limits, request.estimated_cost,
                             (parts.alerting if request.refusal_alerts else parts.silent)
                             + self._calendars.of(partition_of(request.scopes)))

    def _settle_encoded(self, reservation: Reservation, tokens: int, cost: int) -> bytes:
        parts = self._parts_of(reservation.tenant, reservation.scopes, reservation.lease_ttl)
        return parts.command(parts.settle_head, reservation.request_id, tokens, parts.window,
                             cost, parts.settle_tail)

    def _parts_of(self, tenant: str, scopes: tuple[Scope, ...], lease_ttl: float) -> _Parts:
        cached = self._parts.get((tenant, id(scopes), lease_ttl))
        if cached is not None and cached.scopes is scopes:
            return cached
        if len(self._parts) >= 4096:
            self._parts.clear()
        parts = self._parts[tenant, id(scopes), lease_ttl] = _Parts.build(
            self, tenant, scopes, lease_ttl)
        return parts

    async def reserve(self, request: QuotaRequest) -> Decision:
        scopes = request.scopes
        reply = await self._run(self._reserve, self._reserve_encoded(request))
        if reply[0] == 0:
            if len(reply) > 10:
                self._emit(request.tenant, scopes, reply, 10, "refusal")
            return Decision(
                admitted=False,
                scope=scopes[int(reply[1]) - 1].name,
                limit=LIMIT_NAMES[int(reply[2]) - 1],
                retry_after=max(0, int(reply[3])) / 1e6,
                ratelimit=_ratelimit(reply, 4),
            )
        reservation = Reservation(
            request_id=request.request_id,
            tenant=request.tenant,
            scopes=scopes,
            estimated_tokens=request.estimated_tokens,
            lease_ttl=request.lease_ttl,
            expires_at=int(reply[2]) / 1e6,
            origin="redis",
            estimated_cost=request.estimated_cost,
        )
        # a replay of a live reservation ({2, ...}) carries no figures
        return Decision(admitted=True, reservation=reservation,
                        ratelimit=_ratelimit(reply, 3) if reply[0] == 1 else None)

    async def renew(self, reservation: Reservation) -> bool:
        keys = self._keys(reservation.tenant, reservation.request_id, reservation.scopes)
        args = [
            reservation.request_id,
            round(reservation.lease_ttl * 1e6),
            self._record_ttl_ms(reservation.lease_ttl),
        ]
        return int(await self._run(self._renew, _evalsha(self._renew, keys, args))) == 1

    async def settle(
        self, reservation: Reservation, actual_tokens: int, actual_cost: int | None = None
    ) -> bool:
        cost = -1 if actual_cost is None else max(0, actual_cost)
        # nobody waits on a settle's reply: it may wait for a batch on the wire to share a
        # write, and a reserve never waits behind it (``urgent``, gateway/redis/pipelined.py)
        encoded = self._settle_encoded(reservation, max(0, actual_tokens), cost)
        reply = await self._run(self._settle, encoded, urgent=False)
        if not isinstance(reply, list):  # 0: settled before, or its record expired
            return False
        if len(reply) > 1:
            self._emit(reservation.tenant, reservation.scopes, reply, 1, "usage")
        return True

    def _emit(self, tenant: str, scopes: tuple[Scope, ...], reply: list[Any], at: int,
              trigger: Literal["usage", "refusal"]) -> None:
        """The alerts at ``reply[at:]`` (``scripts.py``: five numbers each) to the sink."""
        now = time.time()
        alerts: list[BudgetAlert] = []
        for j in range(at, len(reply) - 4, 5):
            index, code, period, threshold, used = (int(v) for v in reply[j:j + 5])
            kind: Literal["day", "month"] = "day" if code == 4 else "month"
            alerts.append(make_alert(scopes[index - 1], tenant, kind, period, threshold, used,
                                     trigger, now))
        emit(self._alerts, alerts)

    async def usage(self, tenant: str, scope: str, partition: Partition | None = None) -> Usage:
        key = scope_key(tenant, scope, partition)
        reply = await self._run(self._usage, _evalsha(
            self._usage, [key], [self._window_us, _calendar_text(partition, time.time())]))
        requests, tokens, in_flight, today, month = (int(v) for v in reply)
        return Usage(
            requests=requests,
            tokens=tokens,
            in_flight=in_flight,
            tokens_today=today,
            tokens_this_month=month,
        )

    async def alerted(self, tenant: str, scope: str,
                      partition: Partition | None = None) -> Alerted:
        """The fields of the day's and the month's ``:a`` hashes (``keys.py``), in one round
        trip; the periods of this process's clock (the scripts use the server's)."""
        (alerted,) = await self.alerted_many([(tenant, scope, partition)])
        return alerted

    async def alerted_many(self, scopes: Sequence[tuple[str, str, Partition | None]]
                           ) -> list[Alerted]:
        """Every scope's two ``:a`` hashes in one round trip (one pipelined batch)."""
        if not scopes:
            return []
        if not self._backoff.allow():
            raise QuotaBackingOff("Redis failed moments ago; backing off before the next try")
        now = time.time()
        commands: list[tuple[str, str]] = []
        for tenant, scope, partition in scopes:
            base = scope_key(tenant, scope, partition)
            day, month = period_ids(now, "UTC" if partition is None else partition.timezone)
            commands += [("HKEYS", f"{base}:d:{day}:a"), ("HKEYS", f"{base}:m:{month}:a")]
        try:
            async with asyncio.timeout(self._deadline):
                replies = await self._client.execute_many(commands)
        except FAILURES as exc:
            raise await self._translated(exc) from exc
        for reply in replies:
            if isinstance(reply, BaseException):
                raise map_redis_error(reply) from reply
        self._backoff.success()
        return [Alerted(day=tuple(sorted(int(t) for t in replies[i])),
                        month=tuple(sorted(int(t) for t in replies[i + 1])))
                for i in range(0, len(replies), 2)]

    async def ping(self) -> None:
        """Check Redis answers, ignoring the back-off; a success ends it."""
        try:
            async with asyncio.timeout(self._deadline):
                await self._client.execute_command("PING")
        except FAILURES as exc:
            self._backoff.failure()
            raise map_redis_error(exc) from exc
        if self._backoff.failing:
            # Idle pooled connections may still point at the dead server (a fail-open store
            # does not use them during an outage); without this each would fail once now.
            await self._drop_idle_connections()
        self._backoff.success()

    async def load_scripts(self) -> None:
        """Load the scripts now (at startup) rather than on the first ``NOSCRIPT``."""
        for script in (self._reserve, self._settle, self._renew, self._usage):
            try:
                async with asyncio.timeout(self._deadline):
                    await self._client.script_load(script.source)
            except FAILURES as exc:
                raise map_redis_error(exc) from exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    # -- one round trip -------------------------------------------------------------------

    def _keys(self, tenant: str, request_id: str, scopes: tuple[Scope, ...]) -> list[str]:
        partition = partition_of(scopes)
        return [record_key(tenant, request_id, partition),
                *(scope_key(tenant, s.name, partition) for s in scopes)]

    def _record_ttl_ms(self, lease_ttl: float) -> int:
        return round(max(self._record_ttl, 2 * lease_ttl) * 1000)

    async def _run(self, script: _Script, command: bytes, *, urgent: bool = True) -> Any:
        """Send one encoded EVALSHA (plus a load on ``NOSCRIPT``), bounded, errors translated.

        ``urgent=False`` lets the pipelined client hold the command behind a batch on the wire
        (up to ~1 ms) so it shares a ``write`` with others (settles: the response is already
        on its way); urgent calls (reserves) never wait behind such commands. The client bounds
        each call (the pipelined one on its coarse deadline wheel, without a timer per call).
        """
        if not self._backoff.allow():
            raise QuotaBackingOff("Redis failed moments ago; backing off before the next try")
        client = self._client
        try:
            if not self._scripts_loaded:
                await self._load_scripts()
            try:
                reply = await client.execute_encoded(command, urgent=urgent,
                                                     timeout=self._deadline)
            except FAILURES as exc:
                if not is_no_script(exc):
                    raise
                # Redis restarted (or a new Cluster node): load the script, send again
                async with asyncio.timeout(self._deadline):
                    await client.script_load(script.source)
                reply = await client.execute_encoded(command, timeout=self._deadline)
        except FAILURES as exc:
            raise await self._translated(exc) from exc
        self._backoff.success()
        return reply

    async def _load_scripts(self) -> None:
        """Load every script at the first call (one write on the pipelined client). Loading
        one only when its EVALSHA met ``NOSCRIPT`` costs that call two more round trips, and a
        settle delayed so could reach Redis after the next request's reserve (a slot the client
        just freed would still look taken); after a Redis restart that fallback still applies."""
        scripts = (self._reserve, self._settle, self._renew, self._usage)
        async with asyncio.timeout(self._deadline):  # once per process: a timer is fine
            await self._client.load_scripts(s.source for s in scripts)
        self._scripts_loaded = True

    async def _translated(self, exc: BaseException) -> QuotaError:
        """The quota error for a failed call; an outage also starts (or lengthens) the
        back-off, a script error (a bug, not an outage) does not."""
        if not is_outage(exc):
            return map_redis_error(exc)
        await self._fail()
        return map_redis_error(exc)

    async def _fail(self) -> None:
        """Start or lengthen the back-off; at the first failure drop the idle connections,
        which most likely died with the server."""
        if not self._backoff.failing:
            await self._drop_idle_connections()
        self._backoff.failure()

    async def _drop_idle_connections(self) -> None:
        await self._client.drop_idle()


def _evalsha(script: _Script, keys: list[str], args: list[Any]) -> bytes:
    """The generic encoding of a script call (the steps off the hot path)."""
    return encode_command(("EVALSHA", script.sha, len(keys), *keys, *args))
