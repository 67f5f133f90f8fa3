-- One decision on a global limit (pool.lua is prepended): spend from the
-- pool; when the pool cannot cover the cost and the limiter knows the home
-- unreachable, from the escrow bucket (rate ÷ N, burst ÷ N).
--
-- KEYS[1]  the pool
-- KEYS[2]  the region's view of the global bucket: given only for a limit
--          with a soft limit (read with the pool in one MGET)
-- ARGV     cost, escrow (0 or 1), escrow rate, escrow burst, retry ms of a
--          pool rejection, TTL ms
--
-- Returns { allowed, regional, remaining, retry_ms, now_us, quota_used,
-- pool, home_left, home_age_us } (quota_used: the home's count less what
-- the pool still holds; pool: the pool's whole tokens after the decision;
-- home_left: the view's tokens, -1 when there is none, home_age_us how
-- long ago the region learned them).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local p
local home_left, home_age = -1, 0
if KEYS[2] then
  local raws = redis.call('MGET', KEYS[1], KEYS[2])
  p = parse_pool(KEYS[1], raws[1])
  home_left, home_age = view_of(raws[2], now)
else
  p = load_pool(KEYS[1])
end
local allowed, regional, remaining, retry = decide(p, tonumber(ARGV[1]), ARGV[2] == '1',
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), now)
save_pool(KEYS[1], p, tonumber(ARGV[6]))
return { allowed, regional, math.floor(remaining + EPS), retry, now, quota_used(p),
         math.floor(p.tokens + EPS), home_left, home_age }
