"""The Lua scripts of the Redis store: each is one atomic step and one round trip.

Kept as Python strings (not ``.lua`` files) so they ship with the package without package-data.
All times come from ``redis.call('TIME')`` in microseconds, so every replica agrees on the clock.
Big numbers are only ever passed to ``redis.call`` as Lua numbers (Redis prints them exactly);
Lua's own ``..`` would print them with 14 digits, so it is used for small ids only.

Wire format (``-1`` = limit unset; five limits per scope in ``LIMIT_NAMES`` order)::

    RESERVE KEYS: record, scope base...   ARGV: rid, estimate, lease_us, window_us,
                                                record_ttl_ms, limits ("r,t,c,d,m,u," per
                                                scope, u = unit 0 tokens / 1 cost),
                                                estimated cost, thresholds, calendar
            -> {1, now_us, lease_expiry_us, RL...}            admitted
               {2, now_us, lease_expiry_us}                   already reserved (same id)
               {0, scope index, limit code, wait_us, RL..., A...}   refused (codes 1..5 =
                                                              LIMIT_NAMES)
            RL = rpm limit, requests left, reset_us, tpm limit, tokens left, reset_us: the
            x-ratelimit figures of the tightest scopes (``RateLimitState`` in ``base.py``;
            limit -1 = no scope sets it), after this request when admitted
    SETTLE  KEYS: record, scope base...   ARGV: rid, actual tokens, window_us,
                                                actual cost (-1 = keep the estimate), limits,
                                                thresholds -> {1, A...} | 0
    RENEW   KEYS: record, scope base...   ARGV: rid, lease_us, record_ttl_ms    -> 1 | 0
    USAGE   KEYS: scope base              ARGV: window_us, calendar
                                          -> {requests, tokens, in_flight, day tokens,
                                              month tokens}

``thresholds``: per scope, its alert percentages ``"50.80.100,"`` (just ``","`` for a scope
without alerts; a reserve sends only commas when its refusal must not alert). ``A``: the
budget alerts that fired, five numbers each: scope index, limit code (4 day, 5 month), period
id, threshold, usage (``alerts.py``). A threshold fires once per (scope, period):
``<budget counter>:a`` is a hash of the thresholds that fired, with the counter's TTL.

``calendar``: empty for UTC (the script's own arithmetic on ``TIME``), else the day before,
of and after now in the partition's zone, then the three months, ``"id,start_us,end_us,"``
each (``limits.calendar_candidates``); the script takes the one holding its clock.

The record (``HSET``) holds ``e`` estimate, ``d``/``m`` the day/month ids charged, ``x``
lease expiry and ``f`` five '0'/'1' flags per scope saying which limits were charged, so settle
undoes exactly what reserve did even if the tenant's limits changed in between.
"""

from __future__ import annotations

__all__ = ["RENEW", "RESERVE", "SETTLE", "USAGE"]

