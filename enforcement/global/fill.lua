-- The refiller's change to one pool (pool.lua is prepended): add tokens
-- leased from the global bucket, or take tokens out to return them.
--
-- KEYS[1]  the pool
-- KEYS[2]  the region's view of the global bucket
-- ARGV     mode ("add", "take" or "paid"), n (≥ 0), TTL ms, the home's
--          quota count after a lease or return (add; -1 = none), the
--          home's bucket tokens after it (add; -1 = none)
--
-- Returns { moved, tokens_after }: add moves n (0 records what the home
-- answered and moves nothing; a pool in debt pays it first); take moves
-- min(n, tokens), nothing in debt; paid (n: escrow spend now charged at
-- the home) moves min(n, owed).
local n = tonumber(ARGV[2])
local p = load_pool(KEYS[1])
local moved = 0
if ARGV[1] == 'add' then
  p.tokens = p.tokens + n
  moved = n
  if tonumber(ARGV[4]) >= 0 then
    p.qused = tonumber(ARGV[4])
  end
  local left = tonumber(ARGV[5])
  if left >= 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], struct.pack('<dd', left, tonumber(t[1]) * 1000000 + tonumber(t[2])), 'PX', tonumber(ARGV[3]))
  end
elseif ARGV[1] == 'take' then
  -- Nothing of a pool in debt (a settle may have taken it there since
  -- the refiller looked): the debt stays until a lease pays it.
  moved = math.max(0, math.min(n, math.floor(p.tokens + EPS)))
  if moved > 0 then
    p.tokens = math.max(0, p.tokens - moved)
  end
elseif ARGV[1] == 'paid' then
  moved = math.min(n, math.floor(p.owed + EPS))
  p.owed = math.max(0, p.owed - moved)
else
  error('fill.lua: unknown mode ' .. tostring(ARGV[1]))
end
save_pool(KEYS[1], p, tonumber(ARGV[3]))
return { moved, math.floor(p.tokens + EPS) }
