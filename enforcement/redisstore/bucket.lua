
-- One decision (decide.lua is prepended).
--
-- KEYS[1]  bucket hash
-- KEYS[2]  quota counter of the current window (same hash tag as KEYS[1])
-- ARGV     rate, burst, cost, quota limit, quota window end (ms), soft limit (%),
--          floor (tokens the request must leave)
--
-- Returns { allowed, remaining, retry_ms, reset_ms, now_us, warning, quota_used, clock_back }.
local t = redis.call('TIME')
return { decide(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                tonumber(t[1]) * 1000000 + tonumber(t[2])) }
