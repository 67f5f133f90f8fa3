-- One reservation (state.lua, decide.lua and reserve.lua are prepended).
--
-- KEYS[1..3]  bucket, quota counter of the current window, reservation record
-- ARGV        rate, burst, cost, quota limit, quota window end (ms), soft
--             limit (%), floor, TTL (ms)
--
-- Returns { allowed, remaining, retry_ms, reset_ms, now_us, warning, quota_used, clock_back }.
local t = redis.call('TIME')
return { reserve(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                 tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                 tonumber(ARGV[8]), tonumber(t[1]) * 1000000 + tonumber(t[2])) }
