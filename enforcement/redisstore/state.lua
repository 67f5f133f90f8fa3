-- The stored state of a token bucket, for every script that reads or writes
-- one (decide.lua, lease.lua; it is prepended to each): one string of two
-- little-endian doubles, the tokens and the µs (Redis TIME) of the last
-- update, under a key whose TTL is the time the bucket needs to refill, so
-- an idle key evaporates once it is full (a full bucket is the state a
-- missing key starts in). One GET to read and one SET … PX to write: a hash
-- ({t, ts} as text) took HMGET, HSET and PEXPIRE and two string.format
-- calls, and each redis.call is most of a decision's cost inside Redis
-- (issue 15: Redis's script time per decision in BenchmarkSharedTier/
-- pipelined, 10.1 and 11.7 µs before, 8.0 and 9.4 after).
-- Store.BucketKey names the key (":b2:", the second layout, so that an
-- instance still on the hash layout never reads this one as its own);
-- redisstore.DecodeBucket reads the same bytes in Go.

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

-- save_bucket stores the bucket with the TTL reset_ms, or deletes it when
-- reset_ms says it is full; existed: load_bucket found it.
local function save_bucket(key, tokens, now, reset_ms, existed)
  if reset_ms <= 0 then
    if existed then
      redis.call('DEL', key)
    end
  else
    redis.call('SET', key, struct.pack('<dd', tokens, now), 'PX', reset_ms)
  end
end

