"""The Redis ledger: records in per-tenant day streams, totals in hashes, the spool as fallback.

Each record is one ``EVALSHA`` of ``scripts.STORE_RECORD`` (dedupe by request id, ``XADD``,
``HINCRBY`` day and month totals, atomically); a flush sends a whole batch as one pipeline
(``batch_size`` records per round trip). The client is any ``gateway.redis.RedisLike`` (the
pipelined client on one node, redis-py for TLS, unix sockets and Cluster; ``from_url`` builds
it with ``gateway.redis.open_redis``): a record's keys share the tenant's hash tag
(``keys.py``); the cluster client splits a pipeline by node.

When Redis cannot be reached (refused, reset, no answer within ``deadline``), the batch goes
to the spool and the back-off keeps the next flushes from waiting on a dead server. A
background task replays the spool once Redis answers again, and once at start for whatever a
crashed process left. A batch that failed half-way is spooled whole: the records that did
reach Redis are dropped by the dedupe on replay, so nothing counts twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from datetime import date, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.ledger.aggregate import COUNTERS, counters_of, field_prefix
from gateway.ledger.base import Ledger, LedgerSettings
from gateway.ledger.errors import (
    LedgerConnectError,
    LedgerError,
    LedgerStoreError,
    LedgerTimeout,
)
from gateway.ledger.keys import (
    TENANTS_KEY,
    day_key,
    month_key,
    seen_key,
    stream_key,
    tenant_tag,
)
from gateway.ledger.record import decode_record, encode_record
from gateway.ledger.scripts import STORE_RECORD
from gateway.ledger.spool import Spool
from gateway.redis.client import Timeouts, open_redis
from gateway.redis.encoding import BULK, array_head, bulk
from gateway.redis.errors import FAILURES, ErrorMap, is_no_script, is_outage
from gateway.timers.backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from gateway.ledger.aggregate import Period
    from gateway.ledger.record import UsageRecord
    from gateway.redis.base import Command, RedisLike

__all__ = ["RedisLedger", "map_redis_error"]

log = logging.getLogger(__name__)

_DAY_MS = 86_400_000
_READ_CHUNK = 1000
#: pipelines in flight per flush
_IN_FLIGHT = 2


#: the ledger error for a Redis failure (timeout, connect, refused: ``gateway/redis/errors.py``)
map_redis_error: ErrorMap[LedgerError] = ErrorMap(
    timeout=LedgerTimeout, connect=LedgerConnectError, refused=LedgerStoreError)


@lru_cache(maxsize=4096)
def _tag(tenant: str) -> str:
    return tenant_tag(tenant)


_COUNTERS_FORMAT = b",".join([b"%d"] * len(COUNTERS))
#: a record's EVALSHA: head, seen key, the day's part, record, the group's part, counters
_RECORD_COMMAND = b"%b" + BULK + b"%b" + BULK + b"%b" + BULK


@lru_cache(maxsize=64)
def _month_end_ms(day_number: int) -> int:
    day = date(1970, 1, 1) + timedelta(days=day_number)
    first_next = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
    return (first_next - date(1970, 1, 1)).days * _DAY_MS


class RedisLedger(Ledger):
    """Usage records in Redis (or Redis Cluster), with a local spool for outages.

    Args:
        client: any Redis client of ``gateway.redis`` (``open_redis``: short timeouts, no
            hidden retries); ``from_url`` builds one.
        spool_dir: where records wait while Redis is away (one per host, local disk).
        settings: batching, retention and replay.
        deadline: bound of one pipeline round trip, seconds.
        owns_client: close the client in ``close``.
    """

    def __init__(
        self,
        client: RedisLike,
        *,
        spool_dir: str | os.PathLike[str],
        settings: LedgerSettings | None = None,
        deadline: float = 0.25,
        owns_client: bool = False,
    ) -> None:
        super().__init__(settings)
        s = self.settings
        self._client = client
        self._deadline = deadline
        self._owns_client = owns_client
        self._backoff = Backoff(maximum=2.0)
        self.spool = Spool(spool_dir, max_segment_bytes=s.spool_segment_bytes)
        self._sha = _sha1(STORE_RECORD)
        #: RESP of the command's fixed start: an array of 13 (EVALSHA, sha, 4, 4 keys, 6 args)
        self._head = array_head(13) + b"".join(bulk(a) for a in ("EVALSHA", self._sha, 4))
        self._day_parts: dict[tuple[str, str], tuple[str, bytes]] = {}
        self._group_parts: dict[tuple[str, str, str | None], bytes] = {}
        self._seen_ttl_ms = s.seen_ttl_days * _DAY_MS
        self._day_keep_ms = s.retention_days * _DAY_MS
        self._month_keep_ms = s.month_retention_days * _DAY_MS
        self._replayer: asyncio.Task[None] | None = None
        self._replay_lock = asyncio.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        spool_dir: str | os.PathLike[str],
        cluster: bool = False,
        timeout: float = 0.25,
        connect_timeout: float = 0.2,
        max_connections: int = 64,
        pipelined: bool = True,
        **kwargs: Any,
    ) -> RedisLedger:
        """A ledger with its own client: connect bounded by ``connect_timeout``, each round
        trip by ``timeout``, redis-py's retries off (the spool and back-off replace them);
        ``pipelined``: the lean client where it applies (``gateway.redis.open_redis``)."""
        client = open_redis(url, cluster=cluster, pipelined=pipelined,
                            timeouts=Timeouts(connect=min(connect_timeout, timeout)),
                            max_connections=max_connections)
        return cls(client, spool_dir=spool_dir, deadline=timeout, owns_client=True, **kwargs)

    def __repr__(self) -> str:
        st = self.stats
        return (
            f"<RedisLedger [{self._client.kind} | {self._backoff!r} | pending: {self.pending} | "
            f"stored: {st.stored} | spooled: {st.spooled} | replayed: {st.replayed}]>"
        )

    @property
    def client(self) -> RedisLike:
        return self._client

    # -- writing --------------------------------------------------------------------------

    async def _store(self, batch: list[UsageRecord]) -> None:
        if self._backoff.allow():
            try:
                await self._send(batch)
                return
            except LedgerError as exc:
                log.warning("ledger: Redis unavailable, spooling %d records: %s", len(batch), exc)
        await self.spool.append(batch)
        self.stats.spooled += len(batch)

    def _write_late(self, batch: list[UsageRecord]) -> None:
        self.spool.append_sync(batch)
        self.stats.spooled += len(batch)

    async def _send(self, records: list[UsageRecord]) -> int:
        """Store ``records`` in pipelines of ``batch_size``, up to ``_IN_FLIGHT`` at once (so
        this process encodes the next while Redis runs the last); returns how many were new.

        Raises ``LedgerUnavailable`` (after starting the back-off) if Redis is away; some
        chunks may have been stored by then, which a resend dedupes.
        """
        size = self.settings.batch_size
        chunks = [records[i : i + size] for i in range(0, len(records), size)]
        new = 0
        for wave in range(0, len(chunks), _IN_FLIGHT):
            results = await asyncio.gather(
                *(self._send_bounded(c) for c in chunks[wave : wave + _IN_FLIGHT]),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    if not isinstance(result, FAILURES):
                        raise result
                    self._backoff.failure()
                    raise map_redis_error(result) from result
                new += result
        self._backoff.success()
        return new

    async def _send_bounded(self, chunk: list[UsageRecord]) -> int:
        """One pipeline, bounded by ``deadline`` plus 1 ms per record: a frozen Redis is
        noticed within ~0.5 s, a busy event loop does not spool a healthy Redis's batch."""
        async with asyncio.timeout(self._deadline + 0.001 * len(chunk)):
            return await self._send_chunk(chunk)

    async def _send_chunk(self, chunk: list[UsageRecord]) -> int:
        results = await self._pipeline(chunk)
        retry = [i for i, res in enumerate(results) if is_no_script(res)]
        if retry:  # Redis restarted (or a new node): load the script, resend those only
            await self._client.script_load(STORE_RECORD)
            again = await self._pipeline([chunk[i] for i in retry])
            for i, res in zip(retry, again, strict=True):
                results[i] = res
        new = dup = 0
        poison: list[UsageRecord] = []
        for record, res in zip(chunk, results, strict=True):
            if isinstance(res, BaseException):
                if is_no_script(res) or is_outage(res):
                    raise res  # the whole chunk is spooled; replay dedupes what got through
                poison.append(record)
            elif int(res) == 1:
                new += 1
            else:
                dup += 1
        if poison:
            path = self.spool.quarantine(poison)
            log.error("ledger: Redis refused %d records; kept in %s", len(poison), path)
        self.stats.stored += new
        self.stats.duplicates += dup
        return new

    async def _pipeline(self, chunk: list[UsageRecord]) -> list[Any]:
        sadd = ("SADD", TENANTS_KEY, *{record.tenant for record in chunk})
        commands: list[Command] = [self._encoded(r) for r in chunk]
        commands.append(sadd)
        results = await self._client.execute_many(commands)
        sadd = results.pop()
        if isinstance(sadd, BaseException) and is_outage(sadd):
            raise sadd
        return results

    def _encoded(self, record: UsageRecord) -> bytes:
        """The record's EVALSHA in RESP, as ``encode_command`` would write
        ``("EVALSHA", sha, 4, *_script_args(record))``, from cached parts: the keys and expiry
        times of a tenant's day and the group prefix of a model/class/batch are the same for
        thousands of records. A quarter of the cost of building and encoding the arguments,
        per usage record (``tests/ledger/test_redis_encoding.py`` checks the bytes are equal).
        """
        day = self._day_parts.get((record.tenant, record.day))
        if day is None:
            day = self._day_part(record)
        group = self._group_parts.get((record.model, record.request_class, record.batch_id))
        if group is None:
            group = self._group_part(record)
        seen = f"{day[0]}:seen:{record.request_id}".encode()
        data = encode_record(record)
        counters = _COUNTERS_FORMAT % counters_of(record)
        return _RECORD_COMMAND % (self._head, len(seen), seen, day[1], len(data), data, group,
                                  len(counters), counters)

    def _day_part(self, record: UsageRecord) -> tuple[str, bytes]:
        """(tag, RESP of the stream/day/month keys and the three expiry arguments)."""
        args = self._script_args(record)
        part = b"".join(bulk(a) for a in (*args[1:4], *args[4:7]))
        if len(self._day_parts) >= 1024:
            self._day_parts.clear()
        value = self._day_parts[record.tenant, record.day] = (_tag(record.tenant), part)
        return value

    def _group_part(self, record: UsageRecord) -> bytes:
        part = bulk(field_prefix(record))
        if len(self._group_parts) >= 1024:
            self._group_parts.clear()
        self._group_parts[record.model, record.request_class, record.batch_id] = part
        return part

    def _script_args(self, record: UsageRecord) -> tuple[Any, ...]:
        tag = _tag(record.tenant)
        day_number = record.ts_ms // _DAY_MS
        day = record.day
        return (
            seen_key(tag, record.request_id),
            stream_key(tag, day),
            day_key(tag, day),
            month_key(tag, day[:7]),
            self._seen_ttl_ms,
            (day_number + 1) * _DAY_MS + self._day_keep_ms,
            _month_end_ms(day_number) + self._month_keep_ms,
            encode_record(record),
            field_prefix(record),
            ",".join(map(str, counters_of(record))),
        )

    # -- the spool ------------------------------------------------------------------------

    async def replay(self) -> int:
        """Replay spooled records into Redis; returns how many were new to Redis.

        Stops at the first outage, keeping the rest for next time. Safe to run from several
        processes and to repeat: segments are locked while replayed, records deduplicated.
        """
        async with self._replay_lock:
            if not self.spool.segment_paths() or not self._backoff.allow():
                return 0
            try:  # the probe: cheap, and a success lets the flushes use Redis again too
                async with asyncio.timeout(self._deadline):
                    await self._client.execute_command("PING")
            except FAILURES:
                self._backoff.failure()
                return 0
            self._backoff.success()
            self.spool.rotate()
            new = 0
            for claim in self.spool.claims():
                try:
                    new += await self._send(claim.records)
                except LedgerError as exc:
                    claim.release()
                    log.warning("ledger: spool replay paused: %s", exc)
                    break
                except BaseException:
                    claim.release()
                    raise
                self.stats.replayed += len(claim.records)
                claim.done()
            return new

    async def _start_store(self) -> None:
        """Connect and load the script now, so the first flush does not pay for it; a
        Redis that is down here only means the first batches are spooled."""
        try:
            async with asyncio.timeout(max(self._deadline, 1.0)):
                await self._client.script_load(STORE_RECORD)
        except FAILURES as exc:
            self._backoff.failure()
            log.warning("ledger: Redis unavailable at start (%s); spooling until it answers", exc)
        self._replayer = asyncio.create_task(self._run_replayer(), name="ledger-replayer")

    async def _run_replayer(self) -> None:
        """Replay at start, then every ``replay_interval`` (a no-op while the spool is empty
        or the back-off says Redis is still away)."""
        while True:
            try:
                await self.replay()
            except Exception:
                log.exception("ledger: spool replay failed")
            await asyncio.sleep(self.settings.replay_interval)

    async def _close_store(self) -> None:
        if self._replayer is not None:
            async with self._replay_lock:  # never stop a replay half-way through a segment
                self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
            self._replayer = None
        self.spool.close()
        if self._owns_client:
            await self._client.aclose()

    # -- reading --------------------------------------------------------------------------

    async def tenants(self) -> list[str]:
        members = await self._call("SMEMBERS", TENANTS_KEY)
        return sorted(_text(m) for m in members)

    async def _read_totals(self, tenant: str, periods: list[Period]) -> list[Mapping[str, int]]:
        tag = _tag(tenant)
        replies = await self._bounded(self._client.execute_many([
            ("HGETALL", day_key(tag, p.label) if p.kind == "d" else month_key(tag, p.label))
            for p in periods]))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise map_redis_error(reply) from reply
        return [{_text(k): int(v) for k, v in _pairs(reply)} for reply in replies]

    async def _day_records(self, tenant: str, day: str) -> AsyncIterator[UsageRecord]:
        key = stream_key(_tag(tenant), day)
        start = "-"
        while True:
            entries = await self._call("XRANGE", key, start, "+", "COUNT", _READ_CHUNK)
            for entry_id, fields in entries:
                data = dict(_pairs(fields)) if not isinstance(fields, dict) else fields
                raw = data.get(b"r", data.get("r"))
                try:
                    yield decode_record(raw if raw is not None else b"")
                except msgspec.DecodeError:
                    log.error("ledger: undecodable stream entry %s %s", key, _text(entry_id))
            if len(entries) < _READ_CHUNK:
                return
            start = "(" + _text(entries[-1][0])

    async def _call(self, *args: Any) -> Any:
        return await self._bounded(self._client.execute_command(*args))

    async def _bounded(self, awaitable: Any) -> Any:
        try:
            async with asyncio.timeout(max(self._deadline, 1.0)):
                return await awaitable
        except FAILURES as exc:
            raise map_redis_error(exc) from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """HGETALL/XRANGE field lists come back as a dict or a flat list, by client version."""
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[::2], reply[1::2], strict=True))


def _sha1(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()
