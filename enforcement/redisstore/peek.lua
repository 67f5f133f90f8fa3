-- One decision answered without spending (decide.lua is prepended): what
-- bucket.lua would answer, with nothing written (POST /check "peek").
--
-- KEYS and ARGV as bucket.lua's; the same reply.
local t = redis.call('TIME')
return { decide(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
                tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                tonumber(t[1]) * 1000000 + tonumber(t[2]), true) }
