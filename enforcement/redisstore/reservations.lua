-- A key's open reservations, read without writing (support inspect).
--
-- KEYS[1]  the key's index of open reservations (keyslot.ReservationIndexKey)
-- ARGV[1]  how many to list, soonest to expire first
--
-- Returns { time_us, open, { id, expiry ms, record or false }... }: open
-- counts the index's entries not yet expired; a listed id whose record
-- is gone (evicted) has false.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local idx = KEYS[1]
local head = string.sub(idx, 1, -4) -- "<prefix>:{key}", without ":rs"
local out = { now_us, redis.call('ZCOUNT', idx, '(' .. now_ms, '+inf') }
local ids = redis.call('ZRANGEBYSCORE', idx, '(' .. now_ms, '+inf', 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
for i = 1, #ids, 2 do
  out[#out + 1] = { ids[i], tonumber(ids[i + 1]), redis.call('GET', head .. ':r:' .. ids[i]) }
end
return out
