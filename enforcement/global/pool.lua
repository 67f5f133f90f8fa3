-- A region's pool of one key's global budget, in the region's own Redis,
-- and the region's escrow for that key. Prepended to every pool script.
--
-- Stored form: one string of seven little-endian doubles under the pool key
-- (Pools.poolKey, hash-tagged by the rate-limit key):
--   tokens  tokens leased from the global bucket and not yet spent; below
--           zero when a settle or a charge spent more than the pool held:
--           the region owes the global bucket that much (its debt), and
--           the refiller leases it back before anything else passes
--   wanted  every cost asked of the pool since it was created (allowed or
--           not; a cost of 0 asks for one token, a settle's excess and a
--           charge are asked too): the region's demand, which the refiller
--           measures
--   spent   every cost allowed (from the pool or the escrow), settles' and
--           charges' differences included
--   esc     the escrow bucket's tokens (below zero: in debt)
--   ets     the escrow bucket's last update, µs (Redis TIME); 0 = never
--           used (the escrow is full)
--   qused   the key's quota spent in its window as the home last counted
--           it (the pool's own tokens included: they were charged there)
--   owed    tokens spent on the escrow not yet charged to the home's quota
--           (the refiller charges them once the home answers)
-- The key's TTL is renewed by every write, so an abandoned pool evaporates.
--
-- Beside it, the region's VIEW of the global bucket (Global.viewKey, same
-- hash tag): two little-endian doubles, the whole tokens the home's bucket
-- held after the refiller's latest lease or return there, and when the
-- region learned it (µs, this Redis's TIME). Only the refiller writes it
-- (fill.lua), only a limit with a soft limit reads it (decide.lua). It is a
-- key of its own so that a pool keeps the form every limiter reads.

local EPS = 1e-9

local function parse_pool(key, raw)
  if not raw then
    return { tokens = 0, wanted = 0, spent = 0, esc = -1, ets = 0, qused = 0, owed = 0 }
  end
  if #raw ~= 56 then
    error('the value of ' .. key .. ' is not a pool (' .. #raw .. ' bytes, not 56)')
  end
  local tokens, wanted, spent, esc, ets, qused, owed = struct.unpack('<ddddddd', raw)
  return { tokens = tokens, wanted = wanted, spent = spent, esc = esc, ets = ets, qused = qused, owed = owed }
end

local function load_pool(key)
  return parse_pool(key, redis.call('GET', key))
end

local function save_pool(key, p, ttl_ms)
  redis.call('SET', key, struct.pack('<ddddddd', p.tokens, p.wanted, p.spent, p.esc, p.ets, p.qused, p.owed), 'PX', ttl_ms)
end

-- view_of reads the region's view of the global bucket (raw: its stored
-- value, or nil/false): the home's tokens, -1 when there is no view, and
-- how long ago (µs) the region learned them.
local function view_of(raw, now)
  if raw and #raw == 16 then
    local left, at = struct.unpack('<dd', raw)
    return left, math.max(0, now - at)
  end
  return -1, 0
end

-- wait_ms is the time until deficit tokens are there at rate, ms rounded up.
local function wait_ms(deficit, rate)
  if deficit <= 0 then
    return 0
  end
  return math.ceil(deficit / rate * 1000 - EPS)
end

-- escrow_at is the escrow bucket (erate, eburst) refilled up to now (µs).
local function escrow_at(p, now, erate, eburst)
  if p.ets == 0 then
    return eburst
  end
  local elapsed = now - p.ets
  if elapsed < 0 then
    elapsed = 0
  end
  return math.min(eburst, p.esc + elapsed * erate / 1e6)
end

-- quota_used is the home's count less what the pool still holds (plus
-- what it owes).
local function quota_used(p)
  return math.max(0, math.floor(p.qused - p.tokens + EPS))
end

-- decide is one decision on the pool p: spend cost from the pool; when
-- the pool cannot cover it and the home is unreachable (escrow), from the
-- escrow bucket (erate, eburst). A cost of 0 spends nothing but needs one
-- whole token there: it is over the limit while the pool is empty or in
-- debt. In debt, a rejection waits for the region's share of the global
-- refill (erate) to pay the debt off and afford the cost; otherwise it
-- waits retry ms.
--
-- Returns allowed, regional, remaining, retry_ms, and where the cost was
-- spent: 'p' (the pool), 'e' (the escrow) or '' (nowhere).
local function decide(p, cost, escrow, erate, eburst, retry, now)
  local need = math.max(cost, 1)
  p.wanted = p.wanted + need
  if p.tokens + EPS >= need then
    p.tokens = math.max(0, p.tokens - cost)
    p.spent = p.spent + cost
    return 1, 0, p.tokens, 0, 'p'
  end
  if p.tokens < -EPS then
    retry = math.max(retry, wait_ms(need - p.tokens, erate))
  end
  if not escrow then
    return 0, 0, p.tokens, retry, ''
  end
  local esc = escrow_at(p, now, erate, eburst)
  local allowed, src = 0, ''
  if esc + EPS >= need then
    esc = math.max(0, esc - cost)
    p.spent = p.spent + cost
    p.owed = p.owed + cost
    allowed, retry, src = 1, 0, 'e'
  else
    retry = wait_ms(need - esc, erate)
  end
  p.esc, p.ets = esc, now
  return allowed, 1, p.tokens + esc, retry, src
end

-- settle moves the pool p by delta (a settle's actual cost − its
-- estimate, or a charge's cost) for a cost spent from src ('p', 'e' or
-- ''). A refund goes back where the estimate was spent: to the pool (the
-- refiller returns what it does not need to the home), or to the escrow,
-- capped at its burst, and off what the quota is owed. An excess is spent
-- from the pool even below zero: the region then owes the global bucket,
-- and the refiller leases the debt from it. With the home unreachable
-- (escrow) an excess is spent from what the pool holds, then from the
-- escrow, even below zero (and owed to the quota).
local function settle(p, delta, src, escrow, erate, eburst, now)
  if delta < 0 then
    local back = -delta
    if src == 'e' then
      p.esc, p.ets = math.min(eburst, escrow_at(p, now, erate, eburst) + back), now
      p.owed = math.max(0, p.owed - back)
    else
      p.tokens = p.tokens + back
    end
    p.spent = p.spent - back
    return
  end
  p.wanted = p.wanted + delta
  p.spent = p.spent + delta
  if not escrow then
    p.tokens = p.tokens - delta
    return
  end
  local from_pool = math.min(delta, math.max(0, p.tokens))
  p.tokens = p.tokens - from_pool
  local rest = delta - from_pool
  if rest > 0 then
    p.esc, p.ets = escrow_at(p, now, erate, eburst) - rest, now
    p.owed = p.owed + rest
  end
end
