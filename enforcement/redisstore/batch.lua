-- Many store calls in one (state.lua, decide.lua, reserve.lua, settle.lua
-- and slotset.lua are prepended): the auto-pipelined store sends a whole
-- batch as one EVALSHA, so Redis parses one command, runs one script call
-- and reads the clock once for all of them, and the numbers cross the wire
-- packed instead of as text. A call is a decision, a reservation, a settle
-- (a charge is a settle) or a slot operation, each the same function its
-- own script runs, so batching changes the transport, not the answer.
--
-- KEYS     per call in order: a decision's bucket and quota keys; a
--          reservation's or a settle's bucket, quota and record keys; a
--          slot operation's set
-- ARGV[1]  per call, little-endian doubles: the op (0 decision,
--          1 reservation, 2 settle, 3 slot operation), then rate, burst,
--          cost, quota limit, quota window end (ms), the soft limit (%)
--          (a settle: its unrecorded flag, 1 or 0, in the soft limit's
--          place) and the floor (decide.lua; 0 for a settle); a
--          reservation and a settle add the record's TTL (ms). A slot
--          operation's seven numbers are slotset's op, limit, capacity and
--          TTL (ms), two zeros and the member's length, and the member's
--          bytes follow them.
--
-- Returns { results, [i, error, ...] }: results is, per call, 8
-- little-endian doubles for a decision or a reservation (as decide
-- returns them) or a slot operation (slotset's five, then zeros), 9 for
-- a settle (as settle returns them), all integers
-- below 2^53 and so exact; a call whose Redis call failed (a key of the
-- wrong type) is all zeros there and is listed after it with its error,
-- and the others stand. Calls run in order, each one atomic, as separate
-- calls would.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local args = ARGV[1]
local out, failed = {}, { '' }
local pos, k, i = 1, 1, 0
local d8, d9 = '<dddddddd', '<ddddddddd'
while pos <= #args do
  i = i + 1
  local op, rate, burst, cost, qlimit, qend, soft, floor
  op, rate, burst, cost, qlimit, qend, soft, floor, pos = struct.unpack('<dddddddd', args, pos)
  local ok, a, b, c, d, e, f, g, h, j
  if op == 0 then
    ok, a, b, c, d, e, f, g, h = pcall(decide, KEYS[k], KEYS[k + 1], rate, burst, cost, qlimit, qend, soft, floor, now)
    k = k + 2
  elseif op == 3 then
    local sop, limit, capacity, ttl, member = rate, burst, cost, qlimit, nil
    member, pos = struct.unpack('c' .. floor, args, pos)
    local r
    ok, r = pcall(slotset, KEYS[k], sop, member, limit, capacity, ttl, math.floor(now / 1000))
    if ok then
      a, b, c, d, e, f, g, h = r[1], r[2], r[3], r[4], r[5], 0, 0, 0
    else
      a = r
    end
    k = k + 1
  else
    local ttl
    ttl, pos = struct.unpack('<d', args, pos)
    if op == 1 then
      ok, a, b, c, d, e, f, g, h = pcall(reserve, KEYS[k], KEYS[k + 1], KEYS[k + 2], rate, burst, cost, qlimit, qend, soft, floor, ttl, now)
    else
      local r
      ok, r = pcall(settle, KEYS[k], KEYS[k + 1], KEYS[k + 2], rate, burst, cost, qlimit, qend, soft == 1 and '1' or '0', ttl, now)
      if ok then
        a, b, c, d, e, f, g, h, j = r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]
      else
        a = r
      end
    end
    k = k + 3
  end
  if ok then
    if op == 2 then
      out[i] = struct.pack(d9, a, b, c, d, e, f, g, h, j)
    else
      out[i] = struct.pack(d8, a, b, c, d, e, f, g, h)
    end
  else
    out[i] = string.rep('\0', op == 2 and 72 or 64)
    local err = a -- a string, or a table { err = ... } from redis.call
    if type(err) == 'table' then err = err.err end
    failed[#failed + 1] = i
    failed[#failed + 1] = tostring(err)
  end
end
failed[1] = table.concat(out)
return failed
