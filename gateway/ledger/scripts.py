"""The Lua script that stores one record: dedupe, append, add to totals, in one atomic step.

KEYS: seen, stream, day totals, month totals (all in the tenant's slot).
ARGV: seen TTL (ms), day expiry (unix ms), month expiry (unix ms), record JSON, field prefix
``model|class|batch|``, the counters as one comma-joined string (one argument instead of ten:
argument encoding is most of redis-py's per-command cost).

Returns 1 when stored, 0 when the request id was seen before (nothing changes). Atomic, so a
record is either wholly counted or not at all, and idempotent, so replays are safe. Zero
counters are skipped (fewer hash fields); readers treat a missing field as 0.
"""

from __future__ import annotations

from gateway.ledger.aggregate import COUNTERS

__all__ = ["STORE_RECORD"]

_NAMES = ", ".join(f"'{name}'" for name in COUNTERS)

STORE_RECORD = f"""
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
redis.call('XADD', KEYS[2], '*', 'r', ARGV[4])
local names = {{{_NAMES}}}
local prefix = ARGV[5]
local i = 1
for value in string.gmatch(ARGV[6], '([^,]+)') do
  local n = tonumber(value)
  if n ~= 0 then
    redis.call('HINCRBY', KEYS[3], prefix .. names[i], n)
    redis.call('HINCRBY', KEYS[4], prefix .. names[i], n)
  end
  i = i + 1
end
redis.call('PEXPIREAT', KEYS[2], ARGV[2])
redis.call('PEXPIREAT', KEYS[3], ARGV[2])
redis.call('PEXPIREAT', KEYS[4], ARGV[3])
return 1
"""
