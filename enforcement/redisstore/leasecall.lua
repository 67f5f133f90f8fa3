
-- One lease or return (state.lua and lease.lua are prepended).
--
-- KEYS[1]  the bucket
-- ARGV     rate, burst, mode, a, want (lease.lua)
--
-- Returns { granted, tokens_left_floor, retry_ms, reset_ms, now_ms, clock_back }.
local t = redis.call('TIME')
return { lease(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]),
               tonumber(ARGV[5]), tonumber(t[1]) * 1000000 + tonumber(t[2])) }