_COMMON = """
local CONC_HINT = 1000000   -- us: cap of retry_after for concurrency
local RETRY_SCAN = 100      -- window entries scanned to compute a tpm retry_after

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]), tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- UTC calendar from days since the epoch (H. Hinnant's civil_from_days).
local function civil(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
                          - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

local function days_in_month(y, m)
  if m == 2 then
    if (y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0 then return 29 end
    return 28
  end
  if m == 4 or m == 6 or m == 9 or m == 11 then return 30 end
  return 31
end

-- the candidate (id, start_us, end_us) at C[first..first+8] that holds now, and the us to its
-- end; past every candidate (a clock a day off) the nearest one
local function pick(C, first, now)
  for j = first, first + 6, 3 do
    if C[j + 1] <= now and now < C[j + 2] then return C[j], C[j + 2] - now end
  end
  if now < C[first + 1] then return C[first], C[first + 2] - now end
  return C[first + 6], math.max(0, C[first + 8] - now)
end

-- day id, month id, us to next day, us to next month: UTC, or the calendar given
local function periods(sec, now, cal)
  if cal and cal ~= '' then
    local C = {}
    for v in string.gmatch(cal, '(-?%d+),') do C[#C + 1] = tonumber(v) end
    local day_id, next_day = pick(C, 1, now)
    local month_id, next_month = pick(C, 10, now)
    return day_id, month_id, next_day, next_month
  end
  local daynum = math.floor(sec / 86400)
  local y, m, d = civil(daynum)
  local next_day = (daynum + 1) * 86400000000 - now
  local next_month = (daynum + days_in_month(y, m) - d + 1) * 86400000000 - now
  return y * 10000 + m * 100 + d, y * 100 + m, next_day, next_month
end

-- limits: six comma-terminated integers per scope (five limits and the unit: 0 tokens,
-- 1 cost), one argument (fewer args to encode)
local function parse_limits(arg)
  local L = {}
  for v in string.gmatch(arg, '(-?%d+),') do L[#L + 1] = tonumber(v) end
  return L
end

-- alert thresholds per scope ("50.80.100," each, "," for none); nil when no scope has any
local function parse_thresholds(arg)
  if not arg or not string.find(arg, '%d') then return nil end
  local T = {}
  for entry in string.gmatch(arg, '([^,]*),') do
    local t = {}
    for v in string.gmatch(entry, '%d+') do t[#t + 1] = tonumber(v) end
    T[#T + 1] = t
  end
  return T
end

-- The thresholds of one budget that its usage reached (a refusal reaches 100) and that did
-- not fire yet this period: marked in the counter's ':a' hash and appended to out as
-- {scope index, limit code, period id, threshold, usage} (``alerts.due`` is the same rule).
local function alert(counter, limit, T, refused, ttl_ms, out, i, code, pid)
  local used = tonumber(redis.call('GET', counter) or '0')
  local reached = {}
  for _, t in ipairs(T) do
    if used * 100 >= t * limit or (refused and t >= 100) then reached[#reached + 1] = t end
  end
  if #reached == 0 then return end
  local mk = counter .. ':a'
  local seen = redis.call('HMGET', mk, unpack(reached))
  local fired = false
  for j = 1, #reached do
    if not seen[j] then
      redis.call('HSET', mk, reached[j], used)
      fired = true
      out[#out + 1] = i
      out[#out + 1] = code
      out[#out + 1] = pid
      out[#out + 1] = reached[j]
      out[#out + 1] = used
    end
  end
  if fired then
    local ttl = redis.call('PTTL', counter)
    if ttl <= 0 then ttl = ttl_ms end
    redis.call('PEXPIRE', mk, ttl)
  end
end

-- Drop token entries that left the window; returns the window's running total.
local function prune_tpm(base, cutoff)
  local z, v, n = base .. ':tpm', base .. ':tpm:v', base .. ':tpm:n'
  local total = tonumber(redis.call('GET', n) or '0')
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff, 'LIMIT', 0, 256)
    if #old == 0 then break end
    local vals = redis.call('HMGET', v, unpack(old))
    local s = 0
    for j = 1, #vals do s = s + (tonumber(vals[j]) or 0) end
    redis.call('HDEL', v, unpack(old))
    redis.call('ZREM', z, unpack(old))
    if s ~= 0 then total = redis.call('DECRBY', n, s) end
    if #old < 256 then break end
  end
  return total
end

local function keep_window(base, window_ms)
  redis.call('PEXPIRE', base .. ':tpm', window_ms)
  redis.call('PEXPIRE', base .. ':tpm:v', window_ms)
  redis.call('PEXPIRE', base .. ':tpm:n', window_ms)
end

local function keep_at_least(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
"""

