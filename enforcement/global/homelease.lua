
-- A lease or return on a global bucket at the home that also charges the
-- key's calendar quota there (redisstore's state.lua and lease.lua are
-- prepended: the same bucket, the same arithmetic as every lease). A
-- lease takes no more than the quota has left, and charges what it got;
-- a return gives the tokens back to the quota window they were charged in
-- (the window's counter is in KEYS[2]).
--
-- KEYS[1]  the global bucket
-- KEYS[2]  the quota counter of the window (same hash tag)
-- ARGV     rate, burst, mode, a, want, quota limit, expiry of the counter (unix ms)
--
-- Returns { granted, tokens_left_floor, retry_ms, reset_ms, now_ms, clock_back, quota_used }.
local rate, burst, mode = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local a, want, qlimit, expiry = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if mode == 'lease' then
  local room = qlimit - used
  if room < a then
    return { 0, 0, 0, 0, math.floor(now / 1000), 0, used }
  end
  want = math.min(want, room)
end
local granted, left, retry, reset, now_ms, back = lease(KEYS[1], rate, burst, mode, a, want, now)
if mode == 'lease' and granted > 0 then
  used = redis.call('INCRBY', KEYS[2], granted)
  redis.call('PEXPIREAT', KEYS[2], expiry)
elseif mode == 'return' and used > 0 then
  used = redis.call('DECRBY', KEYS[2], math.min(a, used))
end
return { granted, left, retry, reset, now_ms, back, used }
