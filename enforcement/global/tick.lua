-- The refiller's look at one pool (pool.lua is prepended): take or renew
-- the refill lock of (region, key), and read the pool.
--
-- KEYS[1]  the pool
-- KEYS[2]  the lock
-- ARGV     this instance's id, the lock's TTL ms
--
-- Returns { mine, tokens, wanted, spent, now_us, owed }.
local holder = redis.call('GET', KEYS[2])
local mine = 0
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
  mine = 1
elseif not holder then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
  mine = 1
end
local t = redis.call('TIME')
local p = load_pool(KEYS[1])
return { mine, math.floor(p.tokens + EPS), math.floor(p.wanted + EPS), math.floor(p.spent + EPS),
         tonumber(t[1]) * 1000000 + tonumber(t[2]), math.floor(p.owed + EPS) }
