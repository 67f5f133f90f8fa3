-- Token leasing on the same bucket as decide.lua: the same stored state and
-- arithmetic (state.lua, prepended), so leased and unleased decisions spend
-- one bucket. leasecall.lua runs it once per call on Redis TIME.
--
-- bkey   the bucket
-- rate   tokens per second (> 0)
-- burst  the capacity
-- mode   "lease" or "return"
-- a      lease: the least the caller needs (its request's cost, ≥ 1);
--        return: tokens given back (≥ 0)
-- want   lease: the most the caller wants (the block, ≥ a)
-- now    the store's clock, µs
--
-- lease: grants min(want, whole tokens there) when at least `a` are there
-- (never more than are there), else grants 0 and says when `a` will be
-- there. return: adds the tokens back, capped at burst (tokens that would
-- overflow are the refill that happened while they were out).
--
-- Returns granted, tokens_left_floor, retry_ms, reset_ms, now_ms, clock_back.
local function lease(bkey, rate, burst, mode, a, want, now)
  local tokens, back, existed
  tokens, now, back, existed = refill(bkey, rate, burst, now)

  local granted = 0
  local retry_ms = 0
  if mode == 'lease' then
    local there = whole(tokens)
    if there >= a then
      granted = math.min(want, there)
      tokens = math.max(0, tokens - granted)
    else
      retry_ms = wait_ms(a - tokens, rate)
    end
  elseif mode == 'return' then
    tokens = math.min(burst, tokens + a)
  else
    error('lease.lua: unknown mode ' .. tostring(mode))
  end

  local reset_ms = save_bucket(bkey, tokens, now, rate, burst, existed)
  return granted, whole(tokens), retry_ms, reset_ms, math.floor(now / 1000), back
end
