-- Forget in-flight ids: their job is finished (or was found finished).
-- KEYS[1] = unack ZSET, KEYS[2] = counters HASH, KEYS[3] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were in flight
local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
-- pcall: a count field of another program's (no integer) must not fail the move above
if n > 0 then redis.pcall('HINCRBY', KEYS[2], 'acked', n) end
redis.call('HDEL', KEYS[3], unpack(ARGV))
return n
