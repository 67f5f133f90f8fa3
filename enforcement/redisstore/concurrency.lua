-- The slots of one concurrency limit (enforcement/slots): a sorted set of
-- lease members scored by the end of their lease, in ms on Redis's own
-- clock. Every operation first drops the expired members, so a slot whose
-- holder died comes back at its lease's end with no sweeper, and a late
-- release or renew finds nothing to act on.
--
-- KEYS[1]  the set (keyslot.SlotSetKey)
-- ARGV[1]  acquire | renew | release
-- ARGV[2]  the lease's member
-- acquire: ARGV[3] limit (the class's), ARGV[4] capacity, ARGV[5] ttl ms
-- renew:   ARGV[3] ttl ms
--
-- Reply {ok, held, ms, now}: acquire → ok 1 admitted (ms = the lease's
-- end), else 0 and ms = time until the earliest lease ends, with a fifth
-- element 1 (every slot held) or 2 (the class's share held); renew → ok 1
-- renewed (ms = the new end), 0 not held; release → ok 1 freed, 0 not held.
local key, op, member = KEYS[1], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

-- The set lives exactly as long as its longest lease.
local function expire_with_last()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, last[2])
  end
end

if op == 'acquire' then
  local limit, capacity, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local held = redis.call('ZCARD', key)
  if redis.call('ZSCORE', key, member) then
    -- The same member again (a retried call): it holds its one slot.
    redis.call('ZADD', key, now + ttl, member)
    expire_with_last()
    return {1, held, now + ttl, now}
  end
  if held >= limit then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local wait = ttl
    if first[2] then
      wait = tonumber(first[2]) - now
    end
    local reason = 2
    if held >= capacity then
      reason = 1
    end
    return {0, held, wait, now, reason}
  end
  redis.call('ZADD', key, now + ttl, member)
  expire_with_last()
  return {1, held + 1, now + ttl, now}
elseif op == 'renew' then
  local ttl = tonumber(ARGV[3])
  local score = redis.call('ZSCORE', key, member)
  if not score then
    return {0, redis.call('ZCARD', key), 0, now}
  end
  local ends = math.max(tonumber(score), now + ttl)
  redis.call('ZADD', key, 'XX', ends, member)
  expire_with_last()
  return {1, redis.call('ZCARD', key), ends, now}
elseif op == 'release' then
  local freed = redis.call('ZREM', key, member)
  return {freed, redis.call('ZCARD', key), 0, now}
end
return redis.error_reply('concurrency.lua: unknown operation ' .. tostring(op))
