-- The token-bucket decision (with an optional calendar quota) that both
-- bucket.lua (one decision per call) and batch.lua (many per call) run: it
-- is prepended to each, after state.lua (the bucket's stored form). Redis
-- runs a script without interleaving any other command, so the read, the
-- decision and the write below are one step: the check-then-act race between
-- replicas cannot happen.
--
-- bkey     the bucket (state.lua: tokens and µs of the last update)
-- qkey     quota counter of the current window (same hash tag as bkey)
-- rate     tokens per second (> 0)
-- burst    the capacity
-- cost     0 = spend nothing, write nothing
-- qlimit   quota limit per window (0 = no quota)
-- qend     quota window end, ms since the epoch
-- soft     soft limit, percent (0 = none)
-- now      the store's clock, µs (TIME): every replica refills on one timeline
--
-- Returns allowed, remaining, retry_ms, reset_ms, now_ms, warning, quota_used, clock_back.
local function decide(bkey, qkey, rate, burst, cost, qlimit, qend, soft, now)
  local eps = 1e-9
  local tokens, ts = load_bucket(bkey)
  local existed = tokens ~= nil
  local back = 0
  if not existed then
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
    qused = tonumber(redis.call('GET', qkey) or '0')
  end

  local bucket_ok = tokens + eps >= cost
  local quota_ok = qlimit == 0 or qused + cost <= qlimit
  local allowed = bucket_ok and quota_ok
  local retry_ms = 0
  if allowed then
    tokens = math.max(0, tokens - cost)
    if qlimit > 0 and cost > 0 then
      qused = redis.call('INCRBY', qkey, cost)
      redis.call('PEXPIREAT', qkey, qend + 60000)
    end
  else
    if not bucket_ok then
      retry_ms = math.ceil((cost - tokens) / rate * 1000 - eps)
    end
    if not quota_ok then
      retry_ms = math.max(retry_ms, math.ceil(qend - now / 1000))
    end
  end

  local reset_ms = math.max(0, math.ceil((burst - tokens) / rate * 1000 - eps))
  save_bucket(bkey, tokens, now, reset_ms, existed)

  local warning = 0
  if soft > 0 then
    if (burst - tokens) / burst * 100 + eps >= soft then
      warning = 1
    elseif qlimit > 0 and qused / qlimit * 100 + eps >= soft then
      warning = 1
    end
  end

  return allowed and 1 or 0, math.floor(tokens + eps), retry_ms, reset_ms, math.floor(now / 1000), warning, qused, back
end
