-- The token bucket every script that touches one shares (decide.lua,
-- lease.lua; this file is prepended to each): its stored form and its
-- arithmetic, written once so that a decision and a lease spend the same
-- bucket the same way. enforcement.Bucket is the same arithmetic in Go;
-- agree_test.go drives both through the same random sequences.
--
-- Stored form: one string of two little-endian doubles, the tokens and the
-- µs (Redis TIME) of the last update, under a key whose TTL is the time the
-- bucket needs to refill, so an idle key evaporates once it is full (a full
-- bucket is the state a missing key starts in). One GET to read and one
-- SET … PX to write, because each redis.call is most of a decision's cost
-- inside Redis (a hash took HMGET, HSET and PEXPIRE).
-- Store.BucketKey names the key (":b2:", the second layout, so that an
-- instance still on the hash layout never reads this one as its own);
-- redisstore.DecodeBucket reads the same bytes in Go.

-- EPS absorbs floating-point residue, so that waiting exactly the advertised
-- retry time always finds the tokens there (enforcement's epsilon).
local EPS = 1e-9

-- load_bucket returns tokens, ts (nil, nil when the key is absent).
local function load_bucket(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil, nil
  end
  if #raw ~= 16 then
    error('the value of ' .. key .. ' is not a bucket (' .. #raw .. ' bytes, not 16)')
  end
  local tokens, ts = struct.unpack('<dd', raw)
  return tokens, ts
end

-- refill reads the bucket of key and refills it lazily up to now (µs) at
-- rate tokens per second, capped at burst. A key never seen starts full.
-- Elapsed time is clamped at ≥ 0: a store clock that stepped back never
-- removes tokens, and the bucket then keeps its last update's time.
-- Returns tokens, the time to store it at, clock_back (0 or 1), existed.
local function refill(key, rate, burst, now)
  local tokens, ts = load_bucket(key)
  if tokens == nil then
    return burst, now, 0, false
  end
  local elapsed, back = now - ts, 0
  if elapsed < 0 then
    elapsed, back, now = 0, 1, ts
  end
  return math.min(burst, tokens + elapsed * rate / 1e6), now, back, true
end

-- wait_ms is the time until deficit more tokens are there at rate (0 when
-- none are missing): whole µs rounded up, then whole ms rounded up, as
-- enforcement's ceilUS and ceilMS round it, so that the Go and the Lua bucket
-- agree on every value (rounding once at the ms scale differs where float
-- residue sits between the two scales' EPS).
local function wait_ms(deficit, rate)
  local us = math.ceil(deficit / rate * 1e6 - EPS)
  if us > 9007199254740992 then
    us = 9007199254740992 -- 2^53 µs: enforcement's maxWaitUS, a debt's longest wait
  end
  if us <= 0 then
    return 0
  end
  return math.floor((us + 999) / 1000)
end

-- whole is the contract's "remaining": whole tokens, rounded down.
local function whole(tokens)
  return math.floor(tokens + EPS)
end

-- save_bucket stores the bucket with the TTL of the time it needs to be full
-- again, or deletes it when it is full (existed: refill found it), and
-- returns that time, ms.
local function save_bucket(key, tokens, now, rate, burst, existed)
  local reset_ms = wait_ms(burst - tokens, rate)
  if reset_ms <= 0 then
    if existed then
      redis.call('DEL', key)
    end
  else
    redis.call('SET', key, struct.pack('<dd', tokens, now), 'PX', reset_ms)
  end
  return reset_ms
end

-- The index of a key's open reservations and a reservation's id, from the
-- key of its record: "<prefix>:{key}:r:<id>" gives "<prefix>:{key}:rs"
-- and "<id>" (keyslot.ReservationKey and ReservationIndexKey; the same
-- hash tag, so the same Cluster slot). nil for a key of another form.
local function reservation_index(rkey)
  local head, id = string.match(rkey, '^(.*}):r:([^}]*)$')
  if not head then
    return nil, nil
  end
  return head .. ':rs', id
end
