-- Charges a global key's quota counter at the home with what a region
-- spent on its escrow while it could not reach the home.
--
-- KEYS[1]  the quota counter of the window
-- ARGV     tokens, expiry of the counter (unix ms)
--
-- Returns the counter after.
local used = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
redis.call('PEXPIREAT', KEYS[1], tonumber(ARGV[2]))
return used
