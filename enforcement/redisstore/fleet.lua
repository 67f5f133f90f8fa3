-- The fleet's heartbeat: each limiter instance keeps a member in one sorted
-- set, scored by the last time (Redis TIME, ms) it beat; members that have
-- not beaten within the TTL are gone. Returns the live count after this beat.
--
-- KEYS[1]  the fleet's sorted set
-- ARGV[1]  this instance's member name
-- ARGV[2]  TTL, ms (> 0)
-- ARGV[3]  "beat" or "leave"

local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
-- The set outlives its last member by one TTL, then evaporates.
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])
