-- One slot operation alone (slotset.lua is prepended).
--
-- KEYS[1]  the set (keyslot.SlotSetKey)
-- ARGV     op (1 acquire, 2 renew, 3 release), member, limit, capacity,
--          ttl (ms)
--
-- Returns slotset's {ok, held, ms, now, reason}.
local t = redis.call('TIME')
return slotset(KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
               tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
