-- Delete buried ids for good.
-- KEYS[1] = garbage ZSET, KEYS[2] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were in garbage
local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
if n > 0 then redis.call('HDEL', KEYS[2], unpack(ARGV)) end
return n
