-- Delete buried ids for good.
-- KEYS[1] = garbage ZSET
-- ARGV = id1, id2, ...
-- returns how many ids were in garbage
return redis.call('ZREM', KEYS[1], unpack(ARGV))
