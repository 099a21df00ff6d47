"""Batch state in Redis, shared by every gateway process (``$GATEWAY_REDIS_URL``).

Keys (``{id}`` is a hash tag, so one batch's keys share a Cluster slot and each script touches
one slot)::

    gwbatch:{<batch>}:b       hash   the batch's fields, each JSON-encoded
    gwbatch:{<batch>}:lease   zset   chunk -> lease expiry (unix ms); done chunks are removed
    gwbatch:{<batch>}:owner   hash   chunk -> owner (the process holding the lease)
    gwbatch:{<batch>}:next    string the next never-claimed chunk
    gwbatch:{<batch>}:res     hash   line index -> "1"|"0" + result line (first write wins)
    gwbatch:t:{<tenant>}      zset   batch id -> creation sequence (listing, newest first)
    gwbatch:active            set    batches not yet final
    gwbatch:seq               string the creation sequence
    gwfile:{<file>}           string the file record (JSON)

Every step of :class:`~gateway.batch.state.BatchState` is one command or one Lua script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.batch.objects import FINAL, BatchRecord, FileRecord, LineResult
from gateway.batch.state import BatchState
from gateway.redis import Timeouts, open_redis_py

if TYPE_CHECKING:
    from collections.abc import Collection

    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["RedisBatchState"]

_CLAIM = """
local exp = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, 1)
if #exp > 0 then
  redis.call('ZADD', KEYS[1], ARGV[2], exp[1])
  redis.call('HSET', KEYS[2], exp[1], ARGV[4])
  return tonumber(exp[1])
end
local n = redis.call('INCR', KEYS[3])
if n > tonumber(ARGV[3]) then return -1 end
redis.call('ZADD', KEYS[1], ARGV[2], n - 1)
redis.call('HSET', KEYS[2], n - 1, ARGV[4])
return n - 1
"""
_RENEW = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[3], ARGV[1]) + 1
"""
_RELEASE = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
end
return 1
"""
_RECORD = """
local c, f = 0, 0
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1] .. ARGV[i + 2]) == 1 then
    if ARGV[i + 1] == '1' then c = c + 1 else f = f + 1 end
  end
end
if c > 0 then redis.call('HINCRBY', KEYS[2], 'completed', c) end
if f > 0 then redis.call('HINCRBY', KEYS[2], 'failed', f) end
return c + f
"""
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local n = tonumber(ARGV[3])
local ok = false
for i = 4, 3 + n do
  if status == ARGV[i] then ok = true end
end
if not ok and ARGV[2] == '1' and status == '"finalizing"' then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'final_lease') or '0')
  if lease < tonumber(ARGV[1]) then ok = true end
end
if not ok then return 0 end
for i = 4 + n, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
"""

_enc = msgspec.json.Encoder()
_ACTIVE = "gwbatch:active"


def _k(batch_id: str, part: str) -> str:
    return f"gwbatch:{{{batch_id}}}:{part}"


def _decode_batch(fields: dict[bytes, bytes]) -> BatchRecord | None:
    if not fields:
        return None
    doc = {k.decode(): msgspec.json.decode(v) for k, v in fields.items()}
    return msgspec.convert(doc, BatchRecord)


