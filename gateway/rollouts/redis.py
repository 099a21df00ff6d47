"""Rollout state shared by every replica in Redis, and the lease that picks the decider.

Keys (``<m>`` the model name, escaped as a hash tag so each model's keys share a slot)::

    gw:ro:{<m>}:state           JSON of the state, written by compare-and-set on its revision
    gw:ro:{<m>}:w:<epoch>       hash: replica id -> JSON of that replica's counts of the window
    gw:ro:lease                 the deciding replica's id, SET NX PX; renewed by its holder

Every replica publishes its counts each tick and reads the state back (so it routes by the
step in force); the lease holder also gathers all replicas' counts and decides. When it dies
its lease runs out (``ttl``), another replica takes it and goes on from the stored state and
counts: the hold's clock is the state's ``since``, a wall-clock time, not a process's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gateway.redis import FAILURES, escape_tag, open_redis
from gateway.rollouts.base import RolloutStoreUnavailable
from gateway.rollouts.machine import RolloutState

if TYPE_CHECKING:
    from gateway.redis import RedisLike

__all__ = ["LEASE_KEY", "RedisRolloutStore"]

LEASE_KEY = "gw:ro:lease"

_CAS = """
local cur = redis.call('GET', KEYS[1])
local rev = -1
if cur then rev = tonumber(cjson.decode(cur)['revision']) end
if rev ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""

_LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _key(model: str) -> str:
    return f"gw:ro:{{{escape_tag(model)}}}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisRolloutStore:
    """The rollout store of a gateway with ``$GATEWAY_REDIS_URL``."""

    kind = "redis"

    def __init__(self, redis: RedisLike) -> None:
        self.redis = redis

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False) -> RedisRolloutStore:
        return cls(open_redis(url, cluster=cluster))

    def __repr__(self) -> str:
        return f"<RedisRolloutStore [{self.redis.kind}]>"

    async def _call(self, *args: Any) -> Any:
        try:
            return await self.redis.execute_command(*args)
        except FAILURES as exc:
            raise RolloutStoreUnavailable(f"Redis: {type(exc).__name__}") from exc

    async def load(self, model: str) -> RolloutState | None:
        raw = await self._call("GET", f"{_key(model)}:state")
        return None if raw is None else RolloutState.from_json(json.loads(raw))

    async def save(self, state: RolloutState, expected: int | None) -> bool:
        done = await self._call(
            "EVAL", _CAS, 1, f"{_key(state.model)}:state",
            -1 if expected is None else expected, json.dumps(state.to_json()))
        return bool(done)

    async def publish(self, model: str, epoch: int, replica: str, window: dict[str, Any],
                      ttl: float) -> None:
        key = f"{_key(model)}:w:{epoch}"
        try:
            await self.redis.execute_many([("HSET", key, replica, json.dumps(window)),
                                           ("PEXPIRE", key, int(ttl * 1000))])
        except FAILURES as exc:
            raise RolloutStoreUnavailable(f"Redis: {type(exc).__name__}") from exc

    async def gather(self, model: str, epoch: int) -> list[dict[str, Any]]:
        reply = await self._call("HGETALL", f"{_key(model)}:w:{epoch}")
        values = (list(reply.values()) if isinstance(reply, dict)
                  else list(reply or [])[1::2])
        return [json.loads(_text(v)) for v in values]

    async def lead(self, replica: str, ttl: float) -> bool:
        held = await self._call("EVAL", _LEAD, 1, LEASE_KEY, replica,
                                                int(ttl * 1000))
        return bool(held)

    async def resign(self, replica: str) -> None:
        await self._call("EVAL", _RESIGN, 1, LEASE_KEY, replica)

    async def aclose(self) -> None:
        await self.redis.aclose()
