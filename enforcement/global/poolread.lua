-- Read-only: a region's pool of one global key and its view of the global
-- bucket, as they are stored (pool.lua), with the pool's time to live, for
-- inspect. Writes nothing.
-- KEYS: pool, view
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