RESERVE = (
    _COMMON
    + """
-- us until the oldest entry of a window leaves it (remaining grows then): 0 for an empty
-- window or an unset limit (-1), the whole window for a limit of 0 (it never frees)
local function reset_us(limit, first, now, window)
  if limit == 0 then return window end
  if limit < 0 or not first then return 0 end
  return math.max(0, first + window - now)
end

local function oldest(k)
  local e = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #e > 0 then return tonumber(e[2]) end
  return nil
end

local rid = ARGV[1]
local est = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local window_ms = math.floor(window / 1000) + 1000
local n = #KEYS - 1
local sec, now = clock()

if redis.call('EXISTS', KEYS[1]) == 1 then
  return {2, now, tonumber(redis.call('HGET', KEYS[1], 'x'))}
end

local L = parse_limits(ARGV[6])
if #L ~= 6 * n then return redis.error_reply('quota: limits do not match the scopes') end
local T = parse_thresholds(ARGV[8])
if T and #T ~= n then return redis.error_reply('quota: thresholds do not match the scopes') end
local est_tokens, est_cost = est, tonumber(ARGV[7] or '0')
local units = {}
local refusals = {}  -- budgets that refuse in scopes with alerts: {i, code, counter, limit}

local day_id, month_id, next_day, next_month = periods(sec, now, ARGV[9])
local cutoff = now - window
local worst_wait, worst_scope, worst_limit = -1, 0, 0
-- the tightest scope for the x-ratelimit figures: fewest left, the first on a tie (every
-- scope gets the same +1 request / +est tokens, so the choice holds after reserving too)
local rq_i, rq_left, rq_lim, tk_i, tk_left, tk_lim = 0, 0, -1, 0, 0, -1
local function consider(wait, i, code)
  if wait > worst_wait then worst_wait, worst_scope, worst_limit = wait, i, code end
end

-- 1. check every limit of every scope (pruning is not reserving: safe on refusal)
for i = 1, n do
  local base, a = KEYS[i + 1], (i - 1) * 6
  local rpm, tpm, conc, dayb, monthb = L[a + 1], L[a + 2], L[a + 3], L[a + 4], L[a + 5]
  est = (L[a + 6] == 1) and est_cost or est_tokens
  units[i] = (L[a + 6] == 1) and '1' or '0'
  if rpm >= 0 then
    local k = base .. ':rpm'
    redis.call('ZREMRANGEBYSCORE', k, '-inf', cutoff)
    local c = redis.call('ZCARD', k)
    if rq_i == 0 or rpm - c < rq_left then rq_i, rq_left, rq_lim = i, rpm - c, rpm end
    if c >= rpm then
      local wait = window
      if rpm > 0 then
        local e = redis.call('ZRANGE', k, c - rpm, c - rpm, 'WITHSCORES')
        wait = tonumber(e[2]) + window - now
      end
      consider(wait, i, 1)
    end
  end
  if tpm >= 0 then
    local total = prune_tpm(base, cutoff)
    if L[a + 6] == 0 and (tk_i == 0 or tpm - total < tk_left) then
      tk_i, tk_left, tk_lim = i, tpm - total, tpm
    end
    if total + est > tpm then
      local wait = window
      local e = redis.call('ZRANGE', base .. ':tpm', 0, RETRY_SCAN - 1, 'WITHSCORES')
      if est <= tpm and #e > 0 then
        local ids = {}
        for j = 1, #e, 2 do ids[#ids + 1] = e[j] end
        local vals = redis.call('HMGET', base .. ':tpm:v', unpack(ids))
        local need = total + est - tpm
        local ts = now
        for j = 1, #ids do
          ts = tonumber(e[2 * j])
          need = need - (tonumber(vals[j]) or 0)
          if need <= 0 then break end
        end
        wait = ts + window - now
      end
      consider(wait, i, 2)
    end
  end
  if conc >= 0 then
    local k = base .. ':conc'
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
    if redis.call('ZCARD', k) >= conc then
      local wait = CONC_HINT
      local e = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      if #e > 0 then wait = math.min(tonumber(e[2]) - now, CONC_HINT) end
      consider(wait, i, 3)
    end
  end
  if dayb >= 0 then
    local k = base .. ':d:' .. day_id
    local used = tonumber(redis.call('GET', k) or '0')
    if used + est > dayb then
      consider(next_day, i, 4)
      if T and #T[i] > 0 then refusals[#refusals + 1] = {i, 4, k, dayb} end
    end
  end
  if monthb >= 0 then
    local k = base .. ':m:' .. month_id
    local used = tonumber(redis.call('GET', k) or '0')
    if used + est > monthb then
      consider(next_month, i, 5)
      if T and #T[i] > 0 then refusals[#refusals + 1] = {i, 5, k, monthb} end
    end
  end
end
local rq_first, tk_first
if rq_i > 0 then rq_first = oldest(KEYS[rq_i + 1] .. ':rpm') end
if tk_i > 0 then tk_first = oldest(KEYS[tk_i + 1] .. ':tpm') end
if worst_limit ~= 0 then
  local out = {0, worst_scope, worst_limit, worst_wait,
               rq_lim, math.max(0, rq_left), reset_us(rq_lim, rq_first, now, window),
               tk_lim, math.max(0, tk_left), reset_us(tk_lim, tk_first, now, window)}
  for _, r in ipairs(refusals) do
    local i, code = r[1], r[2]
    local pid, wait = day_id, next_day
    if code == 5 then pid, wait = month_id, next_month end
    alert(r[3], r[4], T[i], true, math.floor(wait / 1000) + 86400000, out, i, code, pid)
  end
  return out
end

-- 2. every limit passed: reserve in every scope
local expiry = now + lease
local flags = {}
for i = 1, n do
  local base, a = KEYS[i + 1], (i - 1) * 6
  est = (L[a + 6] == 1) and est_cost or est_tokens
  local f = {'0', '0', '0', '0', '0'}
  if L[a + 1] >= 0 then
    local k = base .. ':rpm'
    redis.call('ZADD', k, now, rid)
    redis.call('PEXPIRE', k, window_ms)
    f[1] = '1'
  end
  if L[a + 2] >= 0 then
    redis.call('ZADD', base .. ':tpm', now, rid)
    redis.call('HSET', base .. ':tpm:v', rid, est)
    redis.call('INCRBY', base .. ':tpm:n', est)
    keep_window(base, window_ms)
    f[2] = '1'
  end
  if L[a + 3] >= 0 then
    local k = base .. ':conc'
    redis.call('ZADD', k, expiry, rid)
    keep_at_least(k, math.floor(lease / 1000) + 1000)
    f[3] = '1'
  end
  if L[a + 4] >= 0 then
    local k = base .. ':d:' .. day_id
    redis.call('INCRBY', k, est)
    keep_at_least(k, math.floor(next_day / 1000) + 86400000)
    f[4] = '1'
  end
  if L[a + 5] >= 0 then
    local k = base .. ':m:' .. month_id
    redis.call('INCRBY', k, est)
    keep_at_least(k, math.floor(next_month / 1000) + 86400000)
    f[5] = '1'
  end
  flags[i] = table.concat(f)
end
redis.call('HSET', KEYS[1], 'e', est_tokens, 'c', est_cost, 'u', table.concat(units),
           'd', day_id, 'm', month_id, 'x', expiry, 'f', table.concat(flags))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
-- this request is now the newest entry of each window (the oldest of an empty one)
return {1, now, expiry,
        rq_lim, math.max(0, rq_left - 1), reset_us(rq_lim, rq_first or now, now, window),
        tk_lim, math.max(0, tk_left - est_tokens),
        reset_us(tk_lim, tk_first or now, now, window)}
"""
)

