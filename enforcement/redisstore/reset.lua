-- A support reset of one key (state.lua is prepended), applied with its
-- audit record in one step: the bucket or the quota counter is set, the
-- record (before and after) is pushed on the key's audit list, and the
-- reset is announced so that every limiter drops its local view.
--
-- KEYS[1]  the bucket (state.lua)
-- KEYS[2]  the quota counter of the current window (same hash tag)
-- KEYS[3]  the audit list (keyslot.ResetLogKey)
-- KEYS[4]  the reset's mark (keyslot.ResetMarkKey): a reset sent twice applies once
-- ARGV     rate, burst, op (refill | grant | clear-debt | quota), grant,
--          the audit record (JSON, without before/after/time), channel,
--          announcement, audit records kept
--
-- Returns the audit record as pushed (JSON), or false when the mark was
-- already there (the same reset, applied before).
local rate, burst, op, grant = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', 86400000) then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tokens, at, _, existed = refill(KEYS[1], rate, burst, now)
local qused = tonumber(redis.call('GET', KEYS[2]) or '0')
local rec = cjson.decode(ARGV[5])
rec['before'] = { tokens = tokens, quotaUsed = qused }
if op == 'refill' then
  tokens = burst
elseif op == 'grant' then
  tokens = math.min(burst, tokens + grant)
elseif op == 'clear-debt' then
  tokens = math.max(0, tokens)
elseif op == 'quota' then
  if qused > 0 then
    redis.call('DEL', KEYS[2])
  end
  qused = 0
else
  error('unknown reset op ' .. op)
end
if op ~= 'quota' then
  save_bucket(KEYS[1], tokens, at, rate, burst, existed)
end
rec['after'] = { tokens = tokens, quotaUsed = qused }
local enc = cjson.encode(rec)
redis.call('LPUSH', KEYS[3], enc)
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
redis.call('PUBLISH', ARGV[6], ARGV[7])
return enc
