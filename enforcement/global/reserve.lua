-- A reservation on a global limit (pool.lua is prepended): one decision
-- (decide) that, when allowed, records the reservation for its TTL in the
-- same script: its estimate and where it was spent (the pool or the
-- escrow), so that the settle gives a refund back there. A record already
-- there means this very call was sent again: it spends nothing the second
-- time and answers allowed with the pool as it is.
--
-- KEYS[1]  the pool
-- KEYS[2]  the reservation record (Global.recordKey: the pool's hash tag)
-- KEYS[3]  the region's view of the global bucket, as decide.lua's KEYS[2]
--          (given only for a limit with a soft limit)
-- ARGV     as decide.lua's (cost, escrow, escrow rate, escrow burst, retry
--          ms, pool TTL ms), then the record's TTL ms
--
-- The record: "g", the estimate (a little-endian double), then "p" or "e".
-- Returns what decide.lua returns.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local p = load_pool(KEYS[1])
local home_left, home_age = -1, 0
if KEYS[3] then
  home_left, home_age = view_of(redis.call('GET', KEYS[3]), now)
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return { 1, 0, math.floor(p.tokens + EPS), 0, now, quota_used(p),
           math.floor(p.tokens + EPS), home_left, home_age }
end
local cost = tonumber(ARGV[1])
local allowed, regional, remaining, retry, src = decide(p, cost, ARGV[2] == '1',
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), now)
save_pool(KEYS[1], p, tonumber(ARGV[6]))
if allowed == 1 then
  redis.call('SET', KEYS[2], 'g' .. struct.pack('<d', cost) .. src, 'PX', tonumber(ARGV[7]))
end
return { allowed, regional, math.floor(remaining + EPS), retry, now, quota_used(p),
         math.floor(p.tokens + EPS), home_left, home_age }
