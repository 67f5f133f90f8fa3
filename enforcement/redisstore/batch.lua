
-- Many decisions in one call (decide.lua is prepended): the auto-pipelined
-- store sends a whole batch as one EVALSHA, so Redis parses one command,
-- runs one script call and reads the clock once for all of them, and the
-- numbers cross the wire packed instead of as text.
--
-- KEYS[2i-1], KEYS[2i]  bucket and quota keys of decision i
-- ARGV[1]  6 little-endian doubles per decision: rate, burst, cost, quota
--          limit, quota window end (ms), soft limit (%)
--
-- Returns { results, [i, error, ...] }: results is 8 little-endian doubles
-- per decision (as decide returns them; all integers below 2^53, exact);
-- a decision whose Redis call failed (a key of the wrong type) is all
-- zeros there and is listed after it with its error, and the others stand.
-- Decisions run in order, each one atomic, as separate calls would.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local args = ARGV[1]
local out, failed = {}, { '' }
local pos = 1
for i = 1, #KEYS / 2 do
  local rate, burst, cost, qlimit, qend, soft
  rate, burst, cost, qlimit, qend, soft, pos = struct.unpack('<dddddd', args, pos)
  local ok, a, b, c, d, e, f, g, h = pcall(decide, KEYS[2 * i - 1], KEYS[2 * i], rate, burst, cost, qlimit, qend, soft, now)
  if ok then
    out[i] = struct.pack('<dddddddd', a, b, c, d, e, f, g, h)
  else
    out[i] = string.rep('\0', 64)
    local err = a -- a string, or a table { err = ... } from redis.call
    if type(err) == 'table' then err = err.err end
    failed[#failed + 1] = i
    failed[#failed + 1] = tostring(err)
  end
end
failed[1] = table.concat(out)
return failed
