-- A settle on a global limit (pool.lua is prepended): the actual cost of a
-- reservation (reserve.lua) moves the pool by actual − estimate (settle),
-- at most once. The record is replaced by the settled marker "s" for one
-- more TTL, so a second settle, or this one sent again, is answered
-- "already settled" and charges nothing. With no record, unrecorded = 1
-- (a reservation made while the region's Redis could not be asked, or a
-- charge: a settle of an id of its own) charges the whole cost under the
-- same marker; otherwise the reservation is unknown or expired (its
-- estimate, spent when it was made, stands).
--
-- KEYS[1]  the pool
-- KEYS[2]  the reservation record
-- ARGV     cost, unrecorded ("1" or "0"), escrow ("1" or "0"), escrow
--          rate, escrow burst, the record's TTL ms, the pool's TTL ms
--
-- Returns { status, estimate, remaining, debt, retry_ms, now_us,
-- quota_used }: status 1 settled, -1 no such reservation, -2 already
-- settled. remaining is whole tokens in the pool (and the escrow with the
-- home unreachable), rounded down: negative in debt; retry_ms the time
-- until one token is there at the region's share of the global refill.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost, escrow = tonumber(ARGV[1]), ARGV[3] == '1'
local erate, eburst = tonumber(ARGV[4]), tonumber(ARGV[5])
local raw = redis.call('GET', KEYS[2])
local estimate, src = 0, ''
if raw then
  if string.sub(raw, 1, 1) ~= 'g' or #raw < 9 then
    return { -2, 0, 0, 0, 0, now, 0 }
  end
  estimate = struct.unpack('<d', raw, 2)
  src = string.sub(raw, 10)
elseif ARGV[2] ~= '1' then
  return { -1, 0, 0, 0, 0, now, 0 }
end
redis.call('SET', KEYS[2], 's', 'PX', tonumber(ARGV[6]))
local p = load_pool(KEYS[1])
settle(p, cost - estimate, src, escrow, erate, eburst, now)
save_pool(KEYS[1], p, tonumber(ARGV[7]))
local left = p.tokens
if escrow then
  left = p.tokens + escrow_at(p, now, erate, eburst)
end
local debt = 0
if left < -EPS then
  debt = math.ceil(-left - EPS)
end
local retry = 0
if left + EPS < 1 then
  retry = wait_ms(1 - left, erate)
end
return { 1, estimate, math.floor(left + EPS), debt, retry, now, quota_used(p) }
