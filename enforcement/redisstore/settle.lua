-- A settle (state.lua is prepended): charge a reservation's actual cost
-- on its bucket, at most once. The record (reserve.lua) gives the
-- estimate; the bucket moves by estimate − cost: a refund, capped at
-- burst, or a charge that may take it below zero (debt). The record is
-- then replaced by the settled marker "s" for one more TTL, so a second
-- settle, or this one sent again, is answered "already settled" and
-- charges nothing. A reservation with no record (unrecorded = 1: made
-- while the store could not be asked, or a charge, which is a settle of an
-- id of its own) charges the whole cost, under the same marker.
--
-- bkey, qkey, rkey  the bucket, the quota counter of the current window
--                   and the reservation record (one hash tag)
-- rate, burst, cost, qlimit, qend (ms), unrecorded ("1" or "0"), ttl (ms)
-- now               the store's clock, µs
--
-- settlecall.lua runs it once per call on Redis TIME. It returns { status, estimate, remaining, debt, retry_ms, reset_ms, now_us,
-- quota_used, clock_back }: status 1 settled, -1 no such reservation (never
-- made, or expired: its estimate stands), -2 already settled.
local function settle(bkey, qkey, rkey, rate, burst, cost, qlimit, qend, unrecorded, ttl, now)
  local raw = redis.call('GET', rkey)
  local estimate, counted_in = 0, nil
  if raw then
    if string.sub(raw, 1, 1) ~= 'r' or #raw < 9 then
      return { -2, 0, 0, 0, 0, 0, now, 0, 0 }
    end
    estimate = struct.unpack('<d', raw, 2)
    counted_in = string.sub(raw, 10)
  elseif unrecorded ~= '1' then
    return { -1, 0, 0, 0, 0, 0, now, 0, 0 }
  end
  redis.call('SET', rkey, 's', 'PX', ttl)
  if raw then
    local idx, id = reservation_index(rkey)
    if idx then
      redis.call('ZREM', idx, id)
    end
  end

  local tokens, back, existed
  tokens, now, back, existed = refill(bkey, rate, burst, now)
  tokens = math.min(burst, tokens - (cost - estimate))
  local reset_ms = save_bucket(bkey, tokens, now, rate, burst, existed)

  -- The quota: the difference, in the window the estimate counted in.
  -- When that is an earlier window than this one, its counter (same hash
  -- tag) takes the difference while Redis still keeps it, and this window
  -- is charged nothing: the reservation's actual cost belongs to the
  -- window it was made in, as in the rollups. A settle with no record
  -- (made degraded, or a charge) charges the whole cost to this window.
  local qused = 0
  if qlimit > 0 then
    local delta = cost
    if counted_in == qkey then
      delta = cost - estimate
    elseif counted_in ~= nil and counted_in ~= '' then
      delta = 0
      if cost ~= estimate and redis.call('EXISTS', counted_in) == 1 then
        redis.call('INCRBY', counted_in, cost - estimate) -- keeps its TTL
      end
    end
    if delta ~= 0 then
      qused = redis.call('INCRBY', qkey, delta)
      redis.call('PEXPIREAT', qkey, qend + 60000)
    else
      qused = tonumber(redis.call('GET', qkey) or '0')
    end
  end

  local debt = 0
  if tokens < -EPS then
    debt = math.ceil(-tokens - EPS)
  end
  local retry_ms = 0
  if tokens + EPS < 1 then
    retry_ms = wait_ms(1 - tokens, rate)
  end
  return { 1, estimate, whole(tokens), debt, retry_ms, reset_ms, now, qused, back }
end
