-- One settle (state.lua and settle.lua are prepended).
--
-- KEYS[1..3]  bucket, quota counter of the current window, reservation record
-- ARGV        rate, burst, cost, quota limit, quota window end (ms),
--             unrecorded ("1" or "0"), TTL (ms)
local t = redis.call('TIME')
return settle(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
              tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]),
              tonumber(t[1]) * 1000000 + tonumber(t[2]))