class RedisBatchState(BatchState):
    """Batch state in one Redis (or a Cluster: every script stays inside one hash tag)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self.redis: Any = client  # redis-py's async stubs type replies loosely
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._record = client.register_script(_RECORD)
        self._transition = client.register_script(_TRANSITION)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False) -> RedisBatchState:
        """State on redis-py (its scripts and commands API; ``gateway.redis.open_redis_py``)
        with its own retries: no step here is on a request's path, none has a back-off."""
        return cls(open_redis_py(url, cluster=cluster, timeouts=Timeouts(connect=5.0, socket=5.0),
                                 max_connections=None, retries=True))

    async def close(self) -> None:
        await self.redis.aclose()

    # -- files
    async def put_file(self, record: FileRecord) -> None:
        await self.redis.set(f"gwfile:{{{record.id}}}", _enc.encode(record))

    async def get_file(self, file_id: str) -> FileRecord | None:
        raw = await self.redis.get(f"gwfile:{{{file_id}}}")
        return None if raw is None else msgspec.json.decode(raw, type=FileRecord)

    async def delete_file(self, file_id: str) -> None:
        await self.redis.delete(f"gwfile:{{{file_id}}}")

    # -- batches
    async def create_batch(self, record: BatchRecord) -> None:
        fields = {k: _enc.encode(v) for k, v in msgspec.structs.asdict(record).items()}
        seq = await self.redis.incr("gwbatch:seq")
        await self.redis.hset(_k(record.id, "b"), mapping=fields)
        await self.redis.zadd(f"gwbatch:t:{{{record.tenant}}}", {record.id: seq})
        await self.redis.sadd(_ACTIVE, record.id)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        return _decode_batch(await self.redis.hgetall(_k(batch_id, "b")))

    async def list_batches(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        key = f"gwbatch:t:{{{tenant}}}"
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(key, after)
            start = 0 if rank is None else int(rank) + 1
        ids = await self.redis.zrevrange(key, start, start + limit)
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in ids[:limit]:
            pipe.hgetall(_k(batch_id.decode(), "b"))
        records = [r for fields in await pipe.execute() if (r := _decode_batch(fields))]
        return records, len(ids) > limit

    async def active_batches(self) -> list[str]:
        members = await self.redis.smembers(_ACTIVE)
        return sorted(m.decode() for m in members)

    async def transition(
        self,
        batch_id: str,
        from_status: Collection[str],
        changes: dict[str, Any],
        *,
        retake_final: bool = False,
        now: float = 0.0,
    ) -> bool:
        args: list[Any] = [now, int(retake_final), len(from_status)]
        args += [_enc.encode(s) for s in from_status]
        for name, value in changes.items():
            args += [name, _enc.encode(value)]
        done = bool(await self._transition(keys=[_k(batch_id, "b")], args=args))
        if done and changes.get("status") in FINAL:
            await self.redis.srem(_ACTIVE, batch_id)
        return done

    # -- lines
    async def claim_chunk(
        self, batch: BatchRecord, owner: str, lease_s: float, now: float
    ) -> int | None:
        chunk = int(await self._claim(
            keys=[_k(batch.id, "lease"), _k(batch.id, "owner"), _k(batch.id, "next")],
            args=[int(now * 1000), int((now + lease_s) * 1000), batch.chunks, owner]))
        return None if chunk < 0 else chunk

    async def renew_chunk(
        self, batch_id: str, chunk: int, owner: str, lease_s: float, now: float
    ) -> bool:
        return bool(await self._renew(keys=[_k(batch_id, "lease"), _k(batch_id, "owner")],
                                      args=[chunk, owner, int((now + lease_s) * 1000)]))

    async def release_chunk(self, batch_id: str, chunk: int, owner: str, done: bool) -> None:
        await self._release(keys=[_k(batch_id, "lease"), _k(batch_id, "owner")],
                            args=[chunk, owner, int(done)])

    async def leases_held(self, batch_id: str, now: float) -> int:
        return int(await self.redis.zcount(_k(batch_id, "lease"), int(now * 1000), "+inf"))

    async def done_lines(self, batch_id: str, lines: range) -> set[int]:
        if not lines:
            return set()
        values = await self.redis.hmget(_k(batch_id, "res"), list(lines))
        return {i for i, v in zip(lines, values, strict=True) if v is not None}

    async def record_results(self, batch_id: str, results: list[LineResult]) -> int:
        if not results:
            return 0
        args: list[Any] = []
        for r in results:
            args += [r.index, "1" if r.ok else "0", r.line]
        return int(await self._record(keys=[_k(batch_id, "res"), _k(batch_id, "b")], args=args))

    async def results(self, batch_id: str) -> list[LineResult]:
        fields = await self.redis.hgetall(_k(batch_id, "res"))
        out = [LineResult(int(k), v[:1] == b"1", bytes(v[1:])) for k, v in fields.items()]
        out.sort(key=lambda r: r.index)
        return out

    def __repr__(self) -> str:
        return f"<RedisBatchState {self.redis!r}>"
