-- Forget in-flight ids: their job is finished (or was found finished).
-- KEYS[1] = unack ZSET, KEYS[2] = counters HASH, KEYS[3] = priority HASH
-- ARGV = id1, id2, ...
-- returns how many ids were in flight
local n = 0
for i = 1, #ARGV do
  -- the priority of those in flight only: one given that waits again keeps its own
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[i])
    n = n + 1
  end
end
-- pcall: a count field of another program's (no integer) must not fail the move above
if n > 0 then redis.pcall('HINCRBY', KEYS[2], 'acked', n) end
return n
