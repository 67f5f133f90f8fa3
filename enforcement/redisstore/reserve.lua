-- A reservation (state.lua and decide.lua are prepended): one decision
-- that, when allowed, records the reservation under rkey for its TTL, in
-- the same script, so the spend and the record land together or not at
-- all (a decision that fails on a key of the wrong type leaves a record
-- whose id was never handed out; it expires). A record already there
-- means this very call was sent again (a client resending after a lost
-- reply): it spends nothing the second time and answers allowed with the
-- bucket as it is.
--
-- bkey, qkey, rkey  the bucket, the quota counter of the current window
--                   and the reservation record (one hash tag;
--                   Store.ReservationKey)
-- rate, burst, cost, qlimit, qend (ms), soft (%), floor  as decide's
-- ttl               the record's life, ms
-- now               the store's clock, µs
--
-- The record: "r", the estimate (a little-endian double), then the quota
-- key the estimate counted in ("" without quota); settle.lua reads it.
--
-- An allowed reservation is also entered in the key's index of open
-- reservations (reservation_index, state.lua), scored by its expiry.
--
-- reservecall.lua runs it once per call, batch.lua many times; it returns
-- what decide returns (allowed, remaining, retry_ms, reset_ms, now_us,
-- warning, quota_used, clock_back).
local function reserve(bkey, qkey, rkey, rate, burst, cost, qlimit, qend, soft, floor, ttl, now)
  local q = ''
  if qlimit > 0 then
    q = qkey
  end
  -- The record goes first, NX: one command finds a resent call and
  -- records a new one; a refused reservation takes its record back.
  if not redis.call('SET', rkey, 'r' .. struct.pack('<d', cost) .. q, 'NX', 'PX', ttl) then
    local _, b, _, d, e, f, g, h = decide(bkey, qkey, rate, burst, 0, qlimit, qend, soft, 0, now)
    return 1, b, 0, d, e, f, g, h
  end
  local a, b, c, d, e, f, g, h = decide(bkey, qkey, rate, burst, cost, qlimit, qend, soft, floor, now)
  if a ~= 1 then
    redis.call('DEL', rkey)
    return a, b, c, d, e, f, g, h
  end
  -- Listed in the key's index until settled or expired (support inspect):
  -- entries past their expiry are dropped here, so the index holds at
  -- most the key's open reservations and lives as long as the last.
  local idx, id = reservation_index(rkey)
  if idx then
    local now_ms = math.floor(now / 1000)
    redis.call('ZREMRANGEBYSCORE', idx, '-inf', now_ms)
    redis.call('ZADD', idx, now_ms + ttl, id)
    if redis.call('PTTL', idx) < ttl then
      redis.call('PEXPIRE', idx, ttl)
    end
  end
  return a, b, c, d, e, f, g, h
end
