-- Token leasing on the same bucket as bucket.lua: the same stored state
-- (state.lua, prepended: tokens and µs of the last update on Redis TIME), the
-- same lazy refill, clamp and TTL, so leased and unleased decisions spend one
-- bucket.
--
-- KEYS[1]  the bucket
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, the capacity
-- ARGV[3]  mode: "lease" or "return"
-- ARGV[4]  lease: the least the caller needs (its request's cost, ≥ 1);
--          return: tokens given back (≥ 0)
-- ARGV[5]  lease: the most the caller wants (the block, ≥ ARGV[4])
--
-- lease: grants min(want, floor(tokens)) whole tokens when at least `need`
-- are there (never more than are there), else grants 0 and says when `need`
-- will be there. return: adds the tokens back, capped at burst (tokens that
-- would overflow are the refill that happened while they were out).
--
-- Returns { granted, tokens_left_floor, retry_ms, reset_ms, now_ms, clock_back }.

local rate  = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local mode  = ARGV[3]
local a     = tonumber(ARGV[4])
local eps   = 1e-9

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tokens, ts = load_bucket(KEYS[1])
local existed = tokens ~= nil
local back = 0
if not existed then
  tokens = burst
else
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
    back = 1
    now = ts
  end
  tokens = math.min(burst, tokens + elapsed * rate / 1e6)
end

local granted = 0
local retry_ms = 0
if mode == 'lease' then
  local want = tonumber(ARGV[5])
  local whole = math.floor(tokens + eps)
  if whole >= a then
    granted = math.min(want, whole)
    tokens = math.max(0, tokens - granted)
  else
    retry_ms = math.ceil((a - tokens) / rate * 1000 - eps)
  end
elseif mode == 'return' then
  tokens = math.min(burst, tokens + a)
else
  return redis.error_reply('lease.lua: unknown mode ' .. tostring(mode))
end

local reset_ms = math.max(0, math.ceil((burst - tokens) / rate * 1000 - eps))
save_bucket(KEYS[1], tokens, now, reset_ms, existed)

return { granted, math.floor(tokens + eps), retry_ms, reset_ms, math.floor(now / 1000), back }
