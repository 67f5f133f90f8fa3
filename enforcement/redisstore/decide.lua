-- The token-bucket decision (with an optional calendar quota) that both
-- bucket.lua (one decision per call) and batch.lua (many per call) run: it
-- is prepended to each, after state.lua (the bucket's stored form and
-- arithmetic). Redis runs a script without interleaving any other command,
-- so the read, the decision and the write below are one step: the
-- check-then-act race between replicas cannot happen.
--
-- bkey     the bucket (state.lua: tokens and µs of the last update)
-- qkey     quota counter of the current window (same hash tag as bkey)
-- rate     tokens per second (> 0)
-- burst    the capacity
-- cost     0 = spend nothing, write nothing
-- qlimit   quota limit per window (0 = no quota)
-- qend     quota window end, ms since the epoch
-- soft     soft limit, percent (0 = none)
-- floor    tokens the request must leave in the bucket (limits.Limit.Floor:
--          (1 - its priority class's share) x burst; 0 = the whole bucket)
-- now      the store's clock, µs (TIME): every replica refills on one timeline
-- dry      true (peek.lua): answer exactly as a spend would, writing nothing
--          (the bucket and the counter stay byte for byte as they were)
--
-- allowed is 1, 0 (refused: the bucket or the quota lacks the cost), or 2
-- (shed: the tokens are there, but spending them would take the bucket
-- below the request's floor, which is kept for higher classes; retry_ms
-- is then the time until the bucket holds floor + cost).
--
-- Returns allowed, remaining, retry_ms, reset_ms, now_us, warning, quota_used, clock_back
-- (now_us: the bucket's instant, µs, below 2^53 and so exact: the decision
-- event carries it, and a replay decides the bucket at it).
local function decide(bkey, qkey, rate, burst, cost, qlimit, qend, soft, floor, now, dry)
  -- clock: the store's time, for the quota window; now becomes the bucket's
  -- (the later of the two when the clock stepped back).
  local clock = now
  local tokens, back, existed
  tokens, now, back, existed = refill(bkey, rate, burst, now)

  local qused = 0
  if qlimit > 0 then
    qused = tonumber(redis.call('GET', qkey) or '0')
  end

  local bucket_ok = tokens + EPS >= cost + floor
  local quota_ok = qlimit == 0 or qused + cost <= qlimit
  local allowed = bucket_ok and quota_ok
  -- Shed: refused only by the floor. A request whose class's share can
  -- never hold its cost (cost + floor > burst) waits for a full bucket.
  local shed = not bucket_ok and quota_ok and tokens + EPS >= cost
  local retry_ms = 0
  if allowed then
    tokens = math.max(0, tokens - cost)
    if qlimit > 0 and cost > 0 then
      if dry then
        qused = qused + cost
      else
        qused = redis.call('INCRBY', qkey, cost)
        redis.call('PEXPIREAT', qkey, qend + 60000)
      end
    end
  else
    if not bucket_ok then
      local need = cost + floor
      if need > burst then
        need = math.max(burst, cost)
      end
      retry_ms = wait_ms(need - tokens, rate)
    end
    if not quota_ok then
      retry_ms = math.max(retry_ms, math.ceil(qend - clock / 1000))
    end
  end

  local reset_ms
  if dry then
    reset_ms = wait_ms(burst - tokens, rate)
  else
    reset_ms = save_bucket(bkey, tokens, now, rate, burst, existed)
  end

  -- limits.SoftLimitReached in Go: consumption of the bucket, or of the
  -- quota, at or above soft percent.
  local warning = 0
  if soft > 0 then
    if (burst - tokens) / burst * 100 + EPS >= soft then
      warning = 1
    elseif qlimit > 0 and qused / qlimit * 100 + EPS >= soft then
      warning = 1
    end
  end

  local verdict = 0
  if allowed then
    verdict = 1
  elseif shed then
    verdict = 2
  end
  return verdict, whole(tokens), retry_ms, reset_ms, now, warning, qused, back
end
