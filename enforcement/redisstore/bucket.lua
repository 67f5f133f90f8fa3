-- One atomic token-bucket decision (with an optional calendar quota).
-- Redis runs a script without interleaving any other command, so the read,
-- the decision and the write below are one step: the check-then-act race
-- between replicas cannot happen.
--
-- KEYS[1]  bucket hash {t = tokens, ts = µs of the last update}
-- KEYS[2]  quota counter of the current window (same hash tag as KEYS[1])
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, the capacity
-- ARGV[3]  cost (0 = spend nothing, write nothing)
-- ARGV[4]  quota limit per window (0 = no quota)
-- ARGV[5]  quota window end, ms since the epoch
-- ARGV[6]  soft limit, percent (0 = none)
--
-- Returns { allowed, remaining, retry_ms, reset_ms, now_ms, warning, quota_used, clock_back }.

local rate   = tonumber(ARGV[1])
local burst  = tonumber(ARGV[2])
local cost   = tonumber(ARGV[3])
local qlimit = tonumber(ARGV[4])
local qend   = tonumber(ARGV[5])
local soft   = tonumber(ARGV[6])
local eps    = 1e-9

-- The store's own clock: every replica refills on one timeline.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local state = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
local back = 0
if tokens == nil or ts == nil then
  tokens = burst                     -- a key never seen starts full
else
  local elapsed = now - ts
  if elapsed < 0 then                -- the store's clock stepped back: never remove tokens
    elapsed = 0
    back = 1
    now = ts
  end
  tokens = math.min(burst, tokens + elapsed * rate / 1e6)
end

local qused = 0
if qlimit > 0 then
  qused = tonumber(redis.call('GET', KEYS[2]) or '0')
end

local bucket_ok = tokens + eps >= cost
local quota_ok = qlimit == 0 or qused + cost <= qlimit
local allowed = bucket_ok and quota_ok
local retry_ms = 0
if allowed then
  tokens = math.max(0, tokens - cost)
  if qlimit > 0 and cost > 0 then
    qused = redis.call('INCRBY', KEYS[2], cost)
    redis.call('PEXPIREAT', KEYS[2], qend + 60000)
  end
else
  if not bucket_ok then
    retry_ms = math.ceil((cost - tokens) / rate * 1000 - eps)
  end
  if not quota_ok then
    retry_ms = math.max(retry_ms, math.ceil(qend - now / 1000))
  end
end

-- Persist only what differs from "absent": a full bucket is the state a
-- missing key starts in, so it is deleted, and the TTL of a partial bucket is
-- exactly the time it needs to refill (an idle key evaporates when full).
local reset_ms = math.ceil((burst - tokens) / rate * 1000 - eps)
if reset_ms <= 0 then
  reset_ms = 0
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'ts', string.format('%d', now))
  redis.call('PEXPIRE', KEYS[1], reset_ms)
end

local warning = 0
if soft > 0 then
  if (burst - tokens) / burst * 100 + eps >= soft then
    warning = 1
  elseif qlimit > 0 and qused / qlimit * 100 + eps >= soft then
    warning = 1
  end
end

return { allowed and 1 or 0, math.floor(tokens + eps), retry_ms, reset_ms, math.floor(now / 1000), warning, qused, back }
