-- A support audit record pushed on a key's list (keyslot.ResetLogKey),
-- newest first, keeping ARGV[2] records: a refused reset is recorded too.
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
return 1
