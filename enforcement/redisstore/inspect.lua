-- One key's state read at one moment, writing nothing (support inspect).
--
-- KEYS[1..n-1]  string keys (buckets, quota counters) of one hash tag
-- KEYS[n]       the key's reset audit list (keyslot.ResetLogKey)
-- ARGV[1]       how many audit records to return, newest first
--
-- Returns { time_us, { value or false, pttl ms } per string key, audit records }.
local t = redis.call('TIME')
local out = { tonumber(t[1]) * 1000000 + tonumber(t[2]) }
for i = 1, #KEYS - 1 do
  local v = redis.call('GET', KEYS[i])
  out[#out + 1] = { v, redis.call('PTTL', KEYS[i]) }
end
out[#out + 1] = redis.call('LRANGE', KEYS[#KEYS], 0, tonumber(ARGV[1]) - 1)
return out
