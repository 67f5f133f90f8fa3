-- The slots of one concurrency limit (enforcement/slots): a sorted set of
-- lease members scored by the end of their lease, in ms on Redis's own
-- clock. Every operation first drops the expired members, so a slot whose
-- holder died comes back at its lease's end with no sweeper, and a late
-- release or renew finds nothing to act on. concurrency.lua calls it alone,
-- batch.lua beside the decisions of the auto-pipeline.
--
-- slotset(key, op, member, limit, capacity, ttl, now)
--   key       the set (keyslot.SlotSetKey)
--   op        1 acquire, 2 renew, 3 release
--   member    the lease's member
--   limit     acquire: the class's limit
--   capacity  acquire: the concurrency limit
--   ttl       acquire and renew: the lease time (ms)
--   now       Redis's clock (ms)
--
-- Returns {ok, held, ms, now, reason}: acquire → ok 1 admitted (ms = the
-- lease's end, reason 0), else 0 and ms = time until the earliest lease
-- ends, reason 1 (every slot held) or 2 (the class's share held); renew →
-- ok 1 renewed (ms = the new end), 0 not held; release → ok 1 freed, 0 not
-- held.
local function slotset(key, op, member, limit, capacity, ttl, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

  -- The set lives exactly as long as its longest lease.
  local function expire_with_last()
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if last[2] then
      redis.call('PEXPIREAT', key, last[2])
    end
  end

  if op == 1 then
    local held = redis.call('ZCARD', key)
    if redis.call('ZSCORE', key, member) then
      -- The same member again (a retried call): it holds its one slot.
      redis.call('ZADD', key, now + ttl, member)
      expire_with_last()
      return {1, held, now + ttl, now, 0}
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
    return {1, held + 1, now + ttl, now, 0}
  elseif op == 2 then
    local score = redis.call('ZSCORE', key, member)
    if not score then
      return {0, redis.call('ZCARD', key), 0, now, 0}
    end
    local ends = math.max(tonumber(score), now + ttl)
    redis.call('ZADD', key, 'XX', ends, member)
    expire_with_last()
    return {1, redis.call('ZCARD', key), ends, now, 0}
  elseif op == 3 then
    local freed = redis.call('ZREM', key, member)
    return {freed, redis.call('ZCARD', key), 0, now, 0}
  end
  error('slotset: unknown operation ' .. tostring(op))
end