SETTLE = (
    _COMMON
    + """
local rid = ARGV[1]
local rec = redis.call('HMGET', KEYS[1], 'e', 'd', 'm', 'f', 'c', 'u')
if not rec[1] then return 0 end
local f = rec[4]
if #f ~= 5 * (#KEYS - 1) then
  return redis.error_reply('quota: settle scopes do not match the reservation')
end
local T = parse_thresholds(ARGV[6])
local L
if T then
  L = parse_limits(ARGV[5])
  if #T ~= #KEYS - 1 or #L ~= 6 * (#KEYS - 1) then
    return redis.error_reply('quota: settle limits do not match the reservation')
  end
end
local out = {1}
local actual = math.max(0, tonumber(ARGV[2]))
local delta_tokens = actual - tonumber(rec[1])
local actual_cost = tonumber(ARGV[4] or '-1')
local delta_cost = 0
if actual_cost >= 0 then delta_cost = actual_cost - tonumber(rec[5] or '0') end
local u = rec[6] or ''
local delta
local window = tonumber(ARGV[3])
local window_ms = math.floor(window / 1000) + 1000
local _, now = clock()
for i = 1, #KEYS - 1 do
  local base, o = KEYS[i + 1], (i - 1) * 5
  delta = (u:sub(i, i) == '1') and delta_cost or delta_tokens
  if f:sub(o + 3, o + 3) == '1' then redis.call('ZREM', base .. ':conc', rid) end
  if delta ~= 0 then
    if f:sub(o + 2, o + 2) == '1' then
      prune_tpm(base, now - window)
      if redis.call('HEXISTS', base .. ':tpm:v', rid) == 1 then
        redis.call('HINCRBY', base .. ':tpm:v', rid, delta)
        redis.call('INCRBY', base .. ':tpm:n', delta)
      elseif delta > 0 then
        -- the estimate already left the window: charge the overshoot now
        redis.call('ZADD', base .. ':tpm', now, rid)
        redis.call('HSET', base .. ':tpm:v', rid, delta)
        redis.call('INCRBY', base .. ':tpm:n', delta)
        keep_window(base, window_ms)
      end
    end
    local dk, mk = base .. ':d:' .. rec[2], base .. ':m:' .. rec[3]
    if f:sub(o + 4, o + 4) == '1' and redis.call('EXISTS', dk) == 1 then
      redis.call('INCRBY', dk, delta)
    end
    if f:sub(o + 5, o + 5) == '1' and redis.call('EXISTS', mk) == 1 then
      redis.call('INCRBY', mk, delta)
    end
  end
  -- budget alerts, on the counters as they stand after this settle
  if T and #T[i] > 0 then
    local a = (i - 1) * 6
    local dk, mk = base .. ':d:' .. rec[2], base .. ':m:' .. rec[3]
    if f:sub(o + 4, o + 4) == '1' and L[a + 4] >= 0 and redis.call('EXISTS', dk) == 1 then
      alert(dk, L[a + 4], T[i], false, 2764800000, out, i, 4, tonumber(rec[2]))
    end
    if f:sub(o + 5, o + 5) == '1' and L[a + 5] >= 0 and redis.call('EXISTS', mk) == 1 then
      alert(mk, L[a + 5], T[i], false, 2764800000, out, i, 5, tonumber(rec[3]))
    end
  end
end
redis.call('DEL', KEYS[1])
return out
"""
)

