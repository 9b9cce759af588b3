-- Forget in-flight ids: their job is finished (or was found finished).
-- KEYS[1] = unack ZSET, KEYS[2] = counters HASH, KEYS[3] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were in flight
local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
-- pcall: a count whose field holds another program's value (no integer) is left out, as
-- fold_counters leaves it; a failed count would fail the call after its move was made.
if n > 0 then redis.pcall('HINCRBY', KEYS[2], 'acked', n) end
redis.call('HDEL', KEYS[3], unpack(ARGV))
return n
