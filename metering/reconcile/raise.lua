-- Raise the quota counters of ONE rate-limit key to at least what the usage
-- record says was spent, in one atomic step. Never lowers a counter: a
-- counter ahead of the record holds decisions whose events are still on
-- their way to ClickHouse (or were never metered), and those were spent.
--
-- KEYS[i]       quota counter i (every KEYS[i] has the same hash tag: one slot)
-- ARGV[2i - 1]  the allowed cost recorded for counter i in its window
-- ARGV[2i]      counter i's expiry, ms since the epoch (window end + 60 s,
--               the same PEXPIREAT the bucket script sets on every spend)
--
-- Returns { before_1, raised_1, before_2, raised_2, ... }: the value found
-- (0 when absent) and 1 when it was raised.

local out = {}
for i, key in ipairs(KEYS) do
  local target = tonumber(ARGV[2 * i - 1])
  local before = tonumber(redis.call('GET', key) or '0')
  local raised = 0
  if target > before then
    redis.call('SET', key, string.format('%d', target))
    redis.call('PEXPIREAT', key, ARGV[2 * i])
    raised = 1
  end
  out[#out + 1] = before
  out[#out + 1] = raised
end
return out