RENEW = (
    _COMMON
    + """
local rid = ARGV[1]
local f = redis.call('HGET', KEYS[1], 'f')
if not f then return 0 end
local _, now = clock()
local expiry = now + tonumber(ARGV[2])
local held = 1
for i = 1, #KEYS - 1 do
  local o = (i - 1) * 5
  if f:sub(o + 3, o + 3) == '1' then
    local k = KEYS[i + 1] .. ':conc'
    local s = redis.call('ZSCORE', k, rid)
    if s and tonumber(s) > now then
      redis.call('ZADD', k, expiry, rid)
      keep_at_least(k, math.floor(tonumber(ARGV[2]) / 1000) + 1000)
    else
      redis.call('ZREM', k, rid)
      held = 0
    end
  end
end
redis.call('HSET', KEYS[1], 'x', expiry)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return held
"""
)

USAGE = (
    _COMMON
    + """
local base = KEYS[1]
local sec, now = clock()
local day_id, month_id = periods(sec, now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', base .. ':rpm', '-inf', now - tonumber(ARGV[1]))
redis.call('ZREMRANGEBYSCORE', base .. ':conc', '-inf', now)
return {
  redis.call('ZCARD', base .. ':rpm'),
  prune_tpm(base, now - tonumber(ARGV[1])),
  redis.call('ZCARD', base .. ':conc'),
  tonumber(redis.call('GET', base .. ':d:' .. day_id) or '0'),
  tonumber(redis.call('GET', base .. ':m:' .. month_id) or '0'),
}
"""
)
