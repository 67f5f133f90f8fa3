-- A reservation: one decision (decide.lua, after state.lua, is prepended)
-- that, when allowed, records the reservation under KEYS[3] for its TTL,
-- in the same script, so the spend and the record land together or not at
-- all. A record already there means this very call was sent again (a
-- client resending after a lost reply): it spends nothing the second time
-- and answers allowed with the bucket as it is.
--
-- KEYS[1]  bucket
-- KEYS[2]  quota counter of the current window (same hash tag)
-- KEYS[3]  the reservation record (same hash tag; Store.ReservationKey)
-- ARGV     rate, burst, cost, quota limit, quota window end (ms), soft
--          limit (%), TTL (ms)
--
-- The record: "r", the estimate (a little-endian double), then the quota
-- key the estimate counted in ("" without quota); settle.lua reads it.
--
-- Returns { allowed, remaining, retry_ms, reset_ms, now_us, warning, quota_used, clock_back }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local qlimit, qend, soft = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[3]) == 1 then
  local r = { decide(KEYS[1], KEYS[2], rate, burst, 0, qlimit, qend, soft, now) }
  r[1], r[3] = 1, 0
  return r
end
local r = { decide(KEYS[1], KEYS[2], rate, burst, cost, qlimit, qend, soft, now) }
if r[1] == 1 then
  local q = ''
  if qlimit > 0 then
    q = KEYS[2]
  end
  redis.call('SET', KEYS[3], 'r' .. struct.pack('<d', cost) .. q, 'PX', tonumber(ARGV[7]))
end
return r
